"""What the user sees of a pack in the terminal: Ctrl-C handling and the progress bar."""

from __future__ import annotations

import signal
import sys
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


class NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return NoProgress()
    from tqdm import tqdm

    class Bar(tqdm):
        # tqdm's monitor thread outlives the bar: the next pack in this process could not fork.
        # Per class, so the user's own bars keep theirs.
        monitor_interval = 0

    return Bar(total=total, unit="img", desc=desc, file=sys.stderr, dynamic_ncols=True,
               smoothing=0.1)

