"""The plan of a pack, fixed before any pixel is decoded: the ordered sources and the shard
boundaries. Every engine (in-process, local workers, Dask, several nodes each packing their
share) produces the same shards from the same plan."""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PackError, PackOptionError
from ..fields import FieldError
from ..formats import SUFFIXES, backend
from . import plan_seal, plan_store, workers
from .layout import check_order, mixed_slots
from .plan_store import SourceTable
from .record_fields import RecordFields
from .settings import PackSettings
from .sources import Scan
from .writer import StoreWriter, common_meta, relative_path

SIZE_SAMPLE = 32  # images encoded up front to estimate bytes per record for `shard_size`


@dataclass
class PackPlan:
    """Sources, shard boundaries and settings: everything that decides the output.

    The per-source arrays live in a plan folder (:mod:`.plan_store`, ``table``), mapped where
    they are read: ``paths[i]``/``labels[i]`` (slot ``i``'s source) read one source from it.
    Pickled, a plan is its folder and root, O(1) in sources, opened again (:func:`open_plan`)
    where it is unpickled; a Dask task receives a :class:`PlanRef` (:meth:`ref`), opened in the
    task, which reads its own shard's slice."""

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    table: SourceTable
    bounds: list[int]  # shard k holds sources bounds[k]:bounds[k+1]
    settings: PackSettings
    sharded: bool
    discovery_skipped: list[dict[str, str]] = field(default_factory=list)
    layout: dict[str, Any] | None = None  # the manifest's record of it: {"order", "seed"}

    #: The records' typed fields (:class:`.record_fields.RecordFields`), or None.
    fields: RecordFields | None = None
    #: A container source's index (:class:`.sources.ContainerIndex`); None: image files.
    index: Any = None

    @property
    def num_shards(self) -> int:
        return len(self.bounds) - 1

    @property
    def count(self) -> int:
        """Sources planned (records and skips)."""
        return self.table.count

    @property
    def folder(self) -> str:
        return self.table.folder

    @property
    def slots(self) -> np.ndarray | None:
        """The source (index in the sources' order) written at each slot; None: the sources'
        order (see :mod:`shardkit.packing.layout`)."""
        return self.table.slots

    @property
    def paths(self) -> _SlotPaths:
        """The source path at each slot (a sequence read from the plan folder)."""
        return _SlotPaths(self)

    @property
    def labels(self) -> _SlotLabels:
        """The label at each slot (a sequence read from the plan folder)."""
        return _SlotLabels(self)

    def fingerprint(self) -> dict[str, str]:
        """What decides the output, part by part (:func:`.plan_seal.fingerprint`)."""
        extra = self.fields.plan_key().encode() if self.fields is not None else b""
        return plan_seal.fingerprint(self.folder, plan_seal.read_header(self.folder),
                                     self.root, extra)

    def plan_id(self) -> str:
        return plan_seal.plan_id(self.fingerprint())

    def rows(self, k: int) -> tuple[plan_store.Rows, list[Any]]:
        """Shard ``k``'s slots read at once: their sources, paths and labels, and what an
        encoding worker reads for each (a file path, or a container member)."""
        rows = self.table.rows(self.bounds[k], self.bounds[k + 1])
        items = rows.paths if self.index is None else [self.index.item(j) for j in rows.sources]
        return rows, items

    def source_index(self, i: int) -> int:
        """The position in the source's own order of the record written at slot ``i``."""
        return self.table.slot(i)

    def relpath(self, path: str) -> str:
        return relative_path(self.root, path)

    def shard_file(self, k: int) -> str:
        return f"shard-{k:05d}{SUFFIXES[self.settings.format]}"

    def common_meta(self) -> dict[str, Any]:
        f = self.fields
        return common_meta(self.classes, self.class_to_idx, self.settings, self.root,
                           f.schema if f is not None else None, f.meta() if f is not None else None)

    def shard_writer(self, k: int, path: str) -> StoreWriter:
        """A writer for shard ``k`` straight to ``path`` (the whole store if not sharded)."""
        s = self.settings
        return StoreWriter(path, self.classes, format=s.format, encoding=s.encoding, size=s.size,
                           quality=s.quality, max_pixels=s.max_pixels,
                           class_to_idx=self.class_to_idx, source_root=self.root,
                           kind="shard" if self.sharded else "single", install=False,
                           shard_index=k, first_source=self.bounds[k],
                           skipped=() if self.sharded else self.discovery_skipped,
                           schema=self.fields.schema if self.fields else None,
                           extra_meta=self.fields.meta() if self.fields else None,
                           buckets=s.buckets, id_key=s.id_key)

    def __reduce__(self) -> tuple[Any, ...]:
        # The folder, not the arrays: a task's payload stays O(1) in sources.
        return open_plan, (self.folder, self.root, self.fields, self.settings)

    def ref(self) -> PlanRef:
        """The plan as a Dask task's argument, opened in the task (:class:`PlanRef`)."""
        return PlanRef(self.folder, self.root, self.fields, self.settings)


class PlanRef:
    """A plan named by its folder, opened (its files checked against their seal) by
    :meth:`open` where it is used, once per object: not where it is unpickled, since Dask's
    scheduler unpickles a task's arguments too (a damaged plan there fails as a graph error,
    retried; in the task it is the plan's own error, which is not)."""

    def __init__(self, folder: str, root: str, fields: RecordFields | None,
                 settings: PackSettings) -> None:
        self.folder, self.root, self.fields, self.settings = folder, root, fields, settings
        self._plan: PackPlan | None = None

    def open(self) -> PackPlan:
        if self._plan is None:
            self._plan = open_plan(self.folder, self.root, self.fields, self.settings)
        return self._plan

    def __getstate__(self) -> dict[str, Any]:  # opened again where it is unpickled
        return {k: v for k, v in vars(self).items() if k != "_plan"} | {"_plan": None}


class _SlotPaths(Sequence):
    def __init__(self, plan: PackPlan) -> None:
        self.plan = plan

    def __len__(self) -> int:
        return self.plan.count

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.plan.table.path(self.plan.source_index(i))


class _SlotLabels(_SlotPaths):
    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.plan.table.label(self.plan.source_index(i))


# This process's plans, by folder (a task's reopen), held only while something uses them: a
# plan keeps its files open (SourceTable's preads), and a finished pack deletes the folder, so a
# strong cache leaked those descriptors, and the deleted files' disk space, for the process's life.
_opened: weakref.WeakValueDictionary[tuple[Any, ...], PackPlan] = weakref.WeakValueDictionary()


def open_plan(folder: str, root: str | None = None, fields: RecordFields | None = None,
              settings: PackSettings | None = None) -> PackPlan:
    """The plan saved in ``folder`` (by :func:`make_plan`), its arrays mapped as they are read.

    ``root``: where the sources are (default: as planned); ``fields`` and ``settings``: the
    records' typed fields and the pack's settings, which the folder holds only as their
    fingerprint (without ``settings``: only the format is known, enough to merge). A process
    opens each folder once while the plan is in use, and checks its files against their seal
    once (:func:`.plan_seal.check`: a :class:`.plan_store.PlanError` if they do not match)."""
    plan_seal.check(folder)
    st = os.stat(os.path.join(folder, plan_store.HEADER))
    key = (folder, root, id(fields), id(settings), st.st_ino, st.st_mtime_ns)
    plan = _opened.get(key)
    if plan is not None:
        return plan
    header = plan_seal.read_header(folder)
    table = plan_store.SourceTable(folder, header["count"], header["mixed"],
                                   header.get("index") is not None)
    index = None
    if header.get("index") is not None:
        from .sources import ContainerIndex

        shard, refs = table.index_arrays()
        info = header["index"]
        index = ContainerIndex(info["format"], info["files"], shard, refs, info["shard_starts"])
    plan = PackPlan(header["root"] if root is None else root, header["classes"],
                header["class_to_idx"], table, header["bounds"],
                settings or PackSettings(format=header["format"]), header["sharded"], header["skipped"],
                header["layout"], fields, index)
    _opened[key] = plan
    return plan


def shard_bounds(n: int, num_shards: int | None, per_shard: int | None) -> list[int]:
    """Where each of the shards of ``n`` sources starts (and, last, ``n``)."""
    if num_shards is not None:
        if num_shards < 1:
            raise PackOptionError("`num_shards` must be >= 1")
        num_shards = min(num_shards, max(n, 1))
        return [round(k * n / num_shards) for k in range(num_shards + 1)]
    per_shard = max(1, per_shard or n or 1)
    return list(range(0, n, per_shard)) + [n] if n else [0, 0]


def estimate_record_bytes(paths: Sequence[Any], settings: PackSettings,
                          fields: RecordFields | None = None) -> int:
    """Mean bytes a record takes in a shard file (its format's page rounding and index entries
    included, and its side records: masks from ``fields``) over up to SIZE_SAMPLE evenly
    spaced sources (deterministic)."""
    if not paths:
        return 1
    step = max(1, len(paths) // SIZE_SAMPLE)
    stored = backend(settings.format).record_bytes  # page rounding: LMDB's can be 1.6x
    sizes = [stored(len(r.data), _side_bytes(fields, p, r))
             for p, r in ((p, workers.encode_file(p, settings)) for p in paths[::step][:SIZE_SAMPLE])
             if r.data is not None]
    if not sizes:
        return settings.size * settings.size * 4 if settings.size else 1 << 20
    return max(1, int(sum(sizes) / len(sizes)))


def _side_bytes(fields: RecordFields | None, path: str, result: Any) -> dict[str, int]:
    """Bytes of each side record (masks) source ``path``'s record carries; {} without any."""
    schema = fields.schema if fields is not None else None
    if schema is None or not any(f.side for f in schema):
        return {}
    try:
        checked = schema.validate(fields.fields(path, result.height, result.width),
                                  result.height, result.width)
    except FieldError:  # skipped when packed: takes no room
        return {}
    return {f.stream(): len(checked[f.name] or b"") for f in schema if f.side}


def make_plan(scan: Scan, settings: PackSettings, folder: str, *, shard_size: int | None = None,
              num_shards: int | None = None, strict: bool = False, order: str = "mixed",
              layout_seed: int = 0, lister: Any = None, merge_buckets: bool = True
              ) -> PackPlan:
    """Lay a source's records out (``order``) and fix the shard boundaries (see
    :func:`shardkit.pack`), saving the plan in ``folder`` (:mod:`.plan_store`; a scan made by
    :meth:`.sources.Source.scan_into` has its sources there already). ``lister`` runs the
    mixed layout's task (a Dask session's, on a worker; else here). ``merge_buckets`` False:
    the rule's merges are kept as they are (an append places images as the store did)."""
    check_order(order, layout_seed)
    if strict and scan.skipped:  # a folder that cannot be listed hides images: as bad as one
        first = scan.skipped[0]
        raise PackError(f"{first['path']}: {first['reason']} (`strict=True`: no output written)")
    if scan.count is None:  # listed in memory: written out here
        writer = plan_store.SourceWriter(folder)
        try:
            for a in range(0, len(scan.samples), plan_store.CHUNK):
                chunk = scan.samples[a:a + plan_store.CHUNK]
                writer.add([p for p, _ in chunk], [t for _, t in chunk])
        finally:
            writer.close()
        scan.count, scan.samples = writer.count, []
    n = scan.count
    index = scan.index
    table = plan_store.SourceTable(folder, n, False)
    sharded = shard_size is not None or num_shards is not None
    per_shard = None
    if shard_size is not None:
        if shard_size <= 0:
            raise PackOptionError("`shard_size` must be positive")
        picks = range(0, n, max(1, n // SIZE_SAMPLE))[:SIZE_SAMPLE]
        sample = [table.path(i) if index is None else index.item(i) for i in picks]
        per_shard = max(1, shard_size // estimate_record_bytes(
            sample, settings, scan.fields if index is None else None))
    bounds = shard_bounds(n, num_shards, per_shard) if sharded else [0, n]
    if index is not None and sharded:
        bounds = index.snap(bounds)
    layout = None
    # One shard: nothing to mix between shards; a container (tar, parquet) is read in order.
    mixed = order == "mixed" and len(bounds) > 2 and index is None
    if mixed:
        # The one step of planning that holds every source at once (about 40 bytes each):
        # a task of the cluster when there is one (``lister``), so the client's memory does
        # not grow with the sources.
        (lister or _here)(write_mixed_layout, [(folder, n, layout_seed)])
        layout = {"order": "mixed", "seed": layout_seed}
    index_info = None
    if index is not None:
        plan_store.write_array(folder, plan_store.INDEX_SHARD, index.shard, "<i4")
        plan_store.write_array(folder, plan_store.INDEX_REFS, index.refs, plan_store.INDEX_DTYPE)
        index_info = {"format": index.format, "files": list(index.files),
                      "shard_starts": [int(x) for x in index.shard_starts]}
    key = {"settings": settings.as_meta(), "classes": scan.classes, "bounds": bounds,
           "sharded": sharded} | ({"layout": layout} if layout else {})
    plan_seal.write_header(folder, {
        "count": n, "root": scan.root, "classes": scan.classes,
        "class_to_idx": scan.class_to_idx, "bounds": bounds, "sharded": sharded,
        "skipped": scan.skipped, "layout": layout, "mixed": mixed, "format": settings.format,
        "index": index_info, "key": key})
    plan = open_plan(folder, scan.root, scan.fields, settings)
    rule = settings.buckets
    if rule is not None and rule.min_bucket_count and merge_buckets:
        # The merges follow from the sources and the rule (in the key): the plan's settings
        # carry them to every engine and into the stores' metadata.
        from dataclasses import replace

        from .bucket_census import merged

        plan.settings = replace(settings, buckets=merged(plan, rule))
    return plan


def write_mixed_layout(folder: str, n: int, seed: int) -> None:
    """Write the mixed layout of the ``n`` sources in ``folder`` (:func:`.layout.mixed_slots`):
    the source at each slot and, its inverse, the slot of each source."""
    slots = mixed_slots(plan_store.read_array(folder, plan_store.LABELS,
                                              plan_store.LABEL_DTYPE, n), seed)
    plan_store.write_array(folder, plan_store.SLOTS, slots, plan_store.INDEX_DTYPE)
    places = np.empty_like(slots)
    for a in range(0, n, plan_store.CHUNK):  # the inverse, without an n-long arange
        places[slots[a:a + plan_store.CHUNK]] = np.arange(a, min(n, a + plan_store.CHUNK))
    del slots
    plan_store.write_array(folder, plan_store.PLACES, places, plan_store.INDEX_DTYPE)


def _here(fn: Any, args: list[tuple[Any, ...]]) -> list[Any]:
    return [fn(*a) for a in args]
