"""The Dask engine: one task per shard on a Dask cluster (``--engine dask``).

Each task runs :func:`shardkit.packing.local.pack_shard` on a worker, writing its shard file straight into
the pack's partial folder, which must be on a filesystem every worker shares. The client collects
each shard's manifest entry as the task finishes and hands it to ``on_shard_done`` (which records
it for ``--resume``); the caller then merges the manifest. For a URL OUT each task uploads its
own shard and deletes the local file, so the staging folder need not be shared. Without a
scheduler address a ``LocalCluster`` of worker processes on 127.0.0.1 is started for the
duration of the pack.

Dask is an optional extra (``pip install 'dask[distributed]'``); nothing here is imported by the
default engine.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from typing import Any, Callable

from ..errors import PackError
from ..urls import is_url
from .console import progress as progress_bar
from .local import ShardDone, pack_shard
from .plan import Plan


def _import_dask() -> Any:
    try:
        import dask.distributed as dd
    except ImportError:
        raise PackError("`engine='dask'` needs Dask's distributed scheduler: "
                        "pip install 'dask[distributed]'") from None
    return dd


def _absolute(plan: Plan) -> Plan:
    """The same plan with absolute source paths, so workers with another cwd find the files.

    Paths stored in shards are relative to the root, so the output does not change.
    """
    if is_url(plan.root):  # tars at a URL: every worker reads them there
        return plan
    root = os.path.abspath(plan.root)
    return dataclasses.replace(plan, root=root,
                               paths=[os.path.join(root, plan.relpath(p)) for p in plan.paths])


def run_dask(plan: Plan, shards: list[int], dest: dict[int, str], *, scheduler: str | None = None,
             workers: int = 1, progress: bool = True, on_shard_done: ShardDone,
             strict: bool = False, on_start: Callable[[], None] = lambda: None,
             upload: Any = None) -> None:
    """Pack ``shards`` of ``plan`` on a Dask cluster, one task per shard.

    Args:
        plan: the pack plan (sources, shard bounds, settings); sent to each worker once.
        shards: shard numbers to pack.
        dest: shard number -> absolute path of its file (on the shared filesystem).
        scheduler: address of a running Dask scheduler (``tcp://host:8786``); ``None`` starts a
            ``LocalCluster`` of ``workers`` single-threaded processes on 127.0.0.1.
        workers: worker processes of the local cluster (ignored with ``scheduler``).
        progress: show a progress bar (images, advanced as each shard finishes).
        on_shard_done: called in this process with ``(k, entry)`` as each shard finishes, in
            completion order.
        strict: fail on the first unusable image instead of skipping it.
        on_start: called once the tasks are submitted.
        upload: a :class:`shardkit.remote.Uploader` for a URL OUT: each task uploads its shard.

    A failing task (or a worker lost more often than Dask's retry limit: ``KilledWorker``, raised
    as a one-line PackError) cancels the remaining tasks and raises; shards that finished stay
    recorded, so ``--resume`` continues from there.
    """
    if not shards:
        on_start()
        return
    dd = _import_dask()
    plan = _absolute(plan)
    cluster = None
    if scheduler is None:
        cluster = dd.LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  silence_logs=logging.ERROR)
        client = dd.Client(cluster)
    else:
        try:
            client = dd.Client(scheduler, timeout="60s")
        except OSError as exc:
            raise PackError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    sizes = {k: plan.bounds[k + 1] - plan.bounds[k] for k in shards}
    bar = progress_bar(sum(sizes.values()), progress, "pack (dask)")
    futures: list[Any] = []
    try:
        # One copy of the (possibly large) plan per worker instead of one per task.
        [plan_future] = client.scatter([plan], broadcast=True, hash=False)
        token = uuid.uuid4().hex[:12]
        futures = [client.submit(pack_shard, plan_future, k, dest[k], strict=strict,
                                 upload=upload, key=f"shardkit-shard-{k:05d}-{token}",
                                 pure=False)
                   for k in shards]
        shard_of = {future.key: k for future, k in zip(futures, shards)}
        on_start()
        for future in dd.as_completed(futures):
            k = shard_of[future.key]
            try:
                entry = future.result()  # re-raises the task's exception here
            except dd.KilledWorker:
                raise PackError(f"the Dask worker packing shard {k} died (more often than "
                                "Dask's distributed.scheduler.allowed-failures); finished "
                                "shards are kept: rerun with `resume=True` to continue"
                                ) from None
            on_shard_done(k, entry)
            bar.update(sizes[k])
    finally:
        bar.close()
        if futures:
            client.cancel(futures)
        client.close()
        if cluster is not None:
            cluster.close()
