"""Objects at URLs as sources read them (loose images, tars): each request retried and cut at its
deadline, and a request that still fails is :class:`TransferFailed`, never a skip.

Every GET goes through :meth:`shardkit.remote.access.RemoteTarget.bounded`: cut at
``access.transfer_deadline`` of its size (a trickle of bytes never hangs a task) and retried with
backoff while a retry can succeed, a refusal (403) or a "not found" (404) included, since the
object was listed or named a moment ago and such a fault may pass (credentials being renewed, a
replica behind). What the object holds is not a transfer's fault: a range past its end (an
empty object, a tar shorter than its scan) reads as no bytes, and the caller says what that
means (``empty file``, ``truncated member``), as for a local file.
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

from ...errors import PackError, StoreError
from .base import TransferFailed

_SPLIT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(/?[^/]*)/(.*)")
_targets: dict[tuple[int, str], Any] = {}


def remote() -> Any:
    """:mod:`shardkit.remote.access` (imported when a source is at a URL)."""
    try:
        from ...remote import access
    except ImportError as exc:  # pragma: no cover - shardkit.remote imports nothing optional
        raise PackError(f"sources at URLs need shardkit.remote: {exc}") from None
    return access


def url_target(url: str) -> tuple[Any, str]:
    """(this process's RemoteTarget for ``url``'s bucket, the object's name in it)."""
    match = _SPLIT.fullmatch(url)
    if match is None:
        raise PackError(f"{url}: not an object URL (scheme://bucket/key)")
    where, name = match.group(1) + match.group(2), match.group(3)
    key = (os.getpid(), where)
    target = _targets.get(key)
    if target is None:  # one filesystem (and connection pool) per bucket and process
        target = _targets[key] = remote().RemoteTarget(where)
    return target, name


def fetch(url: str, start: int, end: int | None, size: int) -> bytes:
    """Bytes ``[start, end)`` of the object ``url`` (``end`` None: to its end; fewer where the
    object ends sooner, none past its end); ``size``: the bytes expected, for the deadline.
    :class:`TransferFailed` naming the object and the cause for a request refused or failed
    after its retries."""
    from ...remote.failures import classify

    target, name = url_target(url)
    fs, path = target.fs, target.path(name)
    span = {"start": start, "end": end} if end is not None or start else {}

    def get(timeout: dict[str, float]) -> bytes:
        try:
            return fs.cat_file(path, **span, **timeout)
        except Exception as exc:
            # A range is unsatisfiable (416) only where it starts past the object's end: what
            # the object holds, not a failed transfer.
            if span and classify(exc).code == "InvalidRange":
                return b""
            raise

    try:
        return target.bounded(name, get, size, refusals=True)
    except StoreError as exc:
        raise TransferFailed(str(exc)) from None


def object_size(url: str) -> int:
    """The size of the object ``url`` (one HEAD, retried as :func:`fetch`)."""
    target, name = url_target(url)
    fs, path = target.fs, target.path(name)
    try:
        return int(target.retry(name, lambda: fs.size(path), refusals=True) or 0)
    except StoreError as exc:
        raise TransferFailed(str(exc)) from None


class RangeFile(io.RawIOBase):
    """A seekable read-only file over the object ``url`` of ``size`` bytes: each read one ranged
    :func:`fetch` (wrap it in ``io.BufferedReader`` for few, large requests)."""

    def __init__(self, url: str, size: int) -> None:
        super().__init__()
        self.url, self.size, self.pos = url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self.size - self.pos)
        if want <= 0:
            return 0
        data = fetch(self.url, self.pos, self.pos + want, want)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)
