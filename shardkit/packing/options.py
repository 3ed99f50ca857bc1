"""What ``shardkit.pack`` is asked to do, as small typed records: how each image becomes a
record (:class:`Resize` or :class:`Buckets`), how the store is cut (:class:`Shards`) and what
runs the pack (:class:`Local`, :class:`Dask`, :class:`Nodes`). The sources are records too
(:mod:`shardkit.packing.sources.specs`).

Each is frozen and checks its own fields when it is built: a bad value raises
:class:`shardkit.errors.PackOptionError` (an ``OptionError``) naming the field as
``Class.field``. ``pack``'s keyword shortcuts (``size=``, ``shard_size=``, ``workers=``...)
build the same records (:mod:`.shortcuts`), and their errors name the shortcut.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

from ..codec import ENCODINGS
from ..errors import PackOptionError
from .buckets import BucketSpec, make_spec
from .layout import check_order
from .settings import Engine, Order, check_integers

_NAME = re.compile(r"`([A-Za-z_][A-Za-z_.]*)(?=[`=])")


def renamed(message: str, names: dict[str, str]) -> str:
    """``message`` with each parameter name it quotes (```name``` or ```name=value```) that
    is a key of ``names`` replaced by its value."""
    return _NAME.sub(lambda m: "`" + names.get(m.group(1), m.group(1)), message)


def _fields(owner: str, names: tuple[str, ...]) -> dict[str, str]:
    return {n: f"{owner}.{n}" for n in names}


def _check_image(owner: str, quality: Any, encoding: Any) -> None:
    try:
        check_integers(quality=quality)
        if not 1 <= quality <= 100:
            raise PackOptionError("`quality` must be between 1 and 100")
        if encoding not in ENCODINGS:
            raise PackOptionError(f"`encoding` must be one of {', '.join(ENCODINGS)}")
    except PackOptionError as exc:
        raise PackOptionError(renamed(str(exc), _fields(owner, ("quality", "encoding")))
                              ) from None


@dataclass(frozen=True)
class Resize:
    """Each image's shorter side resized to ``size`` (anti-aliased bicubic, never upscaled;
    0 keeps the image's size), then encoded as ``encoding`` (a name of
    ``shardkit.codec.ENCODINGS``: ``"jpeg"`` at ``quality`` 1-100, or ``"raw"`` pixels)."""

    size: int = 256
    quality: int = 90
    encoding: str = "jpeg"

    def __post_init__(self) -> None:
        try:
            check_integers(size=self.size)
            if self.size < 0:
                raise PackOptionError("`size` must be >= 0 (0 keeps the original size)")
        except PackOptionError as exc:
            raise PackOptionError(renamed(str(exc), {"size": "Resize.size"})) from None
        _check_image("Resize", self.quality, self.encoding)


#: Buckets' fields as :func:`.buckets.make_spec` names them (``pack``'s shortcuts)
_BUCKET_SHORTCUTS = {"buckets": "Buckets.rule", "bucket_step": "Buckets.step",
                     "bucket_upscale": "Buckets.upscale", "min_bucket_count": "Buckets.min_count"}


@dataclass(frozen=True)
class Buckets:
    """Aspect-ratio buckets instead of a resize (docs/buckets.md): each image is resized to
    cover the bucket nearest its aspect ratio (never squashed) and centre-cropped to it.

    ``rule``: a side ``N`` (the ``"area"`` rule: buckets of area at most ``N * N``, sides in
    steps of ``step``, ratios 1:4..4:1), a list of ``(height, width)`` sizes, a rule name of
    :data:`shardkit.bucketing.RULES` given by name (``"sdxl"``: SDXL's 40 sizes; ``"kohya"``:
    sd-scripts' ``BucketManager`` with its defaults) or a rule object of
    :mod:`shardkit.bucketing`. ``step``: the sides' step (default 64). ``upscale``: resize an
    image smaller than its bucket up to cover it (None: the rule's default; ``"kohya"`` with
    False is sd-scripts' ``bucket_no_upscale``). ``min_count``: merge each bucket of fewer
    records into its nearest before packing. ``quality``, ``encoding``: as :class:`Resize`'s.
    """

    rule: Any
    step: int | None = None
    upscale: bool | None = None
    min_count: int | None = None
    quality: int = 90
    encoding: str = "jpeg"
    #: the rule these fields make (:class:`shardkit.bucketing.BucketRule`)
    spec: BucketSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rule is None:
            raise PackOptionError("`Buckets.rule` is required: a side, a list of (height, "
                                  "width) sizes, 'sdxl', 'kohya' or a shardkit.bucketing rule")
        try:
            spec = make_spec(self.rule, self.step, self.upscale, self.min_count)
        except PackOptionError as exc:
            raise PackOptionError(renamed(str(exc), _BUCKET_SHORTCUTS)) from None
        _check_image("Buckets", self.quality, self.encoding)
        object.__setattr__(self, "spec", spec)


@dataclass(frozen=True)
class Shards:
    """A folder store of shard files and a ``manifest.json`` instead of one file: shards of
    about ``size`` bytes, or ``count`` shards (one of the two). ``order``: ``"mixed"`` lays
    records out so that every shard holds a uniform mix of classes (a permutation seeded by
    ``layout_seed``; ``ds[i]`` keeps the sources' order), ``"source"`` keeps shards in the
    sources' order (:mod:`shardkit.packing.layout`)."""

    size: int | None = None
    count: int | None = None
    order: Order = "mixed"
    layout_seed: int = 0

    def __post_init__(self) -> None:
        names = _fields("Shards", ("size", "count", "order", "layout_seed"))
        try:
            check_integers(size=self.size, count=self.count)
            if self.size is not None and self.count is not None:
                raise PackOptionError("give `size` or `count`, not both")
            if self.size is None and self.count is None:
                raise PackOptionError("give `size` (bytes a shard) or `count` (shards)")
            if self.count is not None and self.count < 1:
                raise PackOptionError("`count` must be >= 1")
            if self.size is not None and self.size <= 0:
                raise PackOptionError("`size` must be positive")
            check_order(self.order, self.layout_seed)
        except PackOptionError as exc:
            raise PackOptionError(renamed(str(exc), names)) from None


def _check_workers(owner: str, workers: Any) -> None:
    try:
        check_integers(workers=workers)
        if workers is not None and workers < 0:
            raise PackOptionError("`workers` must be >= 0 (0 or 1: in this process)")
    except PackOptionError as exc:
        raise PackOptionError(renamed(str(exc), {"workers": f"{owner}.workers"})) from None


@dataclass(frozen=True)
class Local:
    """Encoding processes on this machine: ``workers`` of them (default: the CPUs this process
    may run on; 0 or 1 encode in this process)."""

    workers: int | None = None

    def __post_init__(self) -> None:
        _check_workers("Local", self.workers)


@dataclass(frozen=True)
class Dask:
    """A task per shard (or per few short shards) on a Dask cluster (needs :class:`Shards` on
    a filesystem the workers share; docs/cluster.md). ``scheduler``: a running scheduler's
    address (``tcp://host:8786``), else a local cluster of ``workers`` processes for the pack.
    ``retries``: how many times a shard whose task raised runs again before the pack stops
    (default 3; a lost worker is rescheduled by Dask itself)."""

    scheduler: str | None = None
    retries: int | None = None
    workers: int | None = None

    def __post_init__(self) -> None:
        names = _fields("Dask", ("scheduler", "retries", "workers"))
        try:
            check_integers(retries=self.retries)
            if self.retries is not None and self.retries < 0:
                raise PackOptionError("`retries` must be >= 0")
            if self.scheduler is not None and self.workers is not None:  # the cluster's pack
                raise PackOptionError("give `workers` (local processes) or `scheduler` (a "
                                      "running cluster's workers), not both")
        except PackOptionError as exc:
            raise PackOptionError(renamed(str(exc), names)) from None
        _check_workers("Dask", self.workers)


@dataclass(frozen=True)
class Nodes:
    """A static split of a sharded pack over ``count`` machines sharing OUT's filesystem: this
    one (``rank``, ``0 <= rank < count``) packs its share with ``engine``, then
    :func:`shardkit.merge` writes the manifest."""

    count: int
    rank: int
    engine: Local | Dask = field(default_factory=Local)

    def __post_init__(self) -> None:
        names = _fields("Nodes", ("count", "rank", "engine"))
        try:
            check_integers(count=self.count, rank=self.rank)
            if not 0 <= self.rank < self.count:
                raise PackOptionError("`rank` must be in 0..`count`-1")
            if not isinstance(self.engine, (Local, Dask)):
                raise PackOptionError(f"`engine` must be shardkit.Local or shardkit.Dask, not "
                                      f"{self.engine!r}")
        except PackOptionError as exc:
            raise PackOptionError(renamed(str(exc), names)) from None


Image = Union[Resize, Buckets]
EngineChoice = Union[Local, Dask, Nodes]


class EngineParts(NamedTuple):
    """An engine record, as the run needs it."""

    name: Engine
    workers: int | None
    scheduler: str | None
    retries: int | None
    num_nodes: int
    node_rank: int


def engine_parts(engine: EngineChoice) -> EngineParts:
    """The run's view of an engine record."""
    num_nodes, node_rank = 1, 0
    if isinstance(engine, Nodes):
        num_nodes, node_rank, engine = engine.count, engine.rank, engine.engine
    if isinstance(engine, Dask):
        return EngineParts("dask", engine.workers, engine.scheduler, engine.retries, num_nodes,
                           node_rank)
    return EngineParts("local", engine.workers, None, None, num_nodes, node_rank)
