"""The plan of a pack, fixed before any pixel is decoded: the ordered sources and the shard
boundaries. Every engine (in-process, local workers, Dask, several nodes each packing their
share) produces the same shards from the same plan."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from .. import metadata
from ..errors import PackError, PackOptionError
from ..fields import FieldError
from ..formats import SUFFIXES, backend
from . import workers
from .discovery import Discovery, discover, read_file_list
from .sources.plan import discover_container
from .layout import check_order, mixed_slots
from .settings import PackSettings
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

    #: Where each record's typed fields come from (e.g. :class:`.coco.CocoSource`: ``schema``,
    #: ``meta()``, ``plan_key()``, ``fields(path, height, width)``), or None. Set by ``pack``.
    annotations: ClassVar[Any] = None
    #: A container source's index (:mod:`shardkit.packing.sources`); None: image files.
    container: Any = None

    @property
    def num_shards(self) -> int:
        return len(self.bounds) - 1

    def plan_id(self) -> str:
        h = hashlib.sha256()
        h.update(metadata.dumps({"settings": self.settings.as_meta(), "classes": self.classes,
                                 "bounds": self.bounds, "sharded": self.sharded}
                                | ({"layout": self.layout} if self.layout else {})))
        if self.annotations is not None:
            h.update(self.annotations.plan_key().encode())
        for path, label in zip(self.paths, self.labels):
            h.update(os.fsencode(self.relpath(path)) + b"\0" + str(label).encode() + b"\n")
        return h.hexdigest()

    def item(self, i: int) -> Any:
        """What an encoding worker reads for slot ``i``: a file path, or a container member."""
        if self.container is None:
            return self.paths[i]
        return self.container.item(i if self.slots is None else int(self.slots[i]))

    def relpath(self, path: str) -> str:
        return relative_path(self.root, path)

    def shard_file(self, k: int) -> str:
        return f"shard-{k:05d}{SUFFIXES[self.settings.format]}"

    def common_meta(self) -> dict[str, Any]:
        a = self.annotations
        return common_meta(self.classes, self.class_to_idx, self.settings, self.root,
                           a.schema if a is not None else None, a.meta() if a is not None else None)

    def shard_writer(self, k: int, path: str) -> StoreWriter:
        """A writer for shard ``k`` straight to ``path`` (the whole store if not sharded)."""
        s = self.settings
        return StoreWriter(path, self.classes, format=s.format, encoding=s.encoding, size=s.size,
                           quality=s.quality, max_pixels=s.max_pixels,
                           class_to_idx=self.class_to_idx, source_root=self.root,
                           kind="shard" if self.sharded else "single", install=False,
                           shard_index=k, first_source=self.bounds[k],
                           skipped=() if self.sharded else self.discovery_skipped,
                           schema=self.annotations.schema if self.annotations else None,
                           extra_meta=self.annotations.meta() if self.annotations else None)


def shard_bounds(n: int, num_shards: int | None, per_shard: int | None) -> list[int]:
    """Where each of the shards of ``n`` sources starts (and, last, ``n``)."""
    if num_shards is not None:
        if num_shards < 1:
            raise PackOptionError("`num_shards` must be >= 1")
        num_shards = min(num_shards, max(n, 1))
        return [round(k * n / num_shards) for k in range(num_shards + 1)]
    per_shard = max(1, per_shard or n or 1)
    return list(range(0, n, per_shard)) + [n] if n else [0, 0]


def estimate_record_bytes(paths: Sequence[str], settings: PackSettings,
                          annotations: Any = None) -> int:
    """Mean bytes a record takes in a shard file (its format's page rounding and index entries
    included, and its side records: masks from ``annotations``) over up to SIZE_SAMPLE evenly
    spaced sources (deterministic)."""
    if not paths:
        return 1
    step = max(1, len(paths) // SIZE_SAMPLE)
    stored = backend(settings.format).record_bytes  # page rounding: LMDB's can be 1.6x
    sizes = [stored(len(r.data), _side_bytes(annotations, p, r))
             for p, r in ((p, workers.encode_file(p, settings)) for p in paths[::step][:SIZE_SAMPLE])
             if r.data is not None]
    if not sizes:
        return settings.size * settings.size * 4 if settings.size else 1 << 20
    return max(1, int(sum(sizes) / len(sizes)))


def _side_bytes(annotations: Any, path: str, result: Any) -> dict[str, int]:
    """Bytes of each side record (masks) source ``path``'s record carries; {} without any."""
    schema = annotations.schema if annotations is not None else None
    if schema is None or not any(f.side for f in schema):
        return {}
    try:
        checked = schema.validate(annotations.fields(path, result.height, result.width),
                                  result.height, result.width)
    except FieldError:  # skipped when packed: takes no room
        return {}
    return {f.stream(): len(checked[f.name] or b"") for f in schema if f.side}


def make_plan(src: str, settings: PackSettings, *, allow_empty: bool = False,
              file_list: str | None = None, source_format: str | None = None,
              source_options: Any = None, shard_size: int | None = None,
              num_shards: int | None = None, strict: bool = False, annotations: Any = None,
              order: str = "mixed", layout_seed: int = 0) -> Plan:
    """Find the sources, lay them out (``order``) and fix the shard boundaries (see
    :func:`shardkit.pack`)."""
    check_order(order, layout_seed)
    container_found, container = discover_container(src, source_format, source_options)
    if container is not None:
        found: Discovery = container_found
    elif annotations is not None:  # e.g. a COCO file: its images, in its order
        found = annotations.discovery()
    else:
        found = read_file_list(file_list, src) if file_list else discover(src, allow_empty)
    if strict and found.skipped:  # a folder that cannot be listed hides images: as bad as one
        first = found.skipped[0]
        raise PackError(f"{first['path']}: {first['reason']} (`strict=True`: no output written)")
    paths = [p for p, _ in found.samples]
    labels = [t for _, t in found.samples]
    sharded = shard_size is not None or num_shards is not None
    per_shard = None
    if shard_size is not None:
        if shard_size <= 0:
            raise PackOptionError("`shard_size` must be positive")
        per_shard = max(1, shard_size // estimate_record_bytes(
            paths if container is None else container.items(), settings,
            annotations if container is None else None))
    bounds = shard_bounds(len(paths), num_shards, per_shard) if sharded else [0, len(paths)]
    if container is not None and sharded:
        bounds = container.snap(bounds)
    slots, layout = None, None
    # One shard: nothing to mix between shards; a container (tar, parquet) is read in order.
    if order == "mixed" and len(bounds) > 2 and container is None:
        slots = mixed_slots(labels, layout_seed)
        paths = [paths[i] for i in slots.tolist()]
        labels = [labels[i] for i in slots.tolist()]
        layout = {"order": "mixed", "seed": layout_seed}
    plan = Plan(found.root, found.classes, found.class_to_idx, paths, labels, bounds, settings,
                sharded, found.skipped, slots, layout)
    plan.container = container
    return plan
