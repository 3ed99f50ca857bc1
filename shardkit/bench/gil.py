"""How much of the wall time other threads hold the GIL: two measurements that check each other.

**The probe** (:class:`GilProbe`): a thread that sleeps a short random time (0.1-0.5 ms), over and
over, and measures how late it wakes. ``time.sleep`` releases the GIL; when the OS wakes the
thread it must take the GIL back before ``time.perf_counter()`` can run. If no thread holds the
GIL that costs about nothing, so the probe is as late as the OS makes it (its timer slack is set
to 1 µs on Linux); if one does, the probe also waits until that thread lets go of it (a decoding
thread, at its next call into libjpeg-turbo or torch; a thread that never lets go, after
``sys.getswitchinterval()``, 5 ms). The probe wakes at times unrelated to the other threads'
work, so the share of wakes that find the GIL held is the share of time it is held (Poisson
arrivals see time averages). "Found held" means later than the OS alone makes it: later than
the calibration's 90th percentile and at least ``MARGIN_US`` beyond its median (:func:`calibrate`:
the probe in a process whose other threads keep the other CPUs busy in GIL-free code, the
condition it measures under, since a busy neighbour CPU alone shifts the OS's wake-up latency by
some µs on shared hardware), and the calibration's own share of such wakes is subtracted. A hold
much shorter than that margin delays a wake too little to count, so the probe's share is a lower
bound when holds are that short; ``wait_share`` (the probe's waiting beyond the OS's typical
latency, over the wall time) says how long a thread that needs the GIL waits for it.

**The CPU split** (:class:`CpuSplit`): a thread that runs Python holds the GIL, one inside a
call that releases it (simplejpeg's decode, torch's kernels, large numpy copies) does not, and
a thread waiting for the GIL or a lock uses no CPU. So per thread, CPU time minus the CPU time
spent inside the GIL-releasing calls (timed by wrappers put around them for the measurement:
``time.thread_time`` before and after) is the time it held the GIL; summed over threads and
divided by the wall time, the share of time the GIL is held. It counts any unwrapped GIL-free
work as holding it, so it is an upper bound where the probe is a lower one.

What the share means for a machine: a thread holding the GIL a share ``s`` of its own busy time
can be joined by at most about ``1 / s`` threads before the GIL, not the cores, is the limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

INTERVAL = (1e-4, 5e-4)  # seconds the probe sleeps, drawn uniformly (no phase lock with others)
#: µs beyond the calibration's median lateness below which a wake never counts as found held: the
#: OS's own lateness spreads by a few µs from run to run, a p90 a few µs above the median alone
#: read 25-60 % "held" in runs with no thread holding the GIL at all
MARGIN_US = 25.0


def _fine_timer_slack() -> None:
    """Linux rounds a sleeping thread's wake-up by its timer slack (50 µs by default): 1 µs here,
    for the calling thread only (``prctl(PR_SET_TIMERSLACK)``), so the probe's lateness is the
    GIL's, not the timer's. Elsewhere nothing changes."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)


@dataclass(frozen=True)
class Calibration:
    """The probe's lateness with nothing else running in the process, in µs: its median, and the
    90th percentile above which a wake counts as having waited for the GIL."""

    median_us: float
    threshold_us: float
    false_share: float = 0.1  # share of the calibration's own wakes above ``threshold_us``
    load_threads: int = 0  # GIL-free busy threads that ran beside the calibration


@dataclass(frozen=True)
class GilReading:
    """What a probe run saw: ``held_share`` (share of time another thread held the GIL, from the
    wakes that found it held, calibration's false share removed) and ``wait_share`` (time spent
    waiting for it beyond the calibration's median lateness, over the wall time)."""

    seconds: float
    wakes: int
    held_share: float
    wait_share: float
    median_late_us: float
    p90_late_us: float
    cpu_wait_share: float = 0.0  # the probe's time runnable without a CPU, over the wall time


class GilProbe:
    """A daemon thread sleeping ``interval`` (a (low, high) range in seconds) over and over,
    recording how late each sleep ends; ``stop()`` returns the :class:`GilReading`.

    ``wakes``: stop by itself after that many wakes (``wait_done()`` then returns); None: run
    until ``stop()``.
    """

    def __init__(self, calibration: Calibration | None = None,
                 interval: tuple[float, float] = INTERVAL, wakes: int | None = None,
                 seed: int = 0) -> None:
        self.calibration = calibration
        self.interval = interval
        self.limit = wakes
        self.seed = seed
        self._late: list[float] = []
        self._queued: list[float] = []  # of each wait, the time runnable but without a CPU
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._span = (0.0, 0.0)

    def start(self) -> GilProbe:
        self._thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        _fine_timer_slack()
        draw = random.Random(self.seed).uniform
        low, high = self.interval
        late, queued = self._late, self._queued
        clock, sleep, stop, runqueue = time.perf_counter, time.sleep, self._stop.is_set, _runqueue()
        start = clock()
        try:
            while not stop() and (self.limit is None or len(late) < self.limit):
                pause = draw(low, high)
                q0 = runqueue()
                t0 = clock()
                sleep(pause)
                t1 = clock()
                late.append(t1 - t0 - pause)
                queued.append(runqueue() - q0)
        finally:
            runqueue.close()
            self._span = (start, clock())
            self._done.set()

    @property
    def ident(self) -> int | None:
        """The probe thread's ``ident`` (None before ``start()``)."""
        return None if self._thread is None else self._thread.ident

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait for a probe started with ``wakes`` to finish them."""
        return self._done.wait(timeout)

    def stop(self) -> GilReading:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.reading()

    def lateness_us(self) -> list[float]:
        """How late each wake was, µs, less the time the OS kept the thread waiting for a CPU
        (where Linux says: ``/proc/thread-self/schedstat``): what the GIL and the timer cost."""
        return [(x - q) * 1e6 for x, q in zip(self._late, self._queued)]

    def reading(self) -> GilReading:
        late = self.lateness_us()
        seconds = self._span[1] - self._span[0]
        if not late:
            return GilReading(seconds, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
        cal = self.calibration or Calibration(0.0, 0.0, 0.0)
        found = sum(x > cal.threshold_us for x in late) / len(late)
        held = max(0.0, (found - cal.false_share) / (1.0 - cal.false_share))
        waited = sum(max(0.0, x - cal.median_us) for x in late) * 1e-6
        deciles = statistics.quantiles(late, n=10) if len(late) > 1 else late * 9
        share = (lambda v: v / seconds if seconds > 0 else 0.0)
        return GilReading(seconds, len(late), min(1.0, held), share(waited),
                          statistics.median(late), deciles[8], share(sum(self._queued)))

    def __enter__(self) -> GilProbe:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class _Runqueue:
    """This thread's time spent runnable but not running (seconds, a running total), from
    ``/proc/thread-self/schedstat`` (Linux with schedstats); 0.0 where it cannot be read."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            self()
        except (OSError, ValueError, IndexError):
            self.close()

    def __call__(self) -> float:
        if self.fd is None:
            return 0.0
        return int(os.pread(self.fd, 128, 0).split()[1]) * 1e-9

    def close(self) -> None:
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)
        self.fd = None


def _runqueue() -> _Runqueue:
    return _Runqueue()


def _gil_free_load(stop: threading.Event) -> None:
    """Keep a CPU busy without the GIL: hashlib releases it while hashing over 2 KiB."""
    block = bytes(1 << 20)
    while not stop.is_set():
        hashlib.sha256(block).digest()


def _other_cpus() -> int:
    try:
        return max(0, len(os.sched_getaffinity(0)) - 1)
    except AttributeError:  # not Linux
        return max(0, (os.cpu_count() or 1) - 1)


def calibrate(wakes: int = 400, interval: tuple[float, float] = INTERVAL,
              load_threads: int | None = None) -> Calibration:
    """The probe's lateness with no thread holding the GIL: its median, and the threshold beyond
    which a wake counts as found held (the 90th percentile, at least ``MARGIN_US`` beyond the
    median). Call it while no other thread of this process runs.

    ``load_threads``: threads kept busy in GIL-free code meanwhile (None: one per other CPU this
    process may run on), so the calibration sees the wake-up latency of a loaded machine, as the
    probe does while decoding threads run.
    """
    stop = threading.Event()
    count = _other_cpus() if load_threads is None else load_threads
    load = [threading.Thread(target=_gil_free_load, args=(stop,), name=f"gil-calibration-{i}",
                             daemon=True) for i in range(count)]
    for thread in load:
        thread.start()
    try:
        probe = GilProbe(None, interval, wakes).start()
        probe.wait_done()
        late = probe.lateness_us()
        probe.stop()
    finally:
        stop.set()
        for thread in load:
            thread.join()
    median = statistics.median(late)
    threshold = max(statistics.quantiles(late, n=10)[8], median + MARGIN_US)
    false = sum(x > threshold for x in late) / len(late)
    return Calibration(median, threshold, min(false, 0.5), count)


# -- the CPU split ---------------------------------------------------------------------------------

def thread_cpu(ident: int) -> float | None:
    """CPU seconds of thread ``ident`` (``threading.Thread.ident``) so far, or None where the OS
    does not say (``time.pthread_getcpuclockid``: Linux and some Unixes)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError, ValueError):
        return None


class CpuSplit:
    """Per-thread CPU time, split into time inside GIL-releasing calls and the rest (Python,
    holding the GIL), while in its ``with`` block.

    ``targets``: ``(owner, name)`` pairs, the GIL-releasing callables ``owner.name`` (a module
    attribute looked up at each call, e.g. ``(simplejpeg, "decode_jpeg")``) wrapped for the
    block to add their ``time.thread_time`` to their thread's account. Threads are sampled as
    they exist: those alive at the start and at ``stop()``, plus any that entered a wrapped call.
    """

    def __init__(self, targets: Sequence[tuple[Any, str]]) -> None:
        self.targets = [(owner, name) for owner, name in targets if hasattr(owner, name)]
        self._saved: list[tuple[Any, str, Any]] = []
        self._released: dict[int, float] = {}
        self._start_cpu: dict[int, float] = {}
        self._end_cpu: dict[int, float] = {}
        self._t0 = self._t1 = 0.0
        #: threads left out of the account (the probe: its wakes are the measurement's own)
        self.ignore: set[int] = set()

    def _wrap(self, fn: Callable) -> Callable:
        account, clock, ident = self._released, time.thread_time, threading.get_ident

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                me = ident()  # only this thread writes its entry: no lock needed
                account[me] = account.get(me, 0.0) + clock() - t0
        return timed

    def _sample(self, into: dict[int, float]) -> None:
        for thread in threading.enumerate():
            if thread.ident is None or thread.ident in self.ignore:
                continue
            cpu = thread_cpu(thread.ident)
            if cpu is not None:
                into[thread.ident] = cpu

    def start(self) -> CpuSplit:
        for owner, name in self.targets:
            fn = getattr(owner, name)
            self._saved.append((owner, name, fn))
            setattr(owner, name, self._wrap(fn))
        self._sample(self._start_cpu)
        self._t0 = time.perf_counter()
        return self

    def sample_threads(self) -> None:
        """Record the threads alive now (call it while a loader's threads run: they may be gone
        by ``stop()``)."""
        now: dict[int, float] = {}
        self._sample(now)
        for ident, cpu in now.items():
            self._start_cpu.setdefault(ident, 0.0)  # started inside the block
            self._end_cpu[ident] = cpu

    def stop(self) -> None:
        self._t1 = time.perf_counter()
        self._sample(self._end_cpu)
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        self._saved.clear()

    def __enter__(self) -> CpuSplit:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def seconds(self) -> float:
        return self._t1 - self._t0

    def cpu_seconds(self) -> float:
        """CPU of the sampled threads over the block."""
        return sum(end - self._start_cpu.get(ident, 0.0) for ident, end in self._end_cpu.items())

    def released_seconds(self) -> float:
        """CPU the threads spent inside the wrapped (GIL-releasing) calls."""
        return sum(v for ident, v in self._released.items() if ident not in self.ignore)

    def held_seconds(self) -> float:
        """CPU the threads spent outside them: holding the GIL (an upper bound)."""
        return max(0.0, self.cpu_seconds() - self.released_seconds())

    def held_share(self) -> float:
        """``held_seconds`` over the block's wall time."""
        return self.held_seconds() / self.seconds if self.seconds > 0 else 0.0


def decode_targets() -> list[tuple[Any, str]]:
    """The GIL-releasing calls of shardkit's read path, for :class:`CpuSplit` (leaves only: a
    wrapped call inside another would count twice): simplejpeg's decode, torch's resize kernel,
    ``numpy.copyto`` (the crop copies before a resize, the mirrored copy), and shardkit's crop
    copy and flip (a numpy or torch copy around a few lines of Python)."""
    import numpy
    import simplejpeg
    import torch

    from .. import codec
    from ..read import augment

    return [(simplejpeg, "decode_jpeg"), (torch._C._nn, "_upsample_bilinear2d_aa"),
            (numpy, "copyto"), (codec, "crop_into"), (augment, "mirror")]


@contextlib.contextmanager
def measured(calibration: Calibration | None = None,
             targets: Sequence[tuple[Any, str]] | None = None
             ) -> Iterator[tuple[GilProbe, CpuSplit]]:
    """Both measurements over a ``with`` block: ``(probe, split)``; read ``probe.reading()`` and
    ``split.held_share()`` after it."""
    split = CpuSplit(decode_targets() if targets is None else targets)
    probe = GilProbe(calibration)
    with split:
        probe.start()
        split.ignore.add(probe.ident)
        try:
            yield probe, split
        finally:
            probe.stop()
