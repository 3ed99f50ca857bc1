"""Listing a URL prefix with every request retried and, on ``s3://``, cut at a deadline.

On ``s3://`` each page of ``ListObjectsV2`` (up to 1,000 keys) is one request, retried as any
other call (:meth:`RemoteTarget.retry`) and cut at :func:`transfer_deadline` of
:data:`PAGE_BYTES`: a listing the server trickles fails with the deadline's error instead of
holding the pack without one. Other fsspec filesystems list through their own ``ls``/``find``,
each call retried (a listing of many pages is one call there, so it has no deadline).
"""

from __future__ import annotations

import posixpath
from typing import Any, Iterator

from .access import ObjectNotFound, RemoteTarget, is_s3

#: The most bytes one page of a listing may hold (1,000 keys of up to 1,024 bytes each, with
#: their sizes, dates and ETags): its deadline is ``transfer_deadline(PAGE_BYTES)``.
PAGE_BYTES = 2 << 20


def _pages(target: RemoteTarget, name: str, delimiter: str) -> Iterator[dict[str, Any]]:
    """The ``ListObjectsV2`` pages of the keys under ``name/`` (S3)."""
    fs = target.fs
    bucket, _, key = target.path(name).strip("/").partition("/")
    query = {"Bucket": bucket, "Prefix": f"{key}/" if key else "", "Delimiter": delimiter}
    while True:
        page = target.bounded(name, lambda timeout: fs.call_s3("list_objects_v2", **query,
                                                               **timeout), PAGE_BYTES)
        yield page
        if not page.get("IsTruncated") or not page.get("NextContinuationToken"):
            return
        query["ContinuationToken"] = page["NextContinuationToken"]


def list_folder(target: RemoteTarget, name: str) -> tuple[list[str], list[str]]:
    """(the names of the "folders" right under ``name``, the paths of its objects there), as
    ``target.fs`` names paths; both empty when nothing is under ``name``. A folder's name is
    the part of its keys up to the next ``/`` as it is: empty, ``.`` or ``..`` included."""
    fs, path = target.fs, target.path(name).rstrip("/")
    if not is_s3(target.url):
        try:
            entries = target.retry(name, lambda: fs.ls(path, detail=True))
        except ObjectNotFound as exc:
            if exc.code == "NoSuchBucket":
                raise
            return [], []
        return ([posixpath.basename(e["name"].rstrip("/")) for e in entries
                 if e.get("type") == "directory"],
                [e["name"] for e in entries if e.get("type") != "directory"])
    bucket, _, key = path.partition("/")
    under = f"{key}/" if key else ""
    folders, files = [], []
    for page in _pages(target, name, "/"):
        # The name between the listed prefix and the delimiter, as it is: "" for "a//b" keys.
        folders += [p["Prefix"][len(under):-1] for p in page.get("CommonPrefixes") or []]
        files += [f"{bucket}/{o['Key']}" for o in page.get("Contents") or []]
    return folders, files


def list_tree(target: RemoteTarget, name: str) -> list[str]:
    """The paths of every object under ``name`` (recursively), as ``target.fs`` names paths."""
    fs, path = target.fs, target.path(name).rstrip("/")
    if not is_s3(target.url):
        return target.retry(name, lambda: fs.find(path, detail=False))
    bucket = path.split("/", 1)[0]
    return [f"{bucket}/{o['Key']}" for page in _pages(target, name, "")
            for o in page.get("Contents") or [] if not o["Key"].endswith("/")]
