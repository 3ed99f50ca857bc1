"""An ImageFolder layout under a URL prefix (``s3://bucket/train/<class>/<image>``, any fsspec
URL): listed, and its images read, so that it packs exactly as the same tree in a local folder.

Listing. The classes are the "folders" right under the prefix (one delimited listing), sorted;
each class's objects are found recursively (one listing per class, several classes at once),
paginated (S3 answers 1,000 keys a page: :mod:`shardkit.remote.listing`, each page one request
retried and, on ``s3://``, cut at ``access.transfer_deadline``). Objects are ordered as
torchvision's ``ImageFolder`` orders files: by folder (``sorted(os.walk(...))`` compares the
folder paths) and then by name, and kept by the same extensions; a key that no folder could hold
(an empty, ``.`` or ``..`` part, such as ``c0//a.jpg``) is listed as skipped. A class "folder"
without images is refused, or kept with ``allow_empty``, as locally. Credentials and endpoint
come from the environment (as for tars at a URL).

Reading (:func:`read_url`, :func:`read_ahead`). One GET per image, of at most the size an image
within ``--max-pixels`` can have; each attempt is cut at ``access.transfer_deadline`` (a trickle
of bytes never hangs a task) and retried with backoff while a retry can succeed, a refusal (403)
or a "not found" (404) of the object just listed included. A request that still fails raises
:class:`TransferFailed` naming the object and the cause: the pack fails (the Dask engine first
runs the shard again, ``retries``), never skipping the image; ``--resume`` continues it. Only
what the object holds is a skip: no image (the decoder's reason), over the size limit, or empty
(``empty file``, as a local one). A task reads :data:`READ_AHEAD` images ahead on threads, in
order, so its core decodes while the next images are on the wire; at most that many are held in
memory.
"""

from __future__ import annotations

import posixpath
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence, TypeVar

from ...errors import PackError, ShardkitError, StoreError
from ..discovery import IMG_EXTENSIONS, Discovery, has_image_extension
from .base import MemberError
from .url_objects import fetch, remote

#: Images a task has in flight ahead of the one it encodes (each a thread and an image's bytes).
READ_AHEAD = 8
LISTING_THREADS = 8  # classes listed at once
T = TypeVar("T")
R = TypeVar("R")


def list_root(src: str) -> tuple[str, Any, str, list[str], list[str]]:
    """SRC's root URL, its ``RemoteTarget``, the target's base path, and the folders and files
    right under it (both empty where the prefix holds nothing). PackError, one line, for a
    missing fsspec backend or bucket, or a listing that fails."""
    access = remote()
    from ...remote import listing

    root = src.rstrip("/")
    target = access.RemoteTarget(root)
    try:
        target.fs  # noqa: B018 - a missing fsspec backend is said here, once
    except ShardkitError as exc:
        raise PackError(str(exc)) from None
    base = target.path("").rstrip("/")
    try:
        folders, files = listing.list_folder(target, "")
    except access.ObjectNotFound as exc:
        if exc.code == "NoSuchBucket":
            raise PackError(f"cannot list the source folder {root}: {exc}") from None
        folders, files = [], []
    except StoreError as exc:
        raise PackError(f"cannot list the source folder {root}: {exc}") from None
    return root, target, base, folders, files


def relative_keys(keys: list[str], base: str, root: str, wanted: Callable[[str], bool]
                  ) -> tuple[list[str], list[dict[str, str]]]:
    """The listed ``keys`` under ``base`` that ``wanted`` takes, relative to it, and the skips
    of those no local folder could hold (an empty, ``.`` or ``..`` part)."""
    rels, skipped = [], []
    for key in keys:
        rel = key[len(base) + 1:] if key.startswith(base + "/") else None
        if rel is None or not wanted(rel):
            continue
        if posixpath.normpath(rel) != rel or "" in rel.split("/"):
            skipped.append({"path": f"{root}/{rel}", "reason": "a key no folder can hold "
                            "(an empty, '.' or '..' part); not packed"})
            continue
        rels.append(rel)
    return rels, skipped


def holdable(folders: list[str], root: str) -> tuple[list[str], list[dict[str, str]]]:
    """The ``folders`` listed under ``root`` that a local folder could be, and a skip for each
    other (an empty, ``.`` or ``..`` name: keys such as ``root//x.jpg``)."""
    odd = {"", ".", ".."}
    return [f for f in folders if f not in odd], [
        {"path": f"{root}/{f}/", "reason": "a folder no local folder can be (an empty, '.' or "
         "'..' name); its objects not packed"} for f in sorted(set(folders) & odd)]


def scan_url_folder(src: str, allow_empty: bool = False) -> Discovery:
    """List an ImageFolder layout under the URL ``src`` (see the module docstring)."""
    from ...remote import listing

    root, target, base, folders, files = list_root(src)
    if not folders and not files:
        raise PackError(f"source folder not found: {root}")
    folders, skipped = holdable(folders, root)
    classes = sorted(folders)
    if not classes:
        raise PackError(f"no class folders found in {root} (expected {root}/<class>/<image>)")

    def listed(name: str) -> list[str]:
        try:
            return listing.list_tree(target, name)
        except StoreError as exc:
            raise PackError(f"cannot list {root}/{name}: {exc}") from None

    with ThreadPoolExecutor(min(LISTING_THREADS, len(classes))) as pool:
        found = list(pool.map(listed, classes))
    samples: list[tuple[str, int]] = []
    empty = []
    for label, (name, keys) in enumerate(zip(classes, found)):
        rels, refused = relative_keys(keys, base, root, has_image_extension)
        skipped.extend(refused)
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


def read_url(url: str, limit: int | None) -> bytes:
    """The bytes of the object ``url`` (at most ``limit``); ``MemberError`` with the skip reason
    for an object no image can be (over ``limit``); :class:`TransferFailed` naming the object and
    the cause for a request refused or failed after its retries (never a skip). An empty object
    reads as no bytes (``empty file``, as a local one)."""
    data = fetch(url, 0, None if limit is None else limit + 1, 0)
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
