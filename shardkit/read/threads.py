"""The ``threads=N`` fan-out of ``ShardDataset``: one batch's records decoded by N threads, the
calling thread being one of them. Several threads may run batches at once (the thread engine,
:mod:`shardkit.read.loading.thread_engine`): they share the helper threads."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Sequence

from ..errors import OptionError


class Fanout:
    """Runs ``fn(*job)`` for every job on up to ``threads`` threads; picklable (the helper threads
    are per process, started on first use)."""

    def __init__(self, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise OptionError(f"threads must be an integer >= 0, got {threads!r}")
        self.threads = threads
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._lock = threading.Lock()  # one pool, however many threads start it together

    def _executor(self) -> ThreadPoolExecutor:
        """``threads - 1`` helper threads (the calling thread decodes a share too)."""
        pid = os.getpid()
        pool = self._pool
        if pool is not None and pool[0] == pid:
            return pool[1]
        with self._lock:
            if self._pool is None or self._pool[0] != pid:
                self._pool = (pid, ThreadPoolExecutor(max(1, self.threads - 1),
                                                      thread_name_prefix="shardkit"))
            return self._pool[1]

    def run(self, fn: Callable, jobs: Sequence[tuple]) -> list:
        """``fn(*job)`` for every job, results in order. Each thread takes the next job until
        none is left (images differ in cost: a fixed split would leave one thread waiting)."""
        parts = min(self.threads, len(jobs))
        if parts <= 1:
            return [fn(*job) for job in jobs]
        results: list = [None] * len(jobs)
        queue = iter(range(len(jobs)))
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    i = next(queue, None)
                if i is None:
                    return
                results[i] = fn(*jobs[i])

        futures = [self._executor().submit(work) for _ in range(parts - 1)]
        try:
            work()
        finally:
            # Records are only valid inside the caller's read transaction: wait for every thread
            # before returning, even when this thread's share failed.
            wait(futures)
        for future in futures:
            future.result()  # a helper's error
        return results

    def close(self) -> None:
        """Stop this process's helper threads (started again if used again)."""
        if self._pool is not None and self._pool[0] == os.getpid():
            self._pool[1].shutdown(wait=False)
        self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "_lock"} | {
            "_pool": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
