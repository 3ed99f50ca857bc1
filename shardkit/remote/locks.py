"""Local helpers of the cache: ``flock`` side files, eviction of a shard nobody holds."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from typing import Iterator

from ..errors import StoreError
from ..fileutil import unlink


def open_lock(path: str, how: int) -> int:
    """A descriptor of ``path`` (created if needed) holding ``flock(how)``; ``StoreError`` naming
    the path when the cache folder cannot hold it (removed, read-only, full)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise StoreError(f"cache file {path}: {exc.strerror} (check cache_dir: it must be a "
                         "writable folder with free space)") from None
    try:
        fcntl.flock(fd, how)
    except BaseException:
        os.close(fd)
        raise
    return fd


def try_lock(path: str, how: int, create: bool = False) -> int | None:
    """A descriptor of ``path`` holding ``flock(how)``, or None when another descriptor holds a
    conflicting lock (or the file is gone and not ``create``)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o666)
    except OSError:
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextmanager
def locked(path: str, how: int) -> Iterator[None]:
    fd = open_lock(path, how)
    try:
        yield
    finally:
        os.close(fd)


def evict_unused(path: str) -> bool:
    """Delete a cached shard unless some process holds it (its ``.use`` lock)."""
    head, name = os.path.split(path)
    fd = try_lock(os.path.join(head, f".{name}.use"), fcntl.LOCK_EX)
    if fd is None:
        return False
    try:
        unlink(path)
    finally:
        os.close(fd)
    return True


def scandir(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []
