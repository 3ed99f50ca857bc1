"""Videos under a URL prefix (``s3://bucket/videos/``, any fsspec URL) as the video source reads
them: listed so that they pack exactly as the same tree in a local folder, and each fetched into
a local temporary file for PyAV (the decoder seeks, and a worker decodes from local bytes).

Listing (:func:`list_url_videos`) as :mod:`.url_folder` lists images: one delimited listing of
the prefix, then each class's objects recursively (several classes at once), every page retried
and cut at its deadline. The layout is the local one's: a prefix with video objects right under
it is flat (every video under it, no labels), else its "folders" are the classes. Objects are in
the order a local folder's walk gives (each level's names sorted, a folder's videos where its
name sorts), so keys, order and labels are the local folder's.

Fetching (:func:`local_copy`): the object is copied in ranged GETs of :data:`CHUNK` bytes, each
through :func:`.url_objects.fetch` (retried with backoff, a refusal included, and cut at the
transfer deadline), into an unnamed temporary file (removed by the system when it is closed, or
when the process ends however it ends): memory holds one chunk, the disk one video per video
being read. A request that still fails raises :class:`~.base.TransferFailed` naming the object,
never a skip. The scan fetches each video to list its frames and the process that decodes it
fetches it again (the scan lists every video before any is decoded, so keeping its copies would
hold the whole source on disk).
"""

from __future__ import annotations

import posixpath
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Callable, Iterator, Sequence

from ...errors import PackError, StoreError
from .base import TransferFailed
from .url_folder import holdable, list_root, read_ahead, relative_keys
from .url_objects import fetch

#: Bytes of one GET of a video (and the most a copy holds in memory at once).
CHUNK = 8 << 20
#: Videos the scan fetches and probes at once (threads; one temporary copy each).
SCAN_AHEAD = 4
LISTING_THREADS = 8


def local_copy(url: str) -> IO[bytes]:
    """The object ``url`` in an unnamed temporary file, at its start (see the module
    docstring); :class:`TransferFailed` naming the object for a GET that fails."""
    out = tempfile.TemporaryFile(prefix="shardkit-video-")
    try:
        pos = 0
        while True:
            data = fetch(url, pos, pos + CHUNK, CHUNK)
            out.write(data)
            pos += len(data)
            if len(data) < CHUNK:
                break
        out.seek(0)
        return out
    except BaseException:
        out.close()
        raise


def probe_all(urls: Sequence[str], probe: Callable[[Any], Any]) -> Iterator[Any]:
    """``probe`` of a local copy of each video, in order, :data:`SCAN_AHEAD` at once; a GET that
    fails is a PackError naming the object."""
    def one(url: str) -> Any:
        with local_copy(url) as f:
            return probe(f)

    try:
        yield from read_ahead(urls, one, SCAN_AHEAD)
    except TransferFailed as exc:
        raise PackError(str(exc)) from None


def list_url_videos(src: str, is_video: Callable[[str], bool]
                    ) -> tuple[str, list[str], list[tuple[str, int]], list[dict[str, str]]]:
    """SRC's root, classes, videos ``(url, label)`` in order and the keys skipped (see the
    module docstring); ``src`` naming one video object is that video alone."""
    from ...remote import listing

    root, target, base, folders, files = list_root(src)
    if not folders and not files:
        if is_video(root):  # one video object (fetching it says whether it exists)
            return posixpath.dirname(root), [], [(root, -1)], []
        raise PackError(f"source folder not found: {root}")
    def videos(name: str) -> tuple[list[str], list[dict[str, str]]]:
        try:
            keys = listing.list_tree(target, name)
        except StoreError as exc:
            raise PackError(f"cannot list {root}/{name}: {exc}") from None
        rels, skipped = relative_keys(keys, base, root, is_video)
        # A local folder's walk: each level's names sorted, a folder's files where it sorts.
        return [f"{root}/{rel}" for rel in sorted(rels, key=lambda r: r.split("/"))], skipped

    if any(is_video(posixpath.basename(f)) for f in files):
        urls, skipped = videos("")
        return root, [], [(u, -1) for u in urls], skipped
    folders, odd = holdable(folders, root)
    classes = sorted(folders)
    found = []
    if classes:
        with ThreadPoolExecutor(min(LISTING_THREADS, len(classes))) as pool:
            found = list(pool.map(videos, classes))
    out = [(u, label) for label, (urls, _) in enumerate(found) for u in urls]
    if not out:
        raise PackError(f"{src}: no video files in it or in its class folders")
    return root, classes, out, odd + [s for _, skips in found for s in skips]
