"""``shardkit.pack``'s keyword shortcuts: each flag of ``shardkit pack`` as a keyword
(``size=``, ``shard_size=``, ``workers=``, ``coco=``...) that builds the record it belongs to
(:mod:`.options`, :mod:`.sources.specs`). A shortcut beside the record it builds is refused
in one line naming both; a shortcut's bad value is refused naming the shortcut.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, TypedDict

from ..errors import PackOptionError
from .buckets import make_spec
from .layout import check_order
from .options import (Buckets, Dask, EngineChoice, Image, Local, Nodes, Resize, Shards,
                      renamed)
from .settings import ENGINES
from .sources import SOURCE_FORMATS
from .sources.specs import (BY_FORMAT, Captions, Coco, Detect, FileList, Metadata, SourceChoice,
                            Video)


class Shortcuts(TypedDict, total=False):
    """The keyword shortcuts of ``shardkit.pack`` and the record each builds."""

    #: ``image=Resize(size, quality, encoding)``: the shorter side (default 256; 0 keeps it)
    size: int | None
    #: JPEG quality 1-100 (:class:`Resize` or :class:`Buckets`)
    quality: int
    #: ``"jpeg"`` or ``"raw"`` (:class:`Resize` or :class:`Buckets`)
    encoding: str
    #: ``image=Buckets(buckets, bucket_step, bucket_upscale, min_bucket_count)``
    buckets: Any
    bucket_step: int | None
    bucket_upscale: bool | None
    min_bucket_count: int | None
    #: ``shards=Shards(size=shard_size, count=num_shards, order, layout_seed)``
    shard_size: int | None
    num_shards: int | None
    order: str
    layout_seed: int
    #: ``engine=Local(workers)`` (or ``Dask(scheduler, retries, workers)`` with
    #: ``engine="dask"``); ``num_nodes``/``node_rank``: ``Nodes(num_nodes, node_rank, ...)``
    workers: int | None
    scheduler: str | None
    retries: int | None
    num_nodes: int
    node_rank: int
    #: ``source=``: ``Coco(coco, coco_masks)``, ``Metadata(metadata_file)``, ``Captions()``,
    #: ``FileList(file_list)``; ``source_format`` names the record of SRC's format
    #: (``WebDataset(image_key, label_key)``, ``HFImageFolder(split)``...)
    coco: str | os.PathLike | None
    coco_masks: bool | None
    metadata_file: str | os.PathLike | None
    captions: bool
    file_list: str | os.PathLike | None
    source_format: str | None
    image_key: str | None
    label_key: str | None
    #: ``WebDataset(id_key=...)``/``Parquet(id_key=...)``: the member or column holding each
    #: record's key (docs/lifecycle.md "Keys")
    id_key: str | None
    split: str | None
    #: ``Video(frames)``: the frames of each video to pack (``'fps=2'``, ``'every=N'``...)
    frames: Any
    #: ``"exact"`` (same packed pixels) or ``"near"`` (perceptual hashes within
    #: ``dedup_threshold`` bits, default 8): a record duplicating one written before it is
    #: skipped (``duplicate of <path>``), every pair listed in ``OUT.dedup.json``
    #: (docs/dedup.md); local engine, one node, no ``resume``
    dedup: str | None
    dedup_threshold: int | None
    #: add the sources the folder store OUT lacks as its next version (:mod:`.append`);
    #: ``"replace"``: only those whose keys it holds, superseding them (``shardkit.update``)
    append: bool | str


SHORTCUTS = tuple(Shortcuts.__annotations__)

#: the records' fields as their shortcuts name them (a shortcut's error names the shortcut)
SHORTCUT_OF = {
    "Resize.size": "size", "Resize.quality": "quality", "Resize.encoding": "encoding",
    "Buckets.rule": "buckets", "Buckets.step": "bucket_step",
    "Buckets.upscale": "bucket_upscale", "Buckets.min_count": "min_bucket_count",
    "Buckets.quality": "quality", "Buckets.encoding": "encoding",
    "Shards.size": "shard_size", "Shards.count": "num_shards", "Shards.order": "order",
    "Shards.layout_seed": "layout_seed", "Local.workers": "workers", "Dask.workers": "workers",
    "Dask.scheduler": "scheduler", "Dask.retries": "retries", "Nodes.count": "num_nodes",
    "Nodes.rank": "node_rank", "Coco.path": "coco", "Coco.masks": "coco_masks",
    "Metadata.path": "metadata_file", "FileList.path": "file_list",
    **{f"{c}.{k}": k for c in ("Detect", "WebDataset", "Parquet", "MDS", "LitData")
       for k in ("image_key", "label_key")},
    **{f"{c}.id_key": "id_key" for c in ("Detect", "WebDataset", "Parquet")},
    "Detect.split": "split", "HFImageFolder.split": "split", "Video.frames": "frames"}


class Records(NamedTuple):
    """What a pack is asked, as records (``source`` None: detected from SRC)."""

    source: SourceChoice | None
    image: Image
    shards: Shards | None
    engine: EngineChoice


def _given(values: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if values.get(n) is not None]


def _conflict(record: str, values: dict[str, Any], names: tuple[str, ...]) -> None:
    given = _given(values, names)
    if given:
        raise PackOptionError(f"give `{record}` or `{given[0]}`, not both")


def records(source: Any = None, image: Any = None, shards: Any = None, engine: Any = None,
            **values: Any) -> Records:
    """The records of ``pack``'s arguments: those given, and those its shortcuts build
    (TypeError for a keyword that is no shortcut; PackOptionError naming the shortcut)."""
    unknown = sorted(set(values) - set(SHORTCUTS))
    if unknown:
        raise TypeError(f"pack() got an unexpected keyword argument {unknown[0]!r}")
    try:
        return Records(_source(source, values), _image(image, values),
                       _shards(shards, values), _engine(engine, values))
    except PackOptionError as exc:
        raise PackOptionError(renamed(str(exc), SHORTCUT_OF)) from None


IMAGE_SHORTCUTS = ("size", "quality", "encoding", "buckets", "bucket_step", "bucket_upscale",
                   "min_bucket_count")


def _image(image: Any, values: dict[str, Any]) -> Image:
    if image is not None:
        _conflict("image", values, IMAGE_SHORTCUTS)
        if not isinstance(image, (Resize, Buckets)):
            raise PackOptionError("`image` must be shardkit.Resize or shardkit.Buckets, not "
                                  f"{image!r}")
        return image
    quality, encoding = values.get("quality", 90), values.get("encoding", "jpeg")
    buckets = values.get("buckets")
    if buckets is None:
        make_spec(None, values.get("bucket_step"), values.get("bucket_upscale"),
                  values.get("min_bucket_count"))  # "`bucket_step` needs `buckets`"
        size = values.get("size")
        return Resize(256 if size is None else size, quality, encoding)
    if values.get("size") is not None:
        raise PackOptionError("give `buckets` or `size`, not both (a bucketed pack sizes each "
                              "image to its bucket)")
    return Buckets(buckets, values.get("bucket_step"), values.get("bucket_upscale"),
                   values.get("min_bucket_count"), quality, encoding)


def _shards(shards: Any, values: dict[str, Any]) -> Shards | None:
    order, seed = values.get("order", "mixed"), values.get("layout_seed", 0)
    if shards is not None:
        _conflict("shards", values, ("shard_size", "num_shards", "order", "layout_seed"))
        if not isinstance(shards, Shards):
            raise PackOptionError(f"`shards` must be shardkit.Shards, not {shards!r}")
        return shards
    size, count = values.get("shard_size"), values.get("num_shards")
    if size is None and count is None:
        check_order(order, seed)  # one file: nothing to lay out, but a bad value is refused
        return None
    return Shards(size, count, order, seed)


ENGINE_SHORTCUTS = ("workers", "scheduler", "retries", "num_nodes", "node_rank")


def _engine(engine: Any, values: dict[str, Any]) -> EngineChoice:
    if engine is not None and not isinstance(engine, str):
        _conflict("engine", {k: v for k, v in values.items()
                             if not (k, v) in (("num_nodes", 1), ("node_rank", 0))},
                  ENGINE_SHORTCUTS)
        if not isinstance(engine, (Local, Dask, Nodes)):
            raise PackOptionError("`engine` must be shardkit.Local, shardkit.Dask or "
                                  f"shardkit.Nodes, or 'local' or 'dask', not {engine!r}")
        return engine
    name = "local" if engine is None else engine
    if name not in ENGINES:
        raise PackOptionError(f"`engine` must be {' or '.join(map(repr, ENGINES))}, "
                              f"not {name!r}")
    workers, scheduler, retries = (values.get(k) for k in ("workers", "scheduler", "retries"))
    if name == "local":
        if retries is not None:
            raise PackOptionError("`retries` needs `engine='dask'`")
        if scheduler is not None:
            raise PackOptionError("`scheduler` needs `engine='dask'`")
        inner: Local | Dask = Local(workers)
    else:
        inner = Dask(scheduler, retries, workers)
    count, rank = values.get("num_nodes", 1), values.get("node_rank", 0)
    if (count, rank) == (1, 0) and not isinstance(count, bool) and not isinstance(rank, bool):
        return inner
    return Nodes(count, rank, inner)


SOURCE_SHORTCUTS = ("coco", "coco_masks", "metadata_file", "captions", "file_list",
                    "source_format", "image_key", "label_key", "id_key", "split", "frames")


def _source(source: Any, values: dict[str, Any]) -> SourceChoice | None:
    given = {k: v for k, v in values.items() if k in SOURCE_SHORTCUTS and v is not None
             and not (k == "captions" and not v)}
    if source is not None:
        _conflict("source", given, SOURCE_SHORTCUTS)
        return source
    specs: list[Any] = []
    if "coco" in given:
        specs.append(Coco(given["coco"], given.get("coco_masks")))
    elif "coco_masks" in given:
        raise PackOptionError("`coco_masks` needs `coco`")
    if "metadata_file" in given:
        specs.append(Metadata(given["metadata_file"]))
    if "captions" in given:
        specs.append(Captions())
    if "file_list" in given:
        specs.append(FileList(given["file_list"]))
    if "frames" in given:
        specs.append(Video(given["frames"]))
    keys = {k: given[k] for k in ("image_key", "label_key", "id_key", "split") if k in given}
    name = given.get("source_format")
    if name is not None:
        if name not in SOURCE_FORMATS:
            raise PackOptionError(f"`source_format` must be one of {', '.join(SOURCE_FORMATS)}, "
                                  f"not {name!r}")
        cls = BY_FORMAT[name]
        own = {k: keys.pop(k) for k in list(keys) if k in cls.__dataclass_fields__}
        specs.append(cls(**own))
    if keys:  # options the named record does not take: its check refuses them
        specs.append(Detect(**keys))
    return None if not specs else specs[0] if len(specs) == 1 else tuple(specs)
