"""Watching a Dask pack's tasks: the slow-shard report (:class:`Stragglers`, from what each worker
runs: :func:`executing_tasks`), the wait for finished tasks (:func:`next_batch`) and the
dashboard's address (:func:`dashboard_link`)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any, Callable

from .grain import named

#: A shard running this many times the median shard time is named on stderr (once).
STRAGGLER_FACTOR = 4.0
STRAGGLER_MIN_DONE = 3  # shards finished before their median means anything
STRAGGLER_MIN_SECONDS = 10.0  # and never a shard running less than this (tiny shards' noise)
STRAGGLER_TIMES_KEPT = 1000  # the median is of the latest this many finished shards
POLL_SECONDS = 1.0  # how often, at most, the client asks what the workers run (stragglers)


def next_batch(ready: Any, seconds: float) -> list[Any]:
    """The futures of ``ready`` (an ``as_completed``) finished so far, after waiting up to
    ``seconds`` for one (the straggler report's wake-up). The check happens under the iterator's
    condition, which each finishing future notifies after queueing itself: no wake-up is lost."""
    condition = getattr(ready, "thread_condition", None)
    if condition is None:  # another distributed: poll its queue
        deadline = time.monotonic() + seconds
        while not ready.has_ready() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        with condition:
            if not ready.has_ready():
                condition.wait(timeout=seconds)
    return ready.next_batch(block=False)


def dashboard_link(client: Any) -> str | None:
    """The address of the scheduler's dashboard, None without one (its HTTP server runs without
    bokeh or with ``--no-dashboard`` too, answering 404 or a page asking for bokeh there: so
    the page is asked for)."""
    import urllib.request

    try:
        if "dashboard" not in (client.scheduler_info(n_workers=0).get("services") or {}):
            return None
        link = client.dashboard_link
        with urllib.request.urlopen(link, timeout=2) as page:
            # Without bokeh the scheduler answers 200 too, with a page that says it needs it.
            return link if page.status == 200 and b"needs bokeh" not in page.read(4096) \
                else None
    except Exception:  # noqa: BLE001 - only a convenience: no dashboard, or not reachable here
        return None


class Stragglers:
    """Names, once each, a task that runs over ``STRAGGLER_FACTOR`` times the median time of the
    latest ``STRAGGLER_TIMES_KEPT`` finished shards (after ``STRAGGLER_MIN_DONE`` of them; each
    measured by its task; the median taken at most once per ``POLL_SECONDS``) times its number
    of shards, and at least ``STRAGGLER_MIN_SECONDS``: its limit. A task's
    time is its worker's (from when it started running there; a task that moved to another
    worker, its first one lost, starts again).

    The workers are asked what they run (:func:`executing_tasks`) only while some task has been
    submitted for longer than its limit (it cannot have run longer than that), and then at
    most once per ``POLL_SECONDS``: each ask is a round trip through the scheduler to every
    worker, whose event loop takes the GIL from the task it runs and logs a line
    ("Run out-of-band function"). A pack whose tasks all take their usual time asks rarely if
    ever (a task queued behind a slow one can pass its limit before it runs)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.times: deque[float] = deque(maxlen=STRAGGLER_TIMES_KEPT)
        self.reported: set[str] = set()
        self.asked = -POLL_SECONDS
        self.median: tuple[float, float] | None = None  # (when taken, the median)

    def running(self, client: Any, tasks: dict[str, tuple[Any, list[int], float]]) -> None:
        """Look at the tasks in flight; ``tasks``: key -> (its future, its shards, when it was
        submitted, ``time.monotonic()``), in the order submitted (the first is the oldest)."""
        now = time.monotonic()
        if len(self.times) < STRAGGLER_MIN_DONE or now - self.asked < POLL_SECONDS or not tasks:
            return
        if self.median is None or now - self.median[0] >= POLL_SECONDS:
            self.median = (now, statistics.median(self.times))
        median = self.median[1]
        # Called at every turn of the client's loop: while even the oldest task is younger
        # than the least limit (one shard's), no task is looked at one by one.
        if now - next(iter(tasks.values()))[2] <= max(STRAGGLER_FACTOR * median,
                                                      STRAGGLER_MIN_SECONDS):
            return
        limits = {key: max(STRAGGLER_FACTOR * median * len(group), STRAGGLER_MIN_SECONDS)
                  for key, (_, group, _) in tasks.items() if key not in self.reported}
        if not any(now - tasks[key][2] > limit for key, limit in limits.items()):
            return
        self.asked = now
        try:
            executing = client.run(executing_tasks, on_error="ignore")
        except Exception:  # noqa: BLE001 - a report only
            return
        for worker, running in executing.items():
            if not isinstance(running, dict):  # that worker's error (on_error="ignore")
                continue
            for key, took in running.items():
                if key in limits and key not in self.reported and took > limits[key]:
                    self.reported.add(key)
                    group = tasks[key][1]
                    typical = f"{median:.1f}" if median >= 1 else f"{median:.2g}"  # not 0.0
                    many = "" if len(group) == 1 else f" times its {len(group)} shards"
                    self.say(f"shardkit: {named(group)} "
                             f"{'is' if len(group) == 1 else 'are'} slow: running {took:.0f} s "
                             f"on {worker}, over {STRAGGLER_FACTOR:g}x the median shard time "
                             f"({typical} s){many}")

    def finished(self, seconds: float) -> None:
        """A shard finished in ``seconds``."""
        self.times.append(seconds)


def executing_tasks(dask_worker: Any) -> dict[str, float]:
    """The tasks a worker is running now, finishing (seceded) ones included, not those queued
    on it: key -> seconds since it started running there (the worker's own clock)."""
    from distributed.metrics import time as now_on_worker  # the clock of ts.start_time

    state = dask_worker.state
    now = now_on_worker()
    return {str(ts.key): now - ts.start_time
            for ts in list(state.executing) + list(state.long_running) if ts.start_time}
