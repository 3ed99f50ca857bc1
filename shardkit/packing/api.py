"""``shardkit.pack`` and ``shardkit.merge``: check the options, resolve the source
(:mod:`.sources`), plan, run an engine, install.

The pack decodes every source image once, resizes and re-encodes it, and writes a store under
a hidden partial name (metadata last), renamed to OUT only when complete.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any, Unpack

from .. import metadata, storemeta
from ..errors import Interrupted, PackError, PackOptionError
from ..fileutil import check_parent, make_parent, remove
from ..formats import format_for_path
from ..urls import is_url
from . import append as appending
from .bucket_append import rule_for_append
from .buckets import BucketFields
from .dedup_run import deduper_for, report_dedup, seed
from .imaging import PILLOW_PIXEL_LIMIT
from .install import install_finished, partial_path
from .options import Buckets, EngineChoice, Image, Shards, engine_parts
from .plan import make_plan
from .running import NOTHING_KEPT, Run, pack_sharded, pack_single, plan_dir, write_error
from .shortcuts import Shortcuts, records
from .sources import SourceOptions, resolve
from .sources.specs import SourceChoice, combined
from .settings import ENGINES, Engine, PackSettings
from .staging import PLAN_NAME, StagingLock, finalize_sharded, staging_path
from .workers import default_workers


@dataclass
class PackResult:
    """What a pack produced.

    ``seconds`` is the whole call; ``startup_seconds`` its part before encoding began (finding
    the sources, planning, starting workers), so ``images_per_second`` is the packing rate.
    ``first_record_seconds``: from the call to the first record written (or skip recorded); with
    the Dask engine, whose workers write the records, to the first shard finished; ``seconds``
    when this call wrote none (a ``resume`` that kept every shard).
    ``dedup``: with ``pack(dedup=...)``, the duplicates' summary (``mode``, ``threshold``,
    ``kept``, ``dropped``, ``report``: the JSON file listing every pair), else None.
    ``kept_shards`` and ``kept_sources``: what a ``resume`` kept from an earlier run (counted in
    ``count`` and ``sources``, not in the rate: this call did not pack them).
    """

    out: str
    count: int
    skipped: list[dict[str, str]]
    seconds: float
    shards: int = 1
    sources: int = 0
    startup_seconds: float = 0.0
    kept_shards: int = 0
    kept_sources: int = 0
    first_record_seconds: float = 0.0
    dedup: dict[str, Any] | None = None

    @property
    def packing_seconds(self) -> float:
        return max(0.0, self.seconds - self.startup_seconds)

    @property
    def images_per_second(self) -> float:
        packed = self.sources - self.kept_sources
        return packed / self.packing_seconds if self.packing_seconds > 0 else 0.0


def check_options(out: str, sharded: bool, resume: bool, engine: Engine, scheduler: str | None,
                  num_nodes: int, node_rank: int) -> None:
    """Refuse run options that cannot work together, before any work is done (the source's
    options are its own to check: :func:`shardkit.packing.sources.resolve`)."""
    if engine not in ENGINES:
        raise PackOptionError(f"`engine` must be {' or '.join(map(repr, ENGINES))}, "
                              f"not {engine!r}")
    if scheduler is not None and engine != "dask":
        raise PackOptionError("`scheduler` needs `engine='dask'`")
    if not 0 <= node_rank < num_nodes:
        raise PackOptionError("`node_rank` must be in 0..`num_nodes`-1")
    if not sharded:
        for name, given in (("engine='dask'", engine == "dask"), ("resume=True", resume),
                            ("num_nodes", num_nodes > 1)):
            if given:
                raise PackOptionError(f"`{name}` needs a sharded OUT: give `shard_size` or "
                                "`num_shards`")
    if is_url(out):
        if not sharded:
            raise PackOptionError(f"{out}: a remote OUT is a folder store: give `shard_size` "
                                  "or `num_shards`")
        if num_nodes > 1:
            raise PackOptionError(f"{out}: `num_nodes` needs a local OUT that every node "
                                  "shares; pack to a URL from one machine, or with "
                                  "`engine='dask'`")
        return
    folder = check_parent(out, PackError)  # a missing one is created once the plan is made
    if os.path.isdir(folder) and not os.access(folder, os.W_OK):  # EROFS for root too
        try:
            read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):  # no statvfs (Windows)
            read_only = False
        raise PackError(f"cannot write {out}: folder {folder} is "
                        f"{'on a read-only file system' if read_only else 'not writable'}; "
                        "no output written")


def check_out(src: str, out: str, overwrite: bool, storage_options: dict[str, Any] | None,
              resume: bool = False) -> None:
    """Refuse an OUT that exists (without ``overwrite``) or lies inside SRC; a URL OUT: its
    filesystem, endpoint and emptiness, and no other pack staging for it or holding its lock."""
    if is_url(out):  # the old manifest goes once packing starts
        from ..remote import check_filesystem, check_target

        check_filesystem(out, storage_options)  # before a staging folder is made for it
        StagingLock(out, staging_path(out, storage_options)).release()  # another pack there?
        check_target(out, storage_options, overwrite, resume)
        return
    if os.path.lexists(out) and not overwrite:
        raise PackError(f"{out} already exists (use `overwrite=True` to replace it)")
    if (os.path.abspath(out) == os.path.abspath(src) or
            os.path.abspath(out).startswith(os.path.abspath(src) + os.sep)):
        raise PackOptionError("`out` must not be inside `src` (the source folder)")


def pack(src: str | os.PathLike, out: str | os.PathLike, *,
         source: SourceChoice | None = None, image: Image | None = None,
         shards: Shards | None = None, engine: EngineChoice | Engine | None = None,
         format: str | None = None, schema: Any = None, max_pixels: int = PILLOW_PIXEL_LIMIT,
         strict: bool = False, overwrite: bool = False, allow_empty: bool = False,
         resume: bool = False, progress: bool = True,
         storage_options: dict[str, Any] | None = None,
         **shortcuts: Unpack[Shortcuts]) -> PackResult:
    """Pack SRC (an ImageFolder layout, a file list, COCO, WebDataset, parquet, MDS...) into
    an LMDB or HDF5 store OUT.

    Without ``shards`` OUT is one file; with them, a folder of shard files and a
    ``manifest.json``. Unusable images are skipped and listed in the metadata (or, with
    ``strict``, abort the run with no output). Output is built under a hidden partial name and
    moved to OUT only when complete; readers of an OUT it replaces are not disturbed.

    Args:
        src: what to pack: a folder, or a tar, a brace pattern or a URL where the source
            reads one (``source``).
        out: the store to write: a file, a folder (``shards``), or a URL
            (``s3://bucket/prefix``, any fsspec URL; needs ``shards``: they are built in a
            local staging folder, :func:`shardkit.packing.staging.staging_path`, uploaded as
            each finishes, with ``labels.npy`` and ``manifest.json`` last).
        source: what SRC is, a record of ``shardkit.sources`` (``Coco(path)``,
            ``WebDataset(image_key=...)``, ``FileList(path)``...) or a tuple of records that
            combine (``(FileList(path), Captions())``); default: detected from SRC's content
            (docs/sources.md).
        image: how each image becomes a record: ``shardkit.Resize(size, quality, encoding)``
            (default ``Resize(256)``) or ``shardkit.Buckets(rule, ...)``.
        shards: ``shardkit.Shards(size=BYTES)`` or ``Shards(count=N)``: a folder store.
        engine: ``shardkit.Local(workers)`` (default), ``shardkit.Dask(scheduler, retries)``
            or ``shardkit.Nodes(count, rank)``; ``"local"``/``"dask"`` name the first two.
        format: a backend from ``shardkit.formats.FORMATS``; default from OUT's name
            (``.h5``/``.hdf5``: HDF5, else LMDB).
        schema: the fields' declaration (a :class:`shardkit.fields.Schema`, a list of field
            kinds, or a schema JSON file); None: inferred from the metadata.
        max_pixels: sources with more pixels are skipped, and each encoding worker's memory is
            bounded accordingly; 0 disables the limit. Default: Pillow's decompression-bomb limit.
        strict: stop at the first unusable source with no output written, instead of skipping it.
        overwrite: replace an existing OUT (readers of the old one keep reading it).
        allow_empty: keep classes without images instead of refusing the source folder, and
            write a store even when no image could be packed (otherwise a PackError, with no
            output written).
        resume: continue an interrupted sharded pack, keeping the shards it finished.
        progress: show a progress bar on stderr.
        storage_options: options of the fsspec filesystem of a URL OUT (credentials, endpoint).
        **shortcuts: each flag of ``shardkit pack`` as a keyword that builds the record it
            belongs to (``size=``, ``quality=``, ``buckets=``, ``shard_size=``, ``workers=``,
            ``coco=``...: :class:`shardkit.packing.shortcuts.Shortcuts` lists them); one
            beside its record is refused naming both.

    Returns:
        a :class:`PackResult`. Raises PackOptionError (one line, naming the parameter) for bad
        options, PackError for a bad source with ``strict``; Interrupted on Ctrl-C (finished
        shards of a sharded pack are kept for ``resume``).
    """
    t0 = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out).rstrip("/") or "/"
    appended = shortcuts.pop("append", False)  # True: new keys; "replace": the store's keys
    dedup, dedup_threshold = shortcuts.pop("dedup", None), shortcuts.pop("dedup_threshold", None)
    if appended and is_url(out):  # the store under the URL, its keys read from there
        from .append_remote import load_remote_base

        base: appending.Base | None = load_remote_base(out, storage_options,
                                                        bucketed=appended is True)
    else:
        base = appending.load_base(out) if appended else None
    if base is not None:  # the store's own image settings and shard size, where not given
        shortcuts = appending.defaults(base, image, shards, shortcuts)
        format = format or base.manifest["settings"]["format"]
    asked = records(source, image, shards, engine, **shortcuts)
    image, shards, eng = asked.image, asked.shards, engine_parts(asked.engine)
    check_options(out, shards is not None, resume, eng.name, eng.scheduler, eng.num_nodes,
                  eng.node_rank)
    buckets = image.spec if isinstance(image, Buckets) else None
    if base is not None and buckets is not None:  # the store's rule, merges as it made them
        buckets = rule_for_append(out, base.manifest, buckets)
    deduper = deduper_for(dedup, dedup_threshold, out=out, engine=eng.name,
                          num_nodes=eng.num_nodes, resume=resume, append=bool(appended),
                          overwrite=overwrite)
    if deduper is not None and base is not None:  # the store's records are kept already
        seed(deduper, base)
    chosen = combined(asked.source)
    if base is not None:  # an append keys its records as the store's were, where not given
        chosen = appending.keyed_as_store(base, chosen)
    settings = PackSettings(0 if buckets is not None else image.size, image.quality,
                            image.encoding, format or format_for_path(out), max_pixels, buckets,
                            dedup, chosen.get("id_key"))
    settings.validate()
    if base is not None:
        appending.check_settings(base, settings.as_meta())
    options = SourceOptions(**{"src": src, **chosen, "schema": schema,
                               "allow_empty": allow_empty})
    found = resolve(options)
    if base is None:
        check_out(src, out, overwrite, storage_options, resume)
    run = Run(out, staging_path(out, storage_options) if is_url(out) else partial_path(out),
              default_workers() if eng.workers is None else eng.workers, strict, overwrite,
              progress, allow_empty, eng.name, eng.scheduler, eng.num_nodes, eng.node_rank,
              resume, storage_options, eng.retries, base=base, dedup=deduper,
              replacing=appended == "replace")
    folder = plan_dir(run)
    try:
        lister = None
        if eng.name == "dask":  # one client for listing, packing and merging
            from .dask_session import DaskSession

            run.session = DaskSession(eng.scheduler, run.workers)
            lister = run.session.lister
        if not is_url(src):
            # Workers with another cwd (Dask's) find the sources, and every engine records the
            # same skipped paths: a store does not depend on the engine or on the cwd.
            options = dataclasses.replace(options, src=os.path.abspath(src))
        try:
            scan = found.scan_into(options, folder, lister)
            if base is not None:  # only the sources the store lacks
                scan = appending.select_new(scan, base, folder, appended == "replace")
            if buckets is not None:  # the bucket fields, and the source's boxes and masks cropped
                scan.fields = BucketFields(scan.fields)
            plan = make_plan(scan, settings, folder,
                             shard_size=None if shards is None else shards.size,
                             num_shards=None if shards is None else shards.count,
                             strict=strict, order="mixed" if shards is None else shards.order,
                             layout_seed=0 if shards is None else shards.layout_seed,
                             lister=lister, merge_buckets=base is None)
        except OSError as exc:  # the plan's files (a full disk, say); nothing else is written
            raise write_error(exc, run, "no output written" if shards is None else NOTHING_KEPT,
                              os.path.dirname(folder)) from None
        if not run.remote:
            make_parent(out, PackError)  # `mkdir -p` OUT's folder
        count, skipped, sources = (pack_sharded if plan.sharded else pack_single)(plan, run)
        found_dups = None if deduper is None else report_dedup(deduper, out)
    except KeyboardInterrupt:  # before packing began (connecting, listing, planning)
        raise Interrupted("interrupted; no output written") from None
    finally:
        remove(folder)  # moved into a sharded pack's partial folder, else done with
        if run.session is not None:
            run.session.close()
    now = time.perf_counter()
    return PackResult(out, count, skipped, now - t0, plan.num_shards, sources,
                      (run.started[0] if run.started else now) - t0, len(run.kept),
                      sum(run.kept), (run.first_record[0] if run.first_record else now) - t0,
                      found_dups)


def merge(out: str | os.PathLike, overwrite: bool = False) -> PackResult:
    """Finish a multi-node pack: check every shard is done, write the manifest, install OUT.

    Also installs a finished store left in the partial folder by an install that failed.

    Args:
        out: the OUT every node packed into (a local folder; its partial folder holds the work).
        overwrite: replace an existing OUT (readers of the old one keep reading it).
    """
    t0 = time.perf_counter()
    out = os.fspath(out).rstrip("/") or "/"
    if is_url(out):
        raise PackOptionError(f"{out}: `merge` finishes a multi-node pack into a local folder "
                              "(a pack to a URL uploads its manifest itself)")
    partial = partial_path(out)
    if not os.path.isdir(partial):
        raise PackError(f"no pack in progress for {out} (expected {partial})")
    try:
        if os.path.exists(os.path.join(partial, PLAN_NAME)):
            manifest, count = finalize_sharded(partial)
        else:  # finalized by a run whose install failed
            with open(os.path.join(partial, metadata.MANIFEST_NAME), "rb") as f:
                manifest = storemeta.parse_manifest(f.read(), partial)
            count = manifest["count"]
    except FileNotFoundError:
        raise PackError(f"{partial}: no pack in progress to merge") from None
    except OSError as exc:
        raise PackError(f"cannot write {out}: {exc.strerror or exc}; the shards are kept in "
                        f"{partial} (merge again once that is fixed)") from None
    install_finished(partial, out, overwrite)
    seconds = time.perf_counter() - t0
    return PackResult(out, count, manifest["skipped"], seconds, len(manifest["shards"]),
                      count + len(manifest["skipped"]), first_record_seconds=seconds)
