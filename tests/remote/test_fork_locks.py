"""A process forked while this process holds a cache lock (a read-ahead download's, the eviction
lock) must not keep that lock: ``flock`` locks belong to the open file, which a fork shares.

Real forks and real ``flock`` locks on files in the test's folder; synchronised over pipes.
"""

from __future__ import annotations

import fcntl
import os
import threading

from shardkit.remote import locks


def _fork_idle_child() -> tuple[int, int]:
    """A child that lives on (as a persistent DataLoader worker does) until its pipe closes;
    returned once it runs (its fork hooks have run)."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.write(ready_w, b"x")
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    return pid, w


def test_a_child_forked_while_a_lock_is_held_does_not_keep_it(tmp_path):
    path = str(tmp_path / ".shard-00000.lmdb.dl")
    fd = locks.open_lock(path, fcntl.LOCK_EX)
    pid, w = _fork_idle_child()
    try:
        locks.close(fd)  # the download is done: the shard's lock is free again...
        other = locks.try_lock(path, fcntl.LOCK_EX)
        assert other is not None  # ...not held on by the child's copy of the descriptor
        locks.close(other)
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def test_a_fork_during_a_thread_s_eviction_lock(tmp_path):
    """A thread holds the eviction lock while the main thread forks (a DataLoader starting its
    workers during a read-ahead): once the thread lets go, the lock is free for everyone."""
    path = str(tmp_path / ".evict.lock")
    inside, leave = threading.Event(), threading.Event()

    def evict() -> None:
        with locks.locked(path, fcntl.LOCK_EX):
            inside.set()
            leave.wait(60)

    thread = threading.Thread(target=evict)
    thread.start()
    assert inside.wait(60)
    pid, w = _fork_idle_child()
    try:
        leave.set()
        thread.join(60)
        other = locks.try_lock(path, fcntl.LOCK_EX)
        assert other is not None
        locks.close(other)
    finally:
        os.close(w)
        os.waitpid(pid, 0)
