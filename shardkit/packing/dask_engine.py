"""The Dask engine: shards packed by tasks on a Dask cluster (``--engine dask``).

A task packs one shard, or several consecutive ones when shards are short (:mod:`.grain`: tasks
of about a second). It runs :func:`shardkit.packing.local.pack_shard` on a worker for each,
writing each shard file straight into the pack's partial folder, which must be on a filesystem
every worker shares. The client collects each shard's manifest entry as its task finishes and
hands it to ``on_shard_done`` (which records it for ``--resume``); the caller then merges the
manifest. For a URL OUT each task uploads its
own shard and deletes the local file, but the staging folder (under ``SHARDKIT_CACHE_DIR``) still
holds the plan that tasks read and the merged labels that tasks write: with a scheduler on other
machines it must be on a filesystem the workers share, at the same path. Without a
scheduler address a ``LocalCluster`` of worker processes on 127.0.0.1 is started for the
duration of the pack.

Dask is an optional extra (``pip install 'dask[distributed]'``); nothing here is imported by the
default engine.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import statistics
import sys
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable, Iterator, TypeVar

from ..errors import PackError
from .allocator import image_blocks
from ..progress import progress as progress_bar
from .faults import inject as inject_fault, inject_task as inject_task_fault
from .grain import MOST_SHARDS, Grain, named
from .local import ShardDone, pack_shard
from .plan import Plan, PlanRef

#: Times a shard whose task raised is submitted again (``pack(retries=...)``, ``--retries``).
DEFAULT_RETRIES = 3
#: A shard running this many times the median shard time is named on stderr (once).
STRAGGLER_FACTOR = 4.0
STRAGGLER_MIN_DONE = 3  # shards finished before their median means anything
STRAGGLER_MIN_SECONDS = 10.0  # and never a shard running less than this (tiny shards' noise)
STRAGGLER_TIMES_KEPT = 1000  # the median is of the latest this many finished shards
POLL_SECONDS = 1.0  # how often, at most, the client asks what the workers run (stragglers)
CONNECT_SECONDS = 60  # how long a scheduler address is tried before the pack stops
CONNECT_NOTICE_SECONDS = 5.0  # connecting this long is said on stderr
#: Dask settings for packing workers (docs/cluster.md recommends them as environment variables,
#: ``DASK_`` + the key in capitals, ``.`` -> ``__``, ``-`` -> ``_``; shardkit's own
#: LocalCluster starts with them). Each is a periodic wake-up of every worker's event loop that
#: takes the GIL from the task thread: the statistical profiler samples the task thread 100
#: times a second, the event-loop health check runs 50 times a second in every Dask process
#: (Dask's own test suite runs it every 500 ms), the system monitor (dashboard plots) twice a
#: second. An idle 2-worker cluster took 5.3-6.4 % of two cores as Dask starts it, 4.1-4.8 %
#: with the profiler off, 1.4 % with all three (docs/cluster.md has the packing numbers).
QUIET_WORKERS = {"distributed.worker.profile.enabled": False,
                 "distributed.admin.tick.interval": "1s",
                 "distributed.admin.system-monitor.interval": "2s"}
T = TypeVar("T")


@contextlib.contextmanager
def _ctrl_c_here_only() -> Iterator[None]:
    """SIGINT blocked in this thread meanwhile: the cluster's threads started here inherit the
    mask, and so do the worker processes they start, through exec, for good. A terminal's Ctrl-C,
    sent to the whole process group, then reaches the pack's own process alone, which stops the
    pack in one line and closes the cluster (each worker printed its KeyboardInterrupt's
    traceback); one pressed meanwhile is raised as it ends."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # started later, it would unblock SIGINT in its caller
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _import_dask() -> Any:
    try:
        import dask.distributed as dd
    except ImportError:
        raise PackError("`engine='dask'` needs Dask's distributed scheduler: "
                        "pip install 'dask[distributed]'") from None
    return dd


class DaskSession:
    """A client on the cluster for the whole pack: listing tasks (:meth:`lister`), shard tasks
    (:func:`run_dask`) and merge tasks share it. Without a scheduler address, a ``LocalCluster``
    of ``workers`` single-threaded processes on 127.0.0.1, closed with the session."""

    def __init__(self, scheduler: str | None = None, workers: int = 1) -> None:
        dd = _import_dask()
        self.cluster = None
        if scheduler is None:
            import dask

            # Our own scheduler and workers start with the packing settings; set for the
            # cluster's start only: the nannies pass them to the worker processes, and the
            # user's own config is left as it was.
            # No dashboard, and the scheduler's HTTP server (health checks only then) on a free
            # port of 127.0.0.1: by default it takes 8787, warning when another cluster has it.
            try:
                with dask.config.set(QUIET_WORKERS), _ctrl_c_here_only():
                    self.cluster = dd.LocalCluster(
                        n_workers=max(1, workers), threads_per_worker=1, processes=True,
                        host="127.0.0.1", dashboard_address="127.0.0.1:0",
                        scheduler_kwargs={"dashboard": False},
                        silence_logs=logging.CRITICAL)  # our own lines
            except Exception as exc:  # noqa: BLE001 - named in one line
                raise PackError(_no_local_cluster(exc)) from None
            self.client = dd.Client(self.cluster)
        else:
            # Said once connecting outlasts a moment (Dask retries for the whole timeout).
            notice = threading.Timer(CONNECT_NOTICE_SECONDS, lambda: print(
                f"shardkit: connecting to the Dask scheduler at {scheduler} (up to "
                f"{CONNECT_SECONDS:g} s)", file=sys.stderr, flush=True))
            notice.daemon = True
            notice.start()
            try:
                self.client = dd.Client(scheduler, timeout=f"{CONNECT_SECONDS}s")
            except OSError as exc:
                raise PackError(f"cannot reach the Dask scheduler at {scheduler}: {exc}"
                                ) from None
            finally:
                notice.cancel()
            try:
                idle = not self.client.scheduler_info(n_workers=-1)["workers"]
            except Exception:  # noqa: BLE001 - only the notice: the pack's tasks report failures
                idle = False
            if idle:  # else the pack would wait in silence (a worker command not yet run)
                print(f"shardkit: the Dask scheduler at {scheduler} has no workers yet; "
                      "waiting for one to join", file=sys.stderr, flush=True)

    def lister(self, fn: Callable[..., T], args: list[tuple[Any, ...]]) -> list[T]:
        """``[fn(*a) for a in args]``, one task each on the cluster (listing, merging): small
        arguments and results only."""
        if not args:
            return []
        futures = [self.client.submit(fn, *a, pure=False) for a in args]
        try:
            # Waited for here, gathered once done: Ctrl-C during client.gather's own wait left
            # its per-future waiters failing with AllExit, printed as asyncio tracebacks.
            for _ in _import_dask().as_completed(futures, loop=self.client.loop):
                pass
            return self.client.gather(futures)
        finally:
            self.client.cancel(futures)

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> "DaskSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _no_local_cluster(exc: BaseException) -> str:
    """The line for a LocalCluster that did not start; the likely cause when the program is a
    script: Dask starts each worker process with multiprocessing's spawn, which runs the script
    again, and an unguarded ``pack`` call in it starts processes during that bootstrap."""
    from ..remote.failures import describe

    line = f"could not start Dask's local worker processes ({describe(exc)})"
    if getattr(sys.modules.get("__main__"), "__file__", None):
        line += ("; a script that calls pack(engine='dask') without `scheduler` must call it "
                 "under `if __name__ == \"__main__\":` (each Dask worker process starts by "
                 "running the script again)")
    return line


def run_dask(plan: Plan, shards: list[int], dest: dict[int, str], *, scheduler: str | None = None,
             workers: int = 1, progress: bool = True, on_shard_done: ShardDone,
             strict: bool = False, on_start: Callable[[], None] = lambda: None,
             upload: Any = None, retries: int = DEFAULT_RETRIES,
             session: DaskSession | None = None) -> None:
    """Pack ``shards`` of ``plan`` on a Dask cluster: a task per shard, or per group of
    consecutive short shards once their times are known (:mod:`.grain`).

    Args:
        plan: the pack plan (its folder holds the sources: :mod:`.plan_store`, on a filesystem
            every worker shares); a task receives the folder and its shard number, O(1) in
            sources, and reads its own shard's slice (typed fields, when there are some, are
            sent to each worker once).
        shards: shard numbers to pack.
        dest: shard number -> absolute path of its file (on the shared filesystem).
        scheduler: address of a running Dask scheduler (``tcp://host:8786``); ``None`` starts a
            ``LocalCluster`` of ``workers`` single-threaded processes on 127.0.0.1.
        workers: worker processes of the local cluster (ignored with ``scheduler``).
        progress: show a progress bar (shards and images done, images/s, ETA) and the Dask
            dashboard's address when the scheduler has one.
        on_shard_done: called in this process with ``(k, entry)`` as each shard finishes, in
            completion order.
        strict: fail on the first unusable image instead of skipping it.
        on_start: called once the first tasks are submitted.
        upload: a :class:`shardkit.remote.Uploader` for a URL OUT: each task uploads its shard.
        retries: how many times a shard whose task raised is submitted again (a PackError, a
            fault of the data such as ``strict``'s, is not retried).
        session: the pack's :class:`DaskSession` (else one is opened for this call, from
            ``scheduler`` and ``workers``).

    For a URL OUT a task hands its worker thread on once its records are encoded
    (:func:`_hand_over`): the worker starts its next shard while this one is uploaded.

    A worker that dies (SIGKILL, a preempted node) costs its tasks' time only: Dask runs them
    again elsewhere, up to ``distributed.scheduler.allowed-failures`` lost workers per task
    (then ``KilledWorker``). A shard that raises is submitted again, alone, ``retries`` times
    (the shards its task finished before it are recorded; those after it go back in line);
    each attempt rewrites its shard file from the start, and only a finished attempt's entry is
    recorded (``on_shard_done``), so a failed attempt's partial file is never installed.
    After that the pack stops with one line naming the shard and the cause (a PackError); the
    remaining tasks are cancelled and finished shards stay recorded for ``--resume``. A task
    running over :data:`STRAGGLER_FACTOR` times the median shard time (times its shards) is
    named on stderr once.
    """
    if not shards:
        on_start()
        return
    dd = _import_dask()
    owned = session is None
    session = session or DaskSession(scheduler, workers)
    client = session.client
    sizes = {k: plan.bounds[k + 1] - plan.bounds[k] for k in shards}
    bar = progress_bar(sum(sizes.values()), progress, "pack (dask)")

    def say(line: str) -> None:  # above the bar, if there is one
        if hasattr(bar, "write"):
            bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    # key -> (future, its shards, when submitted), in flight
    tasks: dict[str, tuple[Any, list[int], float]] = {}
    try:
        link = _dashboard(client)
        if progress and link:
            say(f"shardkit: Dask dashboard at {link}")
        # A plan travels as its folder (O(1) in sources), opened in the task; typed fields
        # (COCO annotations, a metadata table) travel with it: then one copy per worker
        # instead of one per task.
        plan_future = plan.ref() if plan.fields is None else \
            client.scatter([plan.ref()], broadcast=True, hash=False)[0]
        # Each worker imports the packing code and opens the plan now, as the local engine
        # does before its encoders start, not inside its first shard's time.
        _first_tasks(client, _warm_up, plan_future, shards[0])
        token = uuid.uuid4().hex[:12]
        attempts: dict[int, int] = {}
        pending = deque(shards)
        # An upload's task hands its thread on while the network sends (_hand_over): one
        # shard a task, or the rest of a group would run on a thread the worker lent out.
        grain = Grain(sizes, most=1 if upload is not None else MOST_SHARDS)
        threads = _threads(client)
        submitted = 0

        def submit(group: list[int]) -> None:
            nonlocal submitted
            for k in group:
                attempts[k] = attempts.get(k, 0) + 1
            submitted += 1
            key = f"shardkit-shard-{group[0]:05d}-{group[-1]:05d}-{token}-{submitted}"
            future = client.submit(_attempt, group, pack_shard, plan_future,
                                   {k: dest[k] for k in group}, strict=strict, upload=upload,
                                   encoded=None if upload is None else _hand_over, pure=False,
                                   key=key)
            tasks[future.key] = (future, group, time.monotonic())
            ready.add(future)

        def put_back(group: list[int]) -> None:  # shards of a task that never ran them
            for k in reversed(group):
                attempts[k] -= 1
                pending.appendleft(k)

        # Two tasks a worker thread (one running, one queued on the scheduler), so that a
        # thread never waits for this client between tasks; three with an upload (one more
        # sending while its thread packs the next); more would only fix the grain before the
        # shards' times are known.
        per_thread = 2 if upload is None else 3

        def top_up() -> None:
            while pending and len(tasks) < per_thread * threads + 1:
                submit(grain.take(pending, threads))

        # One as_completed for the whole pack, on the pack's own client's loop (not the
        # process's default client: a user's, or a test's); later tasks are added to it.
        # Not dd.wait(pending, timeout=...) once a second: each call left a waiter on every
        # pending future (O(run time x shards) on the client, 32 MiB at 200,000 sources).
        ready = dd.as_completed(loop=client.loop)
        top_up()
        on_start()
        watch = Stragglers(say)
        finished = 0
        bar.set_postfix_str(f"shards 0/{len(shards)}")
        asked = time.monotonic()
        while not ready.is_empty():
            done = _next_batch(ready, POLL_SECONDS)
            watch.running(client, tasks)
            for future in done:
                group = tasks.pop(future.key)[1]
                if future.status == "error":  # the task itself failed, not one of its shards
                    exc = future.exception()
                    future.release()
                    if isinstance(exc, dd.KilledWorker):
                        raise PackError(
                            f"the Dask worker packing {named(group)} died (more often than "
                            "Dask's distributed.scheduler.allowed-failures); finished shards "
                            "are kept: rerun with `resume=True` to continue") from None
                    if len(group) > 1:
                        # Which shard failed is not known: each runs again alone, this attempt
                        # not counted (alone, each counts its own).
                        from ..remote.failures import describe

                        say(f"shardkit: the task packing {named(group)} failed "
                            f"({describe(exc)}); running them again one shard a task")
                        for k in group:
                            attempts[k] -= 1  # submit counts it again
                            submit([k])
                        continue
                    say(_failed(exc, group[0], attempts[group[0]], retries))
                    submit(group)
                    continue
                if future.status != "finished":  # cancelled: the scheduler dropped the tasks
                    raise PackError("the Dask scheduler cancelled the pack's tasks (lost "
                                    "connection?); finished shards are kept: rerun with "
                                    "`resume=True` to continue")
                results, failure = future.result()
                # Forgotten at once: a result held by a worker that dies later would otherwise
                # be computed again, rewriting a shard already recorded as finished.
                future.release()
                for k, entry, seconds in results:
                    grain.finished(k, seconds)
                    watch.finished(seconds)
                    on_shard_done(k, entry)
                    finished += 1
                    bar.set_postfix_str(f"shards {finished}/{len(shards)}", refresh=False)
                    bar.update(sizes[k])
                if failure is not None:
                    k, exc = failure
                    rest = group[group.index(k) + 1:]
                    put_back(rest)
                    say(_failed(exc, k, attempts[k], retries))
                    submit([k])  # alone: its retries and messages are its own
            if time.monotonic() - asked >= POLL_SECONDS:  # workers come and go
                threads, asked = _threads(client), time.monotonic()
            top_up()
    finally:
        bar.close()
        if tasks:
            client.cancel([future for future, *_ in tasks.values()])
        if owned:
            session.close()


def _threads(client: Any) -> int:
    """The cluster's worker threads now (1 while it has none)."""
    try:
        return max(1, sum(client.nthreads().values()))
    except Exception:  # noqa: BLE001 - only the window's size; tasks report real failures
        return 1


def _warm_up(ref: PlanRef, k: int) -> None:
    """Import what a shard task needs (a worker's first task would, inside its time): the
    encoders and store writers, Pillow's plugins, and for a pack that resizes the resize kernel
    (torch: ~1.5 s and ~180 MiB a worker; the local engine imports it before its encoders start
    too), so a pack that resizes nothing never imports it; and read shard ``k``'s rows (the plan
    files opened and checked). A failure here is the first task's to report."""
    try:
        from PIL import Image

        from . import local  # noqa: F401
        from . import resize

        Image.preinit()  # the standard formats' plugins (else on the first open)
        plan = ref.open()
        if plan.settings.size > 0 or plan.settings.buckets is not None:
            resize.prepare()
        plan.rows(k)
    except Exception:  # noqa: BLE001 - only an early import
        pass


def _first_tasks(client: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` as a task on each worker (another if that one is busy), waiting up to a
    minute: a task, not ``client.run``, so that a fresh scheduler's and worker's first pass over
    their task code paths (0.2-0.4 s on 127.0.0.1) happens here, in startup, as the local
    engine's encoders are forked in its startup."""
    dd = _import_dask()
    try:
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
        futures = [client.submit(fn, *args, workers=[w], allow_other_workers=True, pure=False)
                   for w in workers]
        dd.wait(futures, timeout=60)
        client.cancel(futures)
    except Exception:  # noqa: BLE001 - only a warm-up: the pack's own tasks report failures
        pass


def _next_batch(ready: Any, seconds: float) -> list[Any]:
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


def _attempt(group: list[int], task: Callable[..., Any], ref: PlanRef, dest: dict[int, str],
             **kwargs: Any) -> tuple[list[tuple[int, Any, float]], tuple[int, Any] | None]:
    """One attempt at a task's shards on a worker, in order: ``task(plan, k, dest[k], **kwargs)``
    for each (after any fault a test asked for: :mod:`.faults`), the plan opened from ``ref``
    here (a damaged plan's error is the first shard's). Large blocks come from the heap while a
    shard runs, as in a plain process (:mod:`.allocator`: Dask's nanny pins glibc's thresholds).

    Returns the finished shards, ``(k, entry, seconds)``, and the first failure, ``(k, cause)``,
    or None; no shard after a failure is tried, nor after the client cancelled the task. The
    cause is the PackError itself (a fault of the data or the options: the pack stops) or any
    other exception's one-line text: returned, not raised, so that the shards this task
    finished before it are recorded.
    """
    inject_task_fault(group)  # a failure of the task, not of one of its shards (a test's)
    done = []
    for k in group:
        if done and _cancelled():  # the pack stopped: no more shard files written for it
            break
        start = time.perf_counter()
        try:
            inject_fault(k)
            with image_blocks():
                entry = task(ref.open(), k, dest[k], stop=_cancelled, **kwargs)
        except PackError as exc:
            return done, (k, exc.with_traceback(None))
        except Exception as exc:  # noqa: BLE001 - the client retries the shard
            from ..remote.failures import describe

            return done, (k, describe(exc))
        finally:
            _handed_back()
        done.append((k, entry, time.perf_counter() - start))
    return done, None


def _cancelled() -> bool:
    """Whether the client cancelled the Dask task this thread runs (the pack stopped: Ctrl-C,
    a failed shard). Dask cannot stop a running task, so a task asks before each next shard
    and a shard before each batch of up to 64 records (``pack_shard``'s ``stop``): else it
    would go on writing shard files, holding the worker from the next pack's tasks, while a
    ``--resume`` started meanwhile writes the same files."""
    try:
        from distributed import get_worker

        worker = get_worker()
        state = worker.state.tasks.get(worker.get_current_task())
    except Exception:  # noqa: BLE001 - not on a Dask worker (or another distributed)
        return False
    return state is None or state.state in ("cancelled", "released", "forgotten")


_finishing = 0  # this worker's tasks that have handed their thread slot on (:func:`_hand_over`)
_finishing_lock = threading.Lock()
_local = threading.local()


def _hand_over() -> None:
    """Called by a shard task that uploads its shard, once its records are encoded: what is
    left (the fsync, the checksum, the upload) mostly waits on the network, for seconds, so the
    task secedes from the worker's thread pool and the worker starts its next shard meanwhile.
    At most one finishing task per worker thread, so a slow network holds the tasks back
    instead of piling up files in staging. Not for a shard written in place: its finish waits
    a few ms on the fsync, and handing over measured no faster (200,000 small images) or 3-4 %
    slower (6,000 photos in 30 shards) on a 2-core machine."""
    global _finishing
    from distributed import get_worker, secede

    try:
        threads = get_worker().state.nthreads
    except ValueError:  # not on a Dask worker
        return
    with _finishing_lock:
        if _finishing >= threads:
            return
        _finishing += 1
    _local.seceded = True
    secede()


def _handed_back() -> None:
    global _finishing
    if getattr(_local, "seceded", False):
        _local.seceded = False
        with _finishing_lock:
            _finishing -= 1


def _failed(cause: Any, k: int, attempt: int, retries: int) -> str:
    """The line that says shard ``k``'s attempt failed (``cause``: an exception, or its text)
    and is retried; raises the pack's one-line PackError when it is not retried (a PackError
    of the task, no retry left)."""
    if isinstance(cause, PackError):  # a fault of the data (strict) or of the options
        raise cause.with_traceback(None) from None
    if isinstance(cause, BaseException):
        from ..remote.failures import describe

        cause = describe(cause)
    if attempt > retries:
        tries = f"{attempt} attempt{'s' if attempt != 1 else ''}"
        raise PackError(f"shard {k} failed after {tries} (`retries` is {retries}); last: "
                        f"{cause}; finished shards are kept: rerun with `resume=True` to "
                        "continue") from None
    return f"shardkit: shard {k} failed ({cause}); running it again ({attempt} of {retries})"


def _dashboard(client: Any) -> str | None:
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
