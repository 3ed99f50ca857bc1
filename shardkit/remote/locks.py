"""Local helpers of the cache: ``flock`` side files, eviction of a shard nobody holds.

An ``flock`` belongs to the open file, and a forked child gets a copy of every descriptor: a lock
some thread held at the fork (a read-ahead download's) would stay held for the child's whole life,
however the parent closes its copy, and the next download of that shard would wait on a
persistent DataLoader worker forever. So every lock descriptor is registered here (opened and
closed only through these helpers), and a forked child closes its copies at once.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from contextlib import contextmanager
from typing import Iterator, overload

from ..errors import StoreError
from ..fileutil import unlink


_FDS: set[int] = set()  # this process's lock descriptors
_FDS_LOCK = threading.RLock()  # across each open/close (a fork never splits one); re-entrant:
# a finalizer that closes a lock may run inside an open on the same thread


def _open(path: str, flags: int) -> int:
    with _FDS_LOCK:  # never through a symbolic link planted at a side file's name
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
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


@overload
def open_lock(path: str, how: int, wait: None = None, new: bool = False) -> int: ...
@overload
def open_lock(path: str, how: int, wait: float, new: bool = False) -> int | None: ...


def open_lock(path: str, how: int, wait: float | None = None, new: bool = False) -> int | None:
    """A descriptor of ``path`` (created if needed; ``new``: created now, never an existing
    file) holding ``flock(how)``; ``StoreError`` naming the path when the cache folder cannot
    hold it (removed, read-only, full) or it is a symbolic link. ``wait``: give up (None) after
    that many seconds without the lock."""
    try:
        fd = _open(path, os.O_RDWR | os.O_CREAT | (os.O_EXCL if new else 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"cache file {path} is a symbolic link, which shardkit did not "
                             "write: refused (remove it)") from None
        raise StoreError(f"cache file {path}: {exc.strerror} (check cache_dir: it must be a "
                         "writable folder with free space)") from None
    try:
        if wait is None:
            fcntl.flock(fd, how)
            return fd
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
    except BaseException:
        close(fd)
        raise
    return _wait_lock(fd, how, wait)


def _wait_lock(fd: int, how: int, wait: float) -> int | None:
    """``fd`` once it holds ``flock(how)``, or None (``fd`` closed) after ``wait`` seconds. The
    wait is a blocking ``flock`` in a helper thread (the kernel queues it: no polling); a thread
    that gets the lock after its waiter gave up closes it at once."""
    done = threading.Event()
    guard = threading.Lock()
    state: dict[str, object] = {"abandoned": False, "error": None}

    def take() -> None:
        try:
            fcntl.flock(fd, how)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            state["error"] = exc
        with guard:
            if state["abandoned"]:
                close(fd)
            done.set()

    threading.Thread(target=take, daemon=True, name="shardkit-lock-wait").start()
    done.wait(wait)
    with guard:
        if not done.is_set():
            state["abandoned"] = True
            return None
    if state["error"] is not None:
        close(fd)
        raise state["error"]  # type: ignore[misc]
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


# -- side files that are not locks: never through a planted symbolic link --------------------

def touch_side(path: str) -> None:
    """Create the empty side file ``path`` if it is missing (never through a symbolic link; an
    existing file is left as it is, never written)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))


def write_side(path: str, data: bytes) -> None:
    """Replace the side file ``path`` by ``data``: written to a new file (``O_EXCL``, never
    through a symbolic link or into another file) renamed over it."""
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise


def read_side(path: str, limit: int = 1 << 16) -> bytes | None:
    """The bytes of side file ``path``, None when it is missing, not a regular file, a symbolic
    link or larger than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def remove_side(path: str) -> None:
    """Delete side file ``path`` if it is a regular file (a symbolic link or anything else
    planted at its name was not written by shardkit: left alone)."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            unlink(path)
    except OSError:
        pass
