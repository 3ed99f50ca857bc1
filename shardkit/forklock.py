"""A module-level lock that a forked child gets fresh.

A thread of the parent may hold a lock at the moment of ``fork()``; the child has only the forking
thread, so that lock would stay held forever there. ``ForkLock`` replaces its inner lock in every
forked child (``os.register_at_fork``), so DataLoader workers forked while loader threads run
start with it free.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

_LOCKS: "weakref.WeakSet[ForkLock]" = weakref.WeakSet()


class ForkLock:
    """``threading.Lock`` (``reentrant``: ``RLock``) used as ``with lock:``, made again after fork."""

    def __init__(self, reentrant: bool = False) -> None:
        self._make: Callable[[], Any] = threading.RLock if reentrant else threading.Lock
        self._lock = self._make()
        _LOCKS.add(self)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)


def _renew_all() -> None:
    for lock in list(_LOCKS):
        lock._lock = lock._make()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_all)
