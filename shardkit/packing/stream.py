"""The packing process's side of the encoding workers: :class:`WorkerStream` starts them, hands
out chunks of sources (:func:`chunk_bounds`) and yields ``(Encoded, crc32)`` in source order.

Not ``multiprocessing.Pool``: its worker-handler thread also waits on the result pipe and spins
while a big result message is read, and a worker killed mid-task makes it wait forever.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from ..errors import PackError
from . import resize
from . import workers as encoders
from .console import sigint_deferred
from .settings import PackSettings
from .workers import Encoded, launch, start_method


def chunk_bounds(n: int, workers: int, largest: int) -> list[int]:
    """Guided scheduling: chunks of up to ``largest`` sources (few result messages: each has a
    fixed cost in the writing process, whatever its size), shrinking to one at the end (so no
    worker idles long while another finishes a big chunk). The first chunks grow from one
    source (1, 2, 4...): the writer has its first record once one image is encoded, not a
    whole chunk."""
    bounds = [0]
    while bounds[-1] < n:
        left = n - bounds[-1]
        ramp = 1 << min(len(bounds) - 1, 30)
        bounds.append(bounds[-1] + max(1, min(largest, left // (4 * workers), ramp)))
    return bounds


def file_bounds(paths: list[Any], bounds: list[int], largest: int) -> list[int]:
    """Chunk boundaries among video frames (container items of format ``video``) moved to the
    nearest start of a video where the chunk stays within ``largest``: one worker then decodes
    a video's frames in one pass, instead of several each seeking into it. Other sources:
    ``bounds`` unchanged."""
    from bisect import bisect_left

    n = len(paths)
    if not n or getattr(paths[0], "format", None) != "video":
        return bounds
    starts = [0] + [i for i in range(1, n) if paths[i].file != paths[i - 1].file] + [n]
    out = [0]
    for b in bounds[1:-1]:
        j = bisect_left(starts, b)
        near = sorted((starts[k] for k in (j - 1, j) if 0 <= k < len(starts)),
                      key=lambda s: abs(s - b))
        b = next((s for s in near if out[-1] < s <= out[-1] + largest), b)
        if b > out[-1]:
            out.append(b)
    return out + [n] if out[-1] < n else out


def largest_chunk(settings: PackSettings) -> int:
    """Sources per result message, for messages of about 16 MB at most."""
    if settings.size <= 0:
        return 4  # original sizes: a record can be any size
    record = settings.size * settings.size * 2 * (3 if settings.encoding == "raw" else 1)
    return max(1, min(128, (16 << 20) // record))


def _reap(proc: Any, timeout: float) -> int | None:
    """Wait up to ``timeout`` s for a worker to end; its exit code (-N: killed by signal N)."""
    import subprocess

    if isinstance(proc, subprocess.Popen):
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
    proc.join(timeout)
    return proc.exitcode


def _death(code: int | None) -> str:
    """How a worker ended, from its exit code, for a skip reason."""
    if code is not None and code < 0:
        try:
            return f"killed by signal {-code}: {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}" if code is not None else "lost"


@dataclass(eq=False)
class _Worker:
    proc: Any
    conn: Any
    held: list[tuple[int, int, int]] = field(default_factory=list)  # tasks sent, oldest first
    ready: bool = False


START_FAILURES = 3  # workers dying before they are ready, before the pack gives up


class WorkerStream:
    """(record, crc32) in source order from a set of encoding processes, started at construction
    (before any output file is opened, so forked workers inherit no store handle).

    Not ``multiprocessing.Pool``: its worker-handler thread also waits on the result pipe and
    spins for as long as a result message is being read (big messages: most of the time), and a
    worker killed mid-task makes it wait forever. Here the packing thread reads each worker's pipe
    itself. A task is ``(chunk, first, count)``: sources ``first:first+count`` of a chunk. A worker
    works on its tasks in order, so one that dies (the OOM killer, a crashing decoder, ``kill
    -9``) died on its oldest: that chunk is run again one source per task, its other tasks are
    handed out again, and a fresh interpreter replaces it. A worker that dies on a one-source task
    names the source that killed it, which is skipped with the reason.
    """

    def __init__(self, paths: list[str], settings: PackSettings, workers: int) -> None:
        from collections import deque

        largest = largest_chunk(settings)
        bounds = file_bounds(paths, chunk_bounds(len(paths), workers, largest), largest)
        self._settings = settings
        self._chunks = [paths[a:b] for a, b in zip(bounds, bounds[1:])]
        self._tasks = deque((k, 0, len(chunk)) for k, chunk in enumerate(self._chunks))
        self._workers: list[_Worker] = []
        self._done: dict[int, list[tuple[Encoded, int]]] = {}
        self._parts: dict[int, list[Any]] = {}  # chunks run one source per task: results so far
        self._start_failures = 0
        self._want = 0         # next chunk to yield
        self._current: list[tuple[Encoded, int]] = []
        self._pos = 0
        self._left = len(paths)
        try:
            self._start(workers, start_method())
            # Up when the first worker is ready (the others join as they come): the packer's
            # start-up time ends here.
            while self._workers and not any(w.ready for w in self._workers):
                self._receive(block=True)
        except BaseException:
            self._kill()
            raise

    def _start(self, n: int, method: str) -> None:
        """Start ``n`` workers and give them work; a Ctrl-C meanwhile is raised once they are up.

        Ctrl-C must not cut a start in half, so SIGINT is deferred (workers started meanwhile
        inherit that and ignore SIGINT once up)."""
        with sigint_deferred() as resume_sigint:
            if method == "fork":
                resize.prepare()  # imported once here, inherited by every worker
            for _ in range(n):
                self._workers.append(_Worker(*launch(method, self._settings)))
        resume_sigint()
        self._fill()

    def _fill(self) -> None:
        """Give each worker up to two tasks: one to work on, one queued behind it."""
        for w in list(self._workers):
            while len(w.held) < 2 and self._tasks:
                k, first, count = task = self._tasks[0]
                try:
                    w.conn.send((task, self._chunks[k][first:first + count]))
                except OSError:  # it died while idle
                    self._replace(w)
                    return  # _replace fills again
                w.held.append(self._tasks.popleft())

    def _receive(self, block: bool) -> None:
        """Take in every message that is ready (waiting for one if ``block``)."""
        from multiprocessing.connection import wait

        busy = {w.conn: w for w in self._workers if w.held}
        for conn in wait(list(busy), None if block else 0):
            w = busy[conn]
            if w not in self._workers:  # replaced meanwhile (found dead while given work)
                continue
            try:
                kind, key, payload = conn.recv()
            except (EOFError, OSError):
                self._replace(w)
                continue
            if kind == "ready":
                w.ready = True
                continue
            if kind == "unreadable":
                from .sources import TransferFailed

                raise TransferFailed(payload)
            if kind != "ok":
                raise PackError(f"an encoding worker failed: {payload}; no output written")
            w.held.remove(key)
            self._store(key, payload)
            self._fill()

    def _store(self, task: tuple[int, int, int], results: list[tuple[Encoded, int]]) -> None:
        k, first, count = task
        if count == len(self._chunks[k]):
            self._done[k] = results
            return
        part = self._parts[k]
        part[first:first + count] = results
        if all(r is not None for r in part):
            self._done[k] = self._parts.pop(k)

    def _replace(self, w: _Worker) -> None:
        """``w`` died: settle the task it died on, hand its others out again, start a new one."""
        code = _reap(w.proc, 30)  # its pipe is closed: it is exiting
        if code is None:
            w.proc.kill()
            code = _reap(w.proc, 30)
        w.conn.close()
        self._workers.remove(w)
        held, w.held = w.held, []
        if not w.ready:  # never started: its tasks were not run
            self._start_failures += 1
            if self._start_failures >= START_FAILURES:
                raise PackError(f"{self._start_failures} encoding workers died as they started "
                                f"(the last {_death(code)}); no output written")
            self._tasks.extendleft(reversed(held))
        elif held:
            (k, first, count), rest = held[0], held[1:]
            self._tasks.extendleft(reversed(rest))
            if count == 1:
                reason = f"the decoder crashed (encoding worker {_death(code)})"
                self._store(held[0], [(Encoded.rejected(reason), 0)])
            else:  # one source per task, to learn which one it was
                self._parts.setdefault(k, [None] * len(self._chunks[k]))
                self._tasks.extendleft((k, i, 1) for i in reversed(range(first, first + count)))
        # Never forked now: this process has the output open and maybe other threads running.
        self._start(1, "spawn")

    def __iter__(self) -> "WorkerStream":
        return self

    def __next__(self) -> tuple[Encoded, int]:
        if self._pos == len(self._current):
            if self._want == len(self._chunks):
                raise StopIteration
            self._receive(block=False)  # take what is ready: a worker may be waiting to send
            while self._want not in self._done:
                self._receive(block=True)
            self._current, self._pos = self._done.pop(self._want), 0
            self._want += 1
        item = self._current[self._pos]
        self._pos += 1
        self._left -= 1
        return item

    def close(self) -> None:
        """Stop the workers: let them exit when every result is in, kill them otherwise."""
        if self._left == 0:
            for w in self._workers:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
            for w in self._workers:
                _reap(w.proc, 5)
        self._kill()

    def _kill(self) -> None:
        for w in self._workers:
            if _reap(w.proc, 0) is None:
                w.proc.kill()
        for w in self._workers:
            _reap(w.proc, 5)
            w.conn.close()
        self._workers = []


def encoded_stream(paths: list[str], settings: PackSettings, workers: int):
    """(record, crc32) in source order, from this process (workers <= 1) or worker processes;
    has close()."""
    if workers <= 1 or len(paths) < 2:
        with sigint_deferred() as resume_sigint:
            resize.prepare()
        resume_sigint()
        return ((r, None) for r in encoders.encode_many(paths, settings))
    return WorkerStream(paths, settings, workers)
