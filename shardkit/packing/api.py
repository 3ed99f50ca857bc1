"""``shardkit.pack`` and ``shardkit.merge``: check the options, resolve the source
(:mod:`.sources`), plan, run an engine, install.

The pack decodes every source image once, resizes and re-encodes it, and writes a store under
a hidden partial name (metadata last), renamed to OUT only when complete.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any

from .. import metadata, storemeta
from ..errors import Interrupted, PackError, PackOptionError
from ..fileutil import check_parent, make_parent, remove, replace_atomic
from ..formats import format_for_path
from ..urls import is_url
from .buckets import BucketFields, make_spec
from .imaging import PILLOW_PIXEL_LIMIT
from .install import install, install_finished, partial_path
from .local import run_local, upload_shard
from .plan import Plan, make_plan
from .layout import check_order
from .sources import SourceOptions, TransferFailed, resolve
from .settings import ENGINES, Engine, PackSettings, check_integers
from .plan_seal import plan_id as combined_id
from .plan_store import START_OVER, PlanError
from .resume_check import refusal
from .staging import (PLAN_NAME, StagingLock, adopt_plan, entry_path, finalize_sharded,
                      plan_folder, prepare_partial, read_entries, staging_fault, staging_path)
from .workers import default_workers
from .writer import remove_store_files


@dataclass
class PackResult:
    """What a pack produced.

    ``seconds`` is the whole call; ``startup_seconds`` its part before encoding began (finding
    the sources, planning, starting workers), so ``images_per_second`` is the packing rate.
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


@dataclass
class Run:
    """How a plan is run and installed (each as :func:`pack` documents it); ``partial`` is the
    work folder or file (a URL OUT's local staging folder), ``started`` when encoding began."""

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
    kept: list[int] = field(default_factory=list)  # sources of each shard a resume kept
    session: Any = None  # the Dask engine's client (:class:`.dask_engine.DaskSession`)

    @property
    def remote(self) -> bool:
        return is_url(self.out)

    def on_start(self) -> None:
        self.started.append(time.perf_counter())


def pack(src: str | os.PathLike, out: str | os.PathLike, *, format: str | None = None,
         size: int | None = None, quality: int = 90, encoding: str = "jpeg", workers: int | None = None,
         strict: bool = False, overwrite: bool = False, max_pixels: int = PILLOW_PIXEL_LIMIT,
         allow_empty: bool = False, file_list: str | None = None,
         coco: str | os.PathLike | None = None, coco_masks: bool | None = None,
         metadata_file: str | os.PathLike | None = None, captions: bool = False,
         schema: Any = None,
         shard_size: int | None = None, num_shards: int | None = None, resume: bool = False,
         engine: Engine = "local", scheduler: str | None = None, num_nodes: int = 1,
         node_rank: int = 0, progress: bool = True, retries: int | None = None,
         source_format: str | None = None, image_key: str | None = None,
         label_key: str | None = None,
         storage_options: dict[str, Any] | None = None, order: str = "mixed",
         layout_seed: int = 0, buckets: Any = None,
         bucket_step: int | None = None, bucket_upscale: bool | None = None,
         min_bucket_count: int | None = None,
         split: str | None = None) -> PackResult:
    """Pack an ImageFolder-layout folder (or a file list) into an LMDB or HDF5 store.

    Without ``shard_size``/``num_shards`` OUT is one file; with them, a folder of shard files and
    a ``manifest.json``. Unusable images are skipped and listed in the metadata (or, with
    ``strict``, abort the run with no output). Output is built under a hidden partial name and
    moved to OUT only when complete; readers of an OUT it replaces are not disturbed.

    Args:
        src: the source folder: one subfolder per class (torchvision ``ImageFolder`` rules), or
            the folder that ``file_list`` paths are relative to. A local path.
        out: the store to write: a file, a folder (sharded), or a URL (``s3://bucket/prefix``,
            any fsspec URL; must be sharded: shards are built in a local staging folder,
            :func:`shardkit.packing.staging.staging_path`, uploaded as each finishes, with
            ``labels.npy`` and ``manifest.json`` last).
        format: a backend from ``shardkit.formats.FORMATS``; default from OUT's name
            (``.h5``/``.hdf5``: HDF5, else LMDB).
        size: resize so the shorter side is ``size`` pixels (bicubic, antialiased; never
            upscaled); 0 keeps the original sizes. Default 256; not with ``buckets``.
        quality: JPEG quality of the re-encoded records, 1-100.
        encoding: record encoding, a name from ``shardkit.codec.ENCODINGS`` (``jpeg``, ``raw``).
        workers: encoding processes; default: the CPUs this process may run on. 0 or 1 encode
            in this process.
        strict: stop at the first unusable source with no output written, instead of skipping it.
        overwrite: replace an existing OUT (readers of the old one keep reading it).
        max_pixels: sources with more pixels are skipped, and each encoding worker's memory is
            bounded accordingly; 0 disables the limit. Default: Pillow's decompression-bomb limit.
        allow_empty: keep classes without images instead of refusing the source folder, and
            write a store even when no image could be packed (otherwise a PackError, with no
            output written).
        file_list: a CSV/TSV file of ``path,label`` lines to pack instead of class folders.
        source_format: what SRC is, a name from
            ``shardkit.packing.sources.SOURCE_FORMATS``: ``folder``, ``webdataset`` (a tar, a
            brace pattern, a folder of tars), ``parquet`` (Hugging Face parquet/Arrow), ``mds``
            or ``litdata`` (an optimized folder), ``imagefolder`` (Hugging Face's layout: images
            with ``metadata.jsonl``/``.csv``/``.parquet``, split folders); default: detected
            from SRC's content (docs/sources.md). ``coco``, ``metadata_file``/``captions`` and
            ``file_list`` ask for their own sources, which read image files under SRC.
        image_key: the member suffixes (WebDataset, ``'jpg;png'``: the first present) or the
            column holding the image; default: the format's conventions.
        label_key: the member suffix or column holding the label (``'cls'``), likewise.
        coco: a COCO instances JSON file whose ``file_name`` s are relative to ``src``: one
            record per COCO image with boxes, labels, iscrowd, area, image_id and masks as typed
            fields (see ``docs/fields.md``; :mod:`shardkit.packing.coco`).
        coco_masks: pack ``segmentation`` s as instance masks (needs pycocotools: ``pip install
            'shardkit[coco]'``); None: when the file has segmentations.
        metadata_file: a JSON Lines or CSV/TSV file with a ``file_name`` column (paths relative to
            ``src``, the Hugging Face ``imagefolder`` layout): its other columns become typed
            fields of each image (:mod:`shardkit.packing.sources.metadata`). A ``file_list`` with a
            header row does the same with its columns after ``path,label``.
        captions: the text of ``<stem>.txt`` (else ``<stem>.caption``) beside each image as the
            field ``caption`` (in an imagefolder layout, where no metadata column gives it).
        schema: the fields' declaration (a :class:`shardkit.fields.Schema`, a list of field
            kinds, or a schema JSON file); None: inferred from the metadata.
        shard_size: write a sharded folder store, shards of about this many bytes.
        num_shards: write a sharded folder store of this many shards (not with ``shard_size``).
        resume: continue an interrupted sharded pack, keeping the shards it finished.
        engine: ``"local"`` (encoding processes on this machine) or ``"dask"`` (one task per
            shard on a Dask cluster; needs a sharded OUT on a filesystem the workers share).
        scheduler: address of a running Dask scheduler (``engine="dask"``); default: a local
            cluster for the duration of the pack.
        retries: ``engine="dask"``: how many times a shard whose task raised (a transient read
            error, a full disk on one node) is run again before the pack stops with one line
            naming it (default 3; a lost worker is rescheduled by Dask itself; docs/cluster.md).
        num_nodes: split a sharded pack over this many machines sharing OUT's filesystem; each
            packs its share, then :func:`merge` writes the manifest.
        node_rank: this machine's number, ``0 <= node_rank < num_nodes``.
        progress: show a progress bar on stderr.
        storage_options: options of the fsspec filesystem of a URL OUT (credentials, endpoint).
        order: ``"mixed"`` (default): a store of several shards lays its records out so that
            every shard holds a uniform mix of classes (a permutation seeded by
            ``layout_seed``, recorded in the store), while ``ds[i]``, ``targets`` and
            ``source_path(i)`` keep the sources' order; ``"source"``: shards hold the sources
            in order (see :mod:`shardkit.packing.layout`).
        layout_seed: the seed of the ``"mixed"`` layout (an integer >= 0).
        buckets: aspect-ratio buckets instead of ``size``: a side ``N`` (the ``"area"`` rule:
            kohya's bucket set on an area of ``N * N``, sides in steps of ``bucket_step``,
            aspect ratios 1:4..4:1), a list of ``(height, width)`` sizes, ``"sdxl"`` (SDXL's
            40 sizes), ``"kohya"`` (sd-scripts' ``BucketManager`` with its defaults) or a rule
            of :mod:`shardkit.bucketing`. Each image is resized to cover the bucket nearest its
            aspect ratio (never squashed) and centre-cropped to it; records carry
            ``original_size``, ``crop_top_left`` and ``target_size`` fields, and boxes and
            masks move with the pixels (:mod:`shardkit.packing.buckets`).
        bucket_step: the buckets' side step (default 64), and what a small source's own size is
            cut down to.
        bucket_upscale: upscale a source smaller than its bucket to cover it. Default: the
            rule's (side and list: keep it at its own size cut down to multiples of
            ``bucket_step``, a bucket of its own; ``"kohya"``: upscale, and False is
            sd-scripts' ``bucket_no_upscale``; ``"sdxl"``: always resized).
        min_bucket_count: merge each bucket that would hold fewer records into its nearest
            bucket (nearest ``w / h``; without upscaling one that fits inside it) before
            packing: its records are resized to cover that bucket and centre-cropped. Reads
            every source's header first (:mod:`shardkit.bucketing.merge`).
        split: the split of a Hugging Face imagefolder layout to pack (``train``, ``test``, ...:
            what ``datasets.load_dataset("imagefolder", data_dir=src)[split]`` holds); default
            ``train``. Only for that layout (:mod:`shardkit.packing.sources.imagefolder`).

    Returns:
        a :class:`PackResult`. Raises PackError (one line, naming the parameter) for bad
        options or, with ``strict``, a bad source; Interrupted on Ctrl-C (finished shards of a
        sharded pack are kept for ``resume``).
    """
    t0 = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out).rstrip("/") or "/"
    check_integers(workers=workers, shard_size=shard_size, num_shards=num_shards,
                   num_nodes=num_nodes, node_rank=node_rank, retries=retries)
    if retries is not None and (engine != "dask" or retries < 0):
        raise PackOptionError("`retries` needs `engine='dask'`" if engine != "dask" else
                              "`retries` must be >= 0")
    if shard_size is not None and num_shards is not None:
        raise PackOptionError("give `shard_size` or `num_shards`, not both")
    if scheduler is not None and workers is not None:  # the cluster's workers pack
        raise PackOptionError("give `workers` (local processes) or `scheduler` (a running "
                              "cluster's workers), not both")
    check_options(out, shard_size is not None or num_shards is not None, resume, engine,
                  scheduler, num_nodes, node_rank)
    check_order(order, layout_seed)
    spec = make_spec(buckets, bucket_step, bucket_upscale, min_bucket_count)
    if spec is not None and size is not None:
        raise PackOptionError("give `buckets` or `size`, not both (a bucketed pack sizes each "
                              "image to its bucket)")
    size = 0 if spec is not None else 256 if size is None else size
    settings = PackSettings(size, quality, encoding, format or format_for_path(out), max_pixels,
                            spec)
    settings.validate()
    options = SourceOptions(src, source_format, image_key, label_key, file_list,
                            None if coco is None else os.fspath(coco), coco_masks,
                            None if metadata_file is None else os.fspath(metadata_file),
                            captions, schema, allow_empty, split)
    source = resolve(options)
    check_out(src, out, overwrite, storage_options, resume)
    run = Run(out, staging_path(out, storage_options) if is_url(out) else partial_path(out),
              default_workers() if workers is None else workers, strict, overwrite, progress,
              allow_empty, engine, scheduler, num_nodes, node_rank, resume, storage_options,
              retries)
    plan_sharded = shard_size is not None or num_shards is not None
    plan_dir = _plan_dir(run)
    try:
        lister = None
        if engine == "dask":  # one client for listing, packing and merging
            from .dask_engine import DaskSession

            run.session = DaskSession(scheduler, run.workers)
            lister = run.session.lister
        if not is_url(src):
            # Workers with another cwd (Dask's) find the sources, and every engine records the
            # same skipped paths: a store does not depend on the engine or on the cwd.
            options = dataclasses.replace(options, src=os.path.abspath(src))
        try:
            scan = source.scan_into(options, plan_dir, lister)
            if spec is not None:  # the bucket fields, and the source's boxes and masks cropped
                scan.fields = BucketFields(scan.fields)
            plan = make_plan(scan, settings, plan_dir, shard_size=shard_size,
                             num_shards=num_shards, strict=strict, order=order,
                             layout_seed=layout_seed)
        except OSError as exc:  # the plan's files (a full disk, say); nothing else is written
            raise write_error(exc, run, NOTHING_KEPT if plan_sharded else "no output written",
                              os.path.dirname(plan_dir)) from None
        if not run.remote:
            make_parent(out, PackError)  # `mkdir -p` OUT's folder
        count, skipped, sources = (_pack_sharded if plan.sharded else _pack_single)(plan, run)
    except KeyboardInterrupt:  # before packing began (connecting, listing, planning)
        raise Interrupted("interrupted; no output written") from None
    finally:
        remove(plan_dir)  # moved into a sharded pack's partial folder, else done with
        if run.session is not None:
            run.session.close()
    now = time.perf_counter()
    return PackResult(out, count, skipped, now - t0, plan.num_shards, sources,
                      (run.started[0] if run.started else now) - t0, len(run.kept),
                      sum(run.kept))


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
    return PackResult(out, count, manifest["skipped"], time.perf_counter() - t0,
                      len(manifest["shards"]), count + len(manifest["skipped"]))


def check_packed(count: int, skipped: list[dict[str, str]], allow_empty: bool) -> None:
    """Refuse a pack that packed no image (every source skipped), unless ``allow_empty``."""
    if count or allow_empty:
        return
    first = f" (first: {skipped[0]['path']}: {skipped[0]['reason']})" if skipped else ""
    raise PackError(f"no images packed: {len(skipped)} source{'s' if len(skipped) != 1 else ''} "
                    f"skipped{first}; no output written (`allow_empty=True` writes an empty "
                    "store)")


def _plan_dir(run: Run) -> str:
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


def _pack_single(plan: Plan, run: Run) -> tuple[int, list[dict[str, str]], int]:
    """Pack the single-file store OUT: (count, skipped, sources)."""
    entries: dict[int, dict[str, Any]] = {}
    partial = run.partial
    try:
        remove_store_files([partial], plan.settings.format)  # a killed run's, with side files
        run_local(plan, [0], {0: partial}, workers=run.workers, strict=run.strict,
                  progress=run.progress, on_shard_done=entries.__setitem__,
                  on_start=run.on_start)
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


def _pack_sharded(plan: Plan, run: Run) -> tuple[int, list[dict[str, str]], int]:
    """Pack this node's shards into the partial folder (uploading each to a URL OUT), then, on
    the last node to finish, merge the manifest and install OUT: (count, skipped, sources)."""
    out, partial, remote = run.out, run.partial, run.remote
    parts = plan.fingerprint()
    plan_id = combined_id(parts)
    ours = [k for k in range(plan.num_shards) if k % run.num_nodes == run.node_rank]
    uploader = None
    finished: set[int] = set()  # shards a rerun with `resume` keeps (this run's and earlier)

    def on_done(k: int, entry: dict[str, Any]) -> None:
        if uploader is not None and not entry.get("uploaded"):  # not by a Dask worker
            entry = upload_shard(uploader, dest[k], entry)
        replace_atomic(entry_path(partial, k), metadata.dumps(entry | {"plan_id": plan_id}))
        finished.add(k)

    def kept() -> str:
        if not finished:  # a claim of kept shards would send the user to a useless resume
            return NOTHING_KEPT
        where = f"uploaded to {out}" if remote else f"kept in {partial}"
        return (f"{len(finished)} finished shard{'s' if len(finished) != 1 else ''} {where} "
                "(rerun with `resume=True` to continue)")

    staging = StagingLock(out, partial) if remote else None  # held until the pack ends
    try:
        resume = run.resume or run.num_nodes > 1
        problem = refusal(partial, plan, parts) if resume else None
        if problem is not None:
            if run.num_nodes > 1:  # never removed under the other nodes
                raise PlanError(f"cannot resume: {problem}",
                                f"delete {partial} to start over, once no node uses it")
            if not run.overwrite:
                raise PlanError(f"cannot resume: {problem}", START_OVER)
            resume = False  # `overwrite`: the earlier run's work goes, the pack starts over
        if remote:
            from ..remote import Uploader

            uploader = Uploader(out, run.storage_options, resume=run.resume,
                                overwrite=run.overwrite)
        done = prepare_partial(partial, plan, plan_id, resume, ours, uploader)
        if run.num_nodes == 1:  # the plan made now replaces the one checked: its paths are
            remove(plan_folder(partial))  # under the root the source is at now
        finished.update(done)
        if run.num_nodes == 1:  # a node's own result counts only its own share (below)
            run.kept[:] = [plan.bounds[k + 1] - plan.bounds[k] for k in sorted(done)]
        plan = adopt_plan(plan, partial)  # where tasks, `resume` and `merge` find it
        mine = [k for k in ours if k not in done]
        dest = {k: os.path.join(partial, plan.shard_file(k)) for k in mine}
        if run.engine == "dask":
            from .dask_engine import run_dask

            run_dask(plan, mine, dest, scheduler=run.scheduler, workers=run.workers,
                     progress=run.progress, on_shard_done=on_done, strict=run.strict,
                     on_start=run.on_start, upload=uploader, session=run.session,
                     **({} if run.retries is None else {"retries": run.retries}))
        else:
            run_local(plan, mine, dest, workers=run.workers, strict=run.strict,
                      progress=run.progress, on_shard_done=on_done, on_start=run.on_start)
        if run.num_nodes > 1:
            # Each node packs its share; `shardkit merge OUT` finishes once every node is done.
            return (sum(entry["count"] for entry in read_entries(partial, mine)), [],
                    sum(plan.bounds[k + 1] - plan.bounds[k] for k in mine))
        entries = read_entries(partial, range(plan.num_shards))
        if not run.allow_empty and not sum(entry["count"] for entry in entries):
            remove(partial)  # our own work folder: nothing of it is worth a resume
            check_packed(0, [s for entry in entries for s in entry["skipped"]], False)
        manifest, count = finalize_sharded(partial, plan,
                                           uploader.finish if uploader is not None else None,
                                           run.session.lister if run.session else None)
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
    if not remote:
        install_finished(partial, out, overwrite=run.overwrite)
    return count, manifest["skipped"], len(plan.paths)
