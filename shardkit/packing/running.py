"""Running a plan (:mod:`.plan`) and installing what it wrote: the single-file pack, the
sharded pack (this node's shards, a resume's checks, uploads to a URL OUT, the manifest), and
their one-line errors. :func:`shardkit.pack` checks the options and makes the plan; this
module runs it (:class:`Run`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

from .. import metadata
from ..errors import Interrupted, PackError
from ..fileutil import make_parent, remove, replace_atomic
from ..urls import is_url
from .install import install, install_finished
from .local import run_local, upload_shard
from .plan import PackPlan
from .sources import TransferFailed
from .settings import Engine
from .plan_seal import plan_id as combined_id
from .plan_store import START_OVER, PlanError
from .resume_check import refusal
from .staging import (StagingLock, adopt_plan, entry_path, finalize_sharded, plan_folder,
                      prepare_partial, read_entries, staging_fault)
from .writer import remove_store_files


@dataclass
class Run:
    """How a plan is run and installed (each as :func:`pack` documents it); ``partial`` is the
    work folder or file (a URL OUT's local staging folder), ``started`` when encoding began,
    ``first_record`` when the first record was written (the Dask engine: its first shard)."""

    out: str
    partial: str
    workers: int
    strict: bool = False
    overwrite: bool = False
    progress: bool = True
    allow_empty: bool = False
    engine: Engine = "local"
    scheduler: str | None = None
    num_nodes: int = 1
    node_rank: int = 0
    resume: bool = False
    storage_options: dict[str, Any] | None = None
    retries: int | None = None
    started: list[float] = field(default_factory=list)
    first_record: list[float] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)  # sources of each shard a resume kept
    session: Any = None  # the Dask engine's client (:class:`.dask_session.DaskSession`)
    #: the folder store an append adds to (:class:`.append.Base`), or None
    base: Any = None
    replacing: bool = False  # the append supersedes the store's records with the same keys
    #: the duplicate decisions of ``pack(dedup=...)`` (:class:`shardkit.dedup.Deduper`), or None
    dedup: Any = None

    @property
    def remote(self) -> bool:
        return is_url(self.out)

    def on_start(self) -> None:
        self.started.append(time.perf_counter())

    def on_record(self) -> None:
        if not self.first_record:
            self.first_record.append(time.perf_counter())



def check_packed(count: int, skipped: list[dict[str, str]], allow_empty: bool) -> None:
    """Refuse a pack that packed no image (every source skipped), unless ``allow_empty``."""
    if count or allow_empty:
        return
    first = f" (first: {skipped[0]['path']}: {skipped[0]['reason']})" if skipped else ""
    raise PackError(f"no images packed: {len(skipped)} source{'s' if len(skipped) != 1 else ''} "
                    f"skipped{first}; no output written (`allow_empty=True` writes an empty "
                    "store)")


def plan_dir(run: Run) -> str:
    """A fresh folder for the plan (:mod:`.plan_store`) beside the partial one, into which a
    sharded pack moves it (:func:`.staging.adopt_plan`); beside OUT's future folder when that
    does not exist yet (nothing is created for a pack refused while listing), on a filesystem
    the Dask workers share (then OUT's folder is created first)."""
    import socket
    import tempfile
    import uuid

    parent = os.path.dirname(os.path.abspath(run.partial))
    if not os.path.isdir(parent):
        if run.engine != "dask":
            parent = tempfile.gettempdir()
        else:
            make_parent(run.out, PackError)
    stem = f".{os.path.basename(run.partial).lstrip('.')}.plan-{socket.gethostname()}-"
    for name in os.listdir(parent):  # left by a killed pack on this machine
        pid = name[len(stem):].split("-", 1)[0] if name.startswith(stem) else ""
        if pid.isdigit() and not _alive(int(pid)):
            remove(os.path.join(parent, name))
    return os.path.join(parent, f"{stem}{os.getpid()}-{uuid.uuid4().hex[:8]}")


NOTHING_KEPT = "no shard was finished, nothing to resume"


class ShardFiles(Mapping):
    """Shard number -> the path of its file in ``partial``, for ``shards``: worked out when
    asked, so a pack of 100,000 shards holds no path string per shard."""

    def __init__(self, partial: str, plan: PackPlan, shards: list[int]) -> None:
        self.partial, self.plan, self.shards = partial, plan, shards

    def __getitem__(self, k: int) -> str:
        return os.path.join(self.partial, self.plan.shard_file(k))

    def __iter__(self) -> Iterator[int]:
        return iter(self.shards)

    def __len__(self) -> int:
        return len(self.shards)


def write_error(exc: OSError, run: Run, left: str, plan_in: str | None = None) -> PackError:
    """The one-line error of a pack that could not write its own files (a full disk, say),
    ``left`` saying what is kept. For a URL OUT the local staging folder is at fault (its plan
    and shards are written there): named with the remedy (:func:`.staging.staging_fault`), never
    the URL; for a local OUT the system's reason, and ``plan_in`` where the plan was written."""
    if run.remote:
        what = staging_fault(exc, run.partial)
    else:
        what = f"{exc.strerror or exc}" + (f" (writing the pack's plan in {plan_in})"
                                           if plan_in else "")
    return PackError(f"cannot write {run.out}: {what}; {left}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def pack_single(plan: PackPlan, run: Run) -> tuple[int, list[dict[str, str]], int]:
    """Pack the single-file store OUT: (count, skipped, sources)."""
    entries: dict[int, dict[str, Any]] = {}
    partial = run.partial
    try:
        remove_store_files([partial], plan.settings.format)  # a killed run's, with side files
        run_local(plan, [0], {0: partial}, workers=run.workers, strict=run.strict,
                  progress=run.progress, on_shard_done=entries.__setitem__,
                  on_start=run.on_start, on_record=run.on_record, dedup=run.dedup)
        check_packed(entries[0]["count"], entries[0]["skipped"], run.allow_empty)
        install(partial, run.out, run.overwrite)
    except BaseException as exc:
        try:
            remove_store_files([partial], plan.settings.format)
        except OSError:
            pass  # the error below is the one to report (a read-only folder refuses both)
        if isinstance(exc, KeyboardInterrupt):
            raise Interrupted("interrupted; no output written") from None
        if isinstance(exc, OSError):
            raise write_error(exc, run, "no output written") from None
        if isinstance(exc, TransferFailed):  # a source at a URL: one line, never a skip
            raise PackError(f"{exc}; no output written") from None
        raise
    return entries[0]["count"], entries[0]["skipped"], len(plan.paths)


def pack_sharded(plan: PackPlan, run: Run) -> tuple[int, list[dict[str, str]], int]:
    """Pack this node's shards into the partial folder (uploading each to a URL OUT), then, on
    the last node to finish, merge the manifest and install OUT: (count, skipped, sources)."""
    out, partial, remote = run.out, run.partial, run.remote
    parts = plan.fingerprint()
    plan_id = combined_id(parts)
    ours = range(run.node_rank, plan.num_shards, run.num_nodes)
    uploader = None
    # Shards a rerun with `resume` keeps (this run's and earlier): a count, each one's entry
    # is on disk (a set of numbers was 60 bytes a shard).
    finished = [0]

    def on_done(k: int, entry: dict[str, Any]) -> None:
        if uploader is not None and not entry.get("uploaded"):  # not by a Dask worker
            entry = upload_shard(uploader, dest[k], entry)
        replace_atomic(entry_path(partial, k), metadata.dumps(entry | {"plan_id": plan_id}))
        finished[0] += 1
        run.on_record()  # the local engine's first record came before; Dask's, in this shard

    def kept() -> str:
        if not finished[0]:  # a claim of kept shards would send the user to a useless resume
            return NOTHING_KEPT
        where = f"uploaded to {out}" if remote else f"kept in {partial}"
        return (f"{finished[0]} finished shard{'s' if finished[0] != 1 else ''} {where} "
                "(rerun with `resume=True` to continue)")

    staging = StagingLock(out, partial) if remote else None  # held until the pack ends
    try:
        resume = run.resume or run.num_nodes > 1
        problem = refusal(partial, plan, parts) if resume else None
        if problem is not None:
            if run.num_nodes > 1:  # never removed under the other nodes
                raise PlanError(f"cannot resume: {problem}",
                                f"delete {partial} to start over, once no node uses it")
            if not run.overwrite:  # an append starts over as a plain one, not with `overwrite`
                raise PlanError(f"cannot resume: {problem}", START_OVER if run.base is None else
                                "run it again without `resume=True` to start over")
            resume = False  # `overwrite`: the earlier run's work goes, the pack starts over
        if remote:
            from ..remote import Uploader

            appending = {}
            if run.base is not None:  # a new version of the store there (.append_remote)
                from .append_remote import uploader_options

                appending = uploader_options(run.base)
            uploader = Uploader(out, run.storage_options, resume=run.resume,
                                overwrite=run.overwrite, **appending)
        done = set(prepare_partial(partial, plan, plan_id, resume, ours, uploader))
        if run.num_nodes == 1:  # the plan made now replaces the one checked: its paths are
            remove(plan_folder(partial))  # under the root the source is at now
        finished[0] += len(done)
        if run.num_nodes == 1:  # a node's own result counts only its own share (below)
            run.kept[:] = [plan.bounds[k + 1] - plan.bounds[k] for k in sorted(done)]
        plan = adopt_plan(plan, partial)  # where tasks, `resume` and `merge` find it
        mine = [k for k in ours if k not in done]
        dest = ShardFiles(partial, plan, mine)
        if run.engine == "dask":
            from .dask_engine import run_dask

            run_dask(plan, mine, dest, scheduler=run.scheduler, workers=run.workers,
                     progress=run.progress, on_shard_done=on_done, strict=run.strict,
                     on_start=run.on_start, upload=uploader, session=run.session,
                     **({} if run.retries is None else {"retries": run.retries}))
        else:
            run_local(plan, mine, dest, workers=run.workers, strict=run.strict,
                      progress=run.progress, on_shard_done=on_done, on_start=run.on_start,
                      on_record=run.on_record, dedup=run.dedup)
        if run.num_nodes > 1:
            # Each node packs its share; `shardkit merge OUT` finishes once every node is done.
            return (sum(entry["count"] for entry in read_entries(partial, mine)), [],
                    sum(plan.bounds[k + 1] - plan.bounds[k] for k in mine))
        # One entry at a time (a list of every shard's entry was 1.2 KB a shard).
        if not run.allow_empty and not any(entry["count"] for entry in
                                           read_entries(partial, range(plan.num_shards))):
            skipped = [s for entry in read_entries(partial, range(plan.num_shards))
                       for s in entry["skipped"]]
            remove(partial)  # our own work folder: nothing of it is worth a resume
            check_packed(0, skipped, False)
        publish = uploader.finish if uploader is not None else None
        if uploader is not None and run.base is not None:
            from .append_remote import publish as publish_version

            def publish(folder: str) -> None:
                publish_version(folder, run.base, uploader, run.replacing)
        manifest, count = finalize_sharded(partial, plan, publish,
                                           run.session.lister if run.session else None)
        if run.dedup is not None and run.base is None and not remote:
            from .dedup_run import store_hashes

            store_hashes(partial, run.dedup)  # what an append with dedup compares with
        if remote:
            remove(partial)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {kept()}") from None
    except TransferFailed as exc:  # a source at a URL: one line, never a skip
        raise PackError(f"{exc}; {kept()}") from None
    except OSError as exc:
        raise write_error(exc, run, kept()) from None
    finally:
        if uploader is not None:  # the prefix's lock: given back on every way out
            uploader.close()
        if staging is not None:
            staging.release()
    if run.base is not None and not remote:
        from .append import install_version

        from .dedup_run import hashes_entry

        dedup = run.dedup
        install_version(partial, run.base, run.replacing, None if dedup is None else
                        (lambda folder, keys: hashes_entry(folder, dedup, keys)))
    elif not remote:
        install_finished(partial, out, overwrite=run.overwrite)
    return count, manifest["skipped"], len(plan.paths)
