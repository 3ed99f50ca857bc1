"""Local helpers of the cache: ``flock`` side files, eviction of a shard nobody holds."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from typing import Iterator

from ..fileutil import unlink


def open_lock(path: str, how: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, how)
    except BaseException:
        os.close(fd)
        raise
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
    try:
        fd = open_lock(os.path.join(head, f".{name}.use"), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
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
