"""The plan of a pack, fixed before any pixel is decoded: the ordered sources and the shard
boundaries. Every engine (in-process, local workers, Dask, several nodes each packing their
share) produces the same shards from the same plan."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import metadata
from ..errors import PackError, PackOptionError
from ..fields import FieldError
from ..formats import SUFFIXES, backend
from . import workers
from .layout import check_order, mixed_slots
from .record_fields import RecordFields
from .settings import PackSettings
from .sources import Scan
from .writer import StoreWriter, common_meta, relative_path

SIZE_SAMPLE = 32  # images encoded up front to estimate bytes per record for `shard_size`


@dataclass
class Plan:
    """Sources, shard boundaries and settings: everything that decides the output."""

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    paths: list[str]
    labels: list[int]
    bounds: list[int]  # shard k holds sources bounds[k]:bounds[k+1]
    settings: PackSettings
    sharded: bool
    discovery_skipped: list[dict[str, str]] = field(default_factory=list)
    #: The source (index in the sources' order) written at each slot; None: the sources' order
    #: (see :mod:`shardkit.packing.layout`). ``paths``/``labels`` are in slot order.
    slots: Any = None
    layout: dict[str, Any] | None = None  # the manifest's record of it: {"order", "seed"}

    #: The records' typed fields (:class:`.record_fields.RecordFields`), or None.
    fields: RecordFields | None = None
    #: A container source's index (:class:`.sources.ContainerIndex`); None: image files.
    index: Any = None

    @property
    def num_shards(self) -> int:
        return len(self.bounds) - 1

    def plan_id(self) -> str:
        h = hashlib.sha256()
        h.update(metadata.dumps({"settings": self.settings.as_meta(), "classes": self.classes,
                                 "bounds": self.bounds, "sharded": self.sharded}
                                | ({"layout": self.layout} if self.layout else {})))
        if self.fields is not None:
            h.update(self.fields.plan_key().encode())
        for path, label in zip(self.paths, self.labels):
            h.update(os.fsencode(self.relpath(path)) + b"\0" + str(label).encode() + b"\n")
        return h.hexdigest()

    def item(self, i: int) -> Any:
        """What an encoding worker reads for slot ``i``: a file path, or a container member."""
        if self.index is None:
            return self.paths[i]
        return self.index.item(self.source_index(i))

    def source_index(self, i: int) -> int:
        """The position in the source's own order of the record written at slot ``i``."""
        return i if self.slots is None else int(self.slots[i])

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
                           buckets=s.buckets)


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


def make_plan(scan: Scan, settings: PackSettings, *, shard_size: int | None = None,
              num_shards: int | None = None, strict: bool = False, order: str = "mixed",
              layout_seed: int = 0) -> Plan:
    """Lay a source's records out (``order``) and fix the shard boundaries (see
    :func:`shardkit.pack`)."""
    check_order(order, layout_seed)
    if strict and scan.skipped:  # a folder that cannot be listed hides images: as bad as one
        first = scan.skipped[0]
        raise PackError(f"{first['path']}: {first['reason']} (`strict=True`: no output written)")
    paths = [p for p, _ in scan.samples]
    labels = [t for _, t in scan.samples]
    index = scan.index
    sharded = shard_size is not None or num_shards is not None
    per_shard = None
    if shard_size is not None:
        if shard_size <= 0:
            raise PackOptionError("`shard_size` must be positive")
        per_shard = max(1, shard_size // estimate_record_bytes(
            paths if index is None else index.items(), settings,
            scan.fields if index is None else None))
    bounds = shard_bounds(len(paths), num_shards, per_shard) if sharded else [0, len(paths)]
    if index is not None and sharded:
        bounds = index.snap(bounds)
    slots, layout = None, None
    # One shard: nothing to mix between shards; a container (tar, parquet) is read in order.
    if order == "mixed" and len(bounds) > 2 and index is None:
        slots = mixed_slots(labels, layout_seed)
        paths = [paths[i] for i in slots.tolist()]
        labels = [labels[i] for i in slots.tolist()]
        layout = {"order": "mixed", "seed": layout_seed}
    return Plan(scan.root, scan.classes, scan.class_to_idx, paths, labels, bounds, settings,
                sharded, scan.skipped, slots, layout, scan.fields, index)
