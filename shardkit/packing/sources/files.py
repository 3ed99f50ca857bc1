"""Source files as an encoding worker reads them: kept open between samples (a worker reads
many members of the same shard), opened afresh in each process (a forked worker never shares
a parent's file offset or decompressor), read at an offset.

A URL is read through fsspec, one range request per member (uncompressed tars only).
Compressed tars (gzip, bzip2, xz) are read through the standard library's decompressing file
objects: reading forward continues where the last member ended, so a worker that reads its
members in order decompresses the file about once.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from collections import OrderedDict
from typing import Any, Callable

from ...urls import is_url
from .url_objects import fetch

OPEN_FILES = 8  # per worker: the shards it is reading now, and a few before
_MAGIC: tuple[tuple[bytes, Callable[[str], Any]], ...] = (
    (b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))


class _Plain:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def pread(self, offset: int, size: int) -> bytes:
        parts, got = [], 0
        while got < size:  # pread may return less than asked (huge reads, signals)
            chunk = os.pread(self.fd, size - got, offset + got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        os.close(self.fd)


class _Decompressed:
    def __init__(self, path: str, opener: Callable[[str], Any]) -> None:
        self.file = opener(path)

    def pread(self, offset: int, size: int) -> bytes:
        self.file.seek(offset)
        return self.file.read(size)

    def close(self) -> None:
        self.file.close()


class _Remote:
    """A URL (``s3://...``, any fsspec protocol; credentials and endpoint from the environment),
    read one range request per member (:func:`.url_objects.fetch`: retried, cut at its
    deadline; a request that still fails raises ``TransferFailed``, never a skip)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def pread(self, offset: int, size: int) -> bytes:
        if size <= 0:
            return b""
        return fetch(self.url, offset, offset + size, size)

    def close(self) -> None:
        pass


_open: "OrderedDict[str, Any]" = OrderedDict()
_pid = os.getpid()


def open_cached(path: str) -> Any:
    """An open reader of ``path`` with ``pread(offset, size)``; the last few stay open."""
    global _pid
    if _pid != os.getpid():  # a forked child: the inherited handles are the parent's
        _open.clear()
        _pid = os.getpid()
    f = _open.get(path)
    if f is not None:
        _open.move_to_end(path)
        return f
    if is_url(path):
        f = _Remote(path)
    else:
        with open(path, "rb") as probe:
            head = probe.read(6)
        f = next((_Decompressed(path, opener) for magic, opener in _MAGIC
                  if head.startswith(magic)), None) or _Plain(path)
    _open[path] = f
    while len(_open) > OPEN_FILES:
        _open.popitem(last=False)[1].close()
    return f


def close_all() -> None:
    """Close every cached file of this process (after the plan's size estimate, say)."""
    while _open:
        _open.popitem()[1].close()
