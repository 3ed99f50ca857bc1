"""What a Dask pack runs on a worker: the warm-up (:func:`warm_up`, :func:`first_tasks`), one
attempt at a task's shards (:func:`attempt_shards`, which stops once the client cancelled the
task) and, for a URL OUT, the hand-over of the worker's thread while a shard uploads
(:func:`hand_over`)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..errors import PackError
from .allocator import image_blocks
from .dask_session import import_dask
from .faults import inject as inject_fault, inject_task as inject_task_fault
from .plan import PlanRef


def warm_up(ref: PlanRef, k: int) -> None:
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


def first_tasks(client: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` as a task on each worker (another if that one is busy), waiting up to a
    minute: a task, not ``client.run``, so that a fresh scheduler's and worker's first pass over
    their task code paths (0.2-0.4 s on 127.0.0.1) happens here, in startup, as the local
    engine's encoders are forked in its startup."""
    dd = import_dask()
    try:
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
        futures = [client.submit(fn, *args, workers=[w], allow_other_workers=True, pure=False)
                   for w in workers]
        dd.wait(futures, timeout=60)
        client.cancel(futures)
    except Exception:  # noqa: BLE001 - only a warm-up: the pack's own tasks report failures
        pass


def attempt_shards(group: list[int], task: Callable[..., Any], ref: PlanRef, dest: dict[int, str],
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


_finishing = 0  # this worker's tasks that have handed their thread slot on (:func:`hand_over`)
_finishing_lock = threading.Lock()
_local = threading.local()


def hand_over() -> None:
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
