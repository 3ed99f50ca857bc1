"""Background threads that interpreter exit does not wait for: the read-ahead's downloads.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, so a
read-ahead download stalled on the network kept a finished or interrupted (Ctrl-C) program alive
until the download's transfer deadline, minutes. The read-ahead needs nothing from its tasks but
that they run, a few at a time, and that a caller can wait for them (:meth:`Background.shutdown`);
a download cut by the exit leaves a ``.part`` file that nobody holds, which the cache deletes.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable


class Background:
    """Runs submitted calls on up to ``threads`` daemon threads, started as calls wait."""

    def __init__(self, threads: int, name: str) -> None:
        self.limit = max(1, int(threads))
        self.name = name
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # one count per thread waiting for a task
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a thread of the pool (its result is dropped; it handles its
        own errors)."""
        with self._lock:
            self._tasks.put((fn, args))
            if self._idle.acquire(blocking=False) or len(self._threads) >= self.limit:
                return
            thread = threading.Thread(target=self._work, daemon=True,
                                      name=f"{self.name}_{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            fn, args = task
            task = None
            try:
                fn(*args)
            finally:
                fn = args = None
                self._idle.release()

    def shutdown(self, wait: bool = True) -> None:
        """Let the threads end once the calls submitted so far are done (``wait``: join them)."""
        with self._lock:
            threads = list(self._threads)
            for _ in threads:
                self._tasks.put(None)
        if wait:
            for thread in threads:
                thread.join()
