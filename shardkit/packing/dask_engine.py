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

import sys
import time
import uuid
from collections import deque
from typing import Any, Callable

import numpy as np

from ..errors import PackError
from ..progress import progress as progress_bar
from . import dask_watch
from .dask_session import QUIET_WORKERS, DaskSession, import_dask
from .dask_tasks import attempt_shards, first_tasks, hand_over, warm_up
from .dask_watch import Stragglers, dashboard_link, executing_tasks, next_batch
from .grain import MOST_SHARDS, Grain, ShardSizes, named
from .local import ShardDone, pack_shard
from .plan import PackPlan

__all__ = ["DEFAULT_RETRIES", "QUIET_WORKERS", "DaskSession", "Stragglers", "executing_tasks",
           "run_dask"]

#: Times a shard whose task raised is submitted again (``pack(retries=...)``, ``--retries``).
DEFAULT_RETRIES = 3


def run_dask(plan: PackPlan, shards: list[int], dest: dict[int, str], *, scheduler: str | None = None,
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
    (:func:`.dask_tasks.hand_over`): the worker starts its next shard while this one is uploaded.

    A worker that dies (SIGKILL, a preempted node) costs its tasks' time only: Dask runs them
    again elsewhere, up to ``distributed.scheduler.allowed-failures`` lost workers per task
    (then ``KilledWorker``). A shard that raises is submitted again, alone, ``retries`` times
    (the shards its task finished before it are recorded; those after it go back in line);
    each attempt rewrites its shard file from the start, and only a finished attempt's entry is
    recorded (``on_shard_done``), so a failed attempt's partial file is never installed.
    After that the pack stops with one line naming the shard and the cause (a PackError); the
    remaining tasks are cancelled and finished shards stay recorded for ``--resume``. A task
    running over :data:`.dask_watch.STRAGGLER_FACTOR` times the median shard time (times its
    shards) is named on stderr once.
    """
    if not shards:
        on_start()
        return
    dd = import_dask()
    owned = session is None
    session = session or DaskSession(scheduler, workers)
    client = session.client
    # Per shard the client holds numbers in arrays (its sources, its attempts), never an
    # object: dicts of them cost 200 bytes a shard (docs/cluster.md, Numbers).
    sizes = ShardSizes(plan.bounds)
    bar = progress_bar(sum(sizes[k] for k in shards), progress, "pack (dask)")

    def say(line: str) -> None:  # above the bar, if there is one
        if hasattr(bar, "write"):
            bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    # key -> (future, its shards, when submitted), in flight
    tasks: dict[str, tuple[Any, list[int], float]] = {}
    try:
        link = dashboard_link(client)
        if progress and link:
            say(f"shardkit: Dask dashboard at {link}")
        # A plan travels as its folder (O(1) in sources), opened in the task; typed fields
        # (COCO annotations, a metadata table) travel with it: then one copy per worker
        # instead of one per task.
        plan_future = plan.ref() if plan.fields is None else \
            client.scatter([plan.ref()], broadcast=True, hash=False)[0]
        # Each worker imports the packing code and opens the plan now, as the local engine
        # does before its encoders start, not inside its first shard's time.
        first_tasks(client, warm_up, plan_future, shards[0])
        token = uuid.uuid4().hex[:12]
        attempts = np.zeros(plan.num_shards, dtype=np.int32)
        pending = deque(shards)
        # An upload's task hands its thread on while the network sends (hand_over): one
        # shard a task, or the rest of a group would run on a thread the worker lent out.
        grain = Grain(sizes, most=1 if upload is not None else MOST_SHARDS)
        threads = _threads(client)
        submitted = 0

        def submit(group: list[int]) -> None:
            nonlocal submitted
            for k in group:
                attempts[k] += 1
            submitted += 1
            key = f"shardkit-shard-{group[0]:05d}-{group[-1]:05d}-{token}-{submitted}"
            future = client.submit(attempt_shards, group, pack_shard, plan_future,
                                   {k: dest[k] for k in group}, strict=strict, upload=upload,
                                   encoded=None if upload is None else hand_over, pure=False,
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
            done = next_batch(ready, dask_watch.POLL_SECONDS)
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
                    say(_failed(exc, group[0], int(attempts[group[0]]), retries))
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
                    say(_failed(exc, k, int(attempts[k]), retries))
                    submit([k])  # alone: its retries and messages are its own
            if time.monotonic() - asked >= dask_watch.POLL_SECONDS:  # workers come and go
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
