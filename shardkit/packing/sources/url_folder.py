"""An ImageFolder layout under a URL prefix (``s3://bucket/train/<class>/<image>``, any fsspec
URL): listed, and its images read, so that it packs exactly as the same tree in a local folder.

Listing. The classes are the "folders" right under the prefix (one delimited listing), sorted;
each class's objects are found recursively (one listing per class, several classes at once),
paginated by fsspec (S3 answers 1,000 keys a page; s3fs follows the continuation tokens and
retries each page). Objects are ordered as torchvision's ``ImageFolder`` orders files: by
folder (``sorted(os.walk(...))`` compares the folder paths) and then by name, and kept by the
same extensions; a key that no folder could hold (an empty, ``.`` or ``..`` part, such as
``c0//a.jpg``) is listed as skipped. A class "folder" without images is refused, or kept with
``allow_empty``, as locally. Credentials and endpoint come from the environment (as for tars at
a URL); every listing call is retried by :meth:`shardkit.remote.access.RemoteTarget.retry`.

Reading (:func:`read_url`, :func:`read_ahead`). One GET per image, of at most the size an image
within ``--max-pixels`` can have; each attempt is cut at ``access.transfer_deadline`` (a trickle
of bytes never hangs a task) and retried with backoff while a retry can succeed. A permanent
fault (the object gone since the listing, access refused) skips the image with the reason, as
an unreadable local file is skipped; a transient fault that outlasts the retries raises
:class:`shardkit.remote.access.RetriesExhausted`, failing the task, which the Dask engine runs
again (``retries``). A task reads :data:`READ_AHEAD` images ahead on threads, in order, so its
core decodes while the next images are on the wire; at most that many are held in memory.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ...errors import PackError, ShardkitError, StoreError
from ..discovery import IMG_EXTENSIONS, Discovery, has_image_extension
from .base import MemberError

#: Images a task has in flight ahead of the one it encodes (each a thread and an image's bytes).
READ_AHEAD = 8
LISTING_THREADS = 8  # classes listed at once
_SPLIT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(/?[^/]*)/(.*)")
T = TypeVar("T")
R = TypeVar("R")


def _remote() -> Any:
    try:
        from ...remote import access
    except ImportError as exc:  # pragma: no cover - shardkit.remote imports nothing optional
        raise PackError(f"sources at URLs need shardkit.remote: {exc}") from None
    return access


def scan_url_folder(src: str, allow_empty: bool = False) -> Discovery:
    """List an ImageFolder layout under the URL ``src`` (see the module docstring)."""
    access = _remote()
    root = src.rstrip("/")
    target = access.RemoteTarget(root)
    try:
        fs = target.fs
    except ShardkitError as exc:
        raise PackError(str(exc)) from None
    base = target.path("").rstrip("/")
    try:
        entries = target.retry("", lambda: fs.ls(base, detail=True))
    except access.ObjectNotFound:
        raise PackError(f"source folder not found: {root}") from None
    except StoreError as exc:
        raise PackError(f"cannot list the source folder {root}: {exc}") from None
    classes = sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries
                     if e.get("type") == "directory")
    if not classes:
        raise PackError(f"no class folders found in {root} (expected {root}/<class>/<image>)")

    def listed(name: str) -> list[str]:
        try:
            return target.retry(name, lambda: fs.find(f"{base}/{name}", detail=False))
        except StoreError as exc:
            raise PackError(f"cannot list {root}/{name}: {exc}") from None

    with ThreadPoolExecutor(min(LISTING_THREADS, len(classes))) as pool:
        found = list(pool.map(listed, classes))
    samples: list[tuple[str, int]] = []
    skipped: list[dict[str, str]] = []
    empty = []
    for label, (name, keys) in enumerate(zip(classes, found)):
        rels = []
        for key in keys:
            rel = key[len(base) + 1:] if key.startswith(base + "/") else None
            if rel is None or not has_image_extension(rel):
                continue
            if posixpath.normpath(rel) != rel or "" in rel.split("/"):
                skipped.append({"path": f"{root}/{rel}", "reason": "a key no folder can hold "
                                "(an empty, '.' or '..' part); not packed"})
                continue
            rels.append(rel)
        # ImageFolder's order: sorted(os.walk(class folder)) then sorted names per folder.
        rels.sort(key=lambda r: (posixpath.dirname(r), posixpath.basename(r)))
        samples.extend((f"{root}/{rel}", label) for rel in rels)
        if not rels:
            empty.append(name)
    if empty and not allow_empty:
        raise PackError(
            f"found no image files for the classes {', '.join(sorted(empty))} "
            f"(supported extensions: {', '.join(IMG_EXTENSIONS)}); "
            "pass `allow_empty=True` to keep them as classes with no images")
    return Discovery(root, classes, {c: i for i, c in enumerate(classes)}, samples, skipped)


_targets: dict[tuple[int, str], Any] = {}


def _target(url: str) -> tuple[Any, str]:
    """(this process's RemoteTarget for ``url``'s bucket, the object's name in it)."""
    match = _SPLIT.fullmatch(url)
    if match is None:
        raise PackError(f"{url}: not an object URL (scheme://bucket/key)")
    where, name = match.group(1) + match.group(2), match.group(3)
    key = (os.getpid(), where)
    target = _targets.get(key)
    if target is None:  # one filesystem (and connection pool) per bucket and process
        target = _targets[key] = _remote().RemoteTarget(where)
    return target, name


def read_url(url: str, limit: int | None) -> bytes:
    """The bytes of the object ``url`` (at most ``limit``); ``MemberError`` with the skip reason
    for a permanent fault; ``RetriesExhausted`` for a transient one that outlasted the retries."""
    access = _remote()
    target, name = _target(url)
    fs, path = target.fs, target.path(name)
    span = {} if limit is None else {"start": 0, "end": limit + 1}
    try:
        data = target.bounded(name, lambda timeout: fs.cat_file(path, **span, **timeout), 0)
    except access.RetriesExhausted:
        raise
    except StoreError as exc:
        text = str(exc)
        prefix = target.where(name) + ": "
        raise MemberError("cannot read file: "
                          f"{text[len(prefix):] if text.startswith(prefix) else text}") from None
    if limit is not None and len(data) > limit:
        raise MemberError(f"file of more than {limit} bytes is larger than any image within "
                         "--max-pixels can be")
    return data


def read_ahead(items: Sequence[T], read: Callable[[T], R], depth: int = READ_AHEAD
               ) -> Iterator[R]:
    """``read(item)`` of each item, in order, with up to ``depth`` reads running ahead on
    threads; an exception is raised where its item comes. Reads not yet used are cancelled when
    the iterator is closed."""
    if depth <= 1 or len(items) <= 1:
        yield from map(read, items)
        return
    pool = ThreadPoolExecutor(min(depth, len(items)), thread_name_prefix="shardkit-read-ahead")
    try:
        pending = iter(items)
        window = deque(pool.submit(read, item) for _, item in zip(range(depth), pending))
        while window:
            future = window.popleft()
            nxt = next(pending, _END)
            if nxt is not _END:
                window.append(pool.submit(read, nxt))
            yield future.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


_END: Any = object()
