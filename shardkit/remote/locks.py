"""Local helpers of the cache: ``flock`` side files, eviction of a shard nobody holds.

An ``flock`` belongs to the open file, and a forked child gets a copy of every descriptor: a lock
some thread held at the fork (a read-ahead download's) would stay held for the child's whole life,
however the parent closes its copy, and the next download of that shard would wait on a
persistent DataLoader worker forever. So every lock descriptor is registered here (opened and
closed only through these helpers), and a forked child closes its copies at once.
"""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from typing import Iterator

from ..errors import StoreError
from ..fileutil import unlink


_FDS: set[int] = set()  # this process's lock descriptors
_FDS_LOCK = threading.RLock()  # across each open/close (a fork never splits one); re-entrant:
# a finalizer that closes a lock may run inside an open on the same thread


def _open(path: str, flags: int) -> int:
    with _FDS_LOCK:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o666)
        _FDS.add(fd)
    return fd


def close(fd: int) -> None:
    """Close a descriptor from :func:`open_lock` / :func:`try_lock` (its lock goes with it)."""
    with _FDS_LOCK:
        _FDS.discard(fd)
        os.close(fd)


def _before_fork() -> None:
    _FDS_LOCK.acquire()


def _after_fork_in_parent() -> None:
    _FDS_LOCK.release()


def _after_fork_in_child() -> None:
    global _FDS_LOCK
    for fd in _FDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _FDS.clear()
    _FDS_LOCK = threading.RLock()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


def open_lock(path: str, how: int) -> int:
    """A descriptor of ``path`` (created if needed) holding ``flock(how)``; ``StoreError`` naming
    the path when the cache folder cannot hold it (removed, read-only, full)."""
    try:
        fd = _open(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise StoreError(f"cache file {path}: {exc.strerror} (check cache_dir: it must be a "
                         "writable folder with free space)") from None
    try:
        fcntl.flock(fd, how)
    except BaseException:
        close(fd)
        raise
    return fd


def try_lock(path: str, how: int, create: bool = False) -> int | None:
    """A descriptor of ``path`` holding ``flock(how)``, or None when another descriptor holds a
    conflicting lock (or the file is gone and not ``create``)."""
    try:
        fd = _open(path, os.O_RDWR | (os.O_CREAT if create else 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError:
        close(fd)
        return None
    return fd


@contextmanager
def locked(path: str, how: int) -> Iterator[None]:
    fd = open_lock(path, how)
    try:
        yield
    finally:
        close(fd)


def evict_unused(path: str) -> bool:
    """Delete a cached shard unless some process holds it (its ``.use`` lock)."""
    head, name = os.path.split(path)
    fd = try_lock(os.path.join(head, f".{name}.use"), fcntl.LOCK_EX)
    if fd is None:
        return False
    try:
        unlink(path)
    finally:
        close(fd)
    return True


def scandir(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []
