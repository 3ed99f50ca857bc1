"""What the user sees of a pack in the terminal: Ctrl-C handling (the progress bar is
:mod:`shardkit.progress`)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def sigint_deferred() -> Iterator[Callable[[], None]]:
    """Run a step that Ctrl-C must not cut in half, without losing the Ctrl-C.

    Two such steps: starting worker processes (one interrupted while importing prints a
    traceback and leaves workers half made) and importing torch (a KeyboardInterrupt inside its
    C++ code aborts the whole process). So SIGINT is blocked in this thread meanwhile (processes
    started now inherit that and ignore SIGINT once up) and a Ctrl-C is only recorded. The
    returned function restores both and raises the recorded KeyboardInterrupt: call it where the
    workers are cleaned up.
    """
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    try:  # started now, so that starting it later does not unblock SIGINT (it blocks/unblocks)
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    except (ImportError, OSError):
        pass
    got: list[int] = []
    old_handler = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    old_mask = mask(signal.SIG_BLOCK, {signal.SIGINT})
    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:
            restored = True
            signal.signal(signal.SIGINT, old_handler)
            mask(signal.SIG_SETMASK, old_mask)  # a pending Ctrl-C is raised here
            if got:
                raise KeyboardInterrupt

    try:
        yield restore
    except BaseException:
        restore()
        raise
