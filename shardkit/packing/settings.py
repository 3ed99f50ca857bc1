"""How each image is transformed (:class:`PackSettings`), and the small records the packer passes
around: :class:`Skipped` (a source left out, and why)."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from ..codec import ENCODINGS
from ..errors import PackOptionError
from ..formats import DEFAULT_FORMAT, FORMATS
from .buckets import BucketSpec
from .imaging import PILLOW_PIXEL_LIMIT

Engine = Literal["local", "dask"]
ENGINES: tuple[Engine, ...] = ("local", "dask")
Order = Literal["mixed", "source"]  # a sharded store's record layout (packing.layout)
ORDERS: tuple[Order, ...] = ("mixed", "source")
Kind = Literal["single", "shard"]  # a whole single-file store, or one shard of a folder store
KINDS: tuple[Kind, ...] = ("single", "shard")


@dataclass(frozen=True)
class PackSettings:
    """How each image is transformed; stored verbatim in the metadata."""

    size: int = 256
    quality: int = 90
    encoding: str = "jpeg"  # a name in shardkit.codec.ENCODINGS
    format: str = DEFAULT_FORMAT  # a name in shardkit.formats.FORMATS
    max_pixels: int = PILLOW_PIXEL_LIMIT
    #: Aspect-ratio buckets (:mod:`.buckets`; ``size`` is then 0), or None.
    buckets: BucketSpec | None = None
    #: The hash each worker computes for ``pack(dedup=...)`` ("exact", "near"), or None.
    dedup: str | None = None
    #: The source column or member whose value is each record's key (``id_key``), or None:
    #: keys are source paths. Recorded, so an append keys its records the same way.
    id_key: str | None = None

    def as_meta(self) -> dict[str, Any]:
        meta = {"size": self.size, "quality": self.quality, "encoding": self.encoding,
                "format": self.format, "max_pixels": self.max_pixels, "resample": "bicubic",
                "alpha_background": "white", "chroma_subsampling": "4:2:0"}
        meta |= {"buckets": self.buckets.as_meta()} if self.buckets is not None else {}
        return meta | ({"id_key": self.id_key} if self.id_key is not None else {})

    def validate(self) -> None:
        """Raise PackOptionError (a PackError and ValueError) naming the parameter that is out
        of range."""
        check_integers(size=self.size, quality=self.quality, max_pixels=self.max_pixels)
        if self.size < 0:
            raise PackOptionError("`size` must be >= 0 (0 keeps the original size)")
        if not 1 <= self.quality <= 100:
            raise PackOptionError("`quality` must be between 1 and 100")
        if self.encoding not in ENCODINGS:
            raise PackOptionError(f"`encoding` must be one of {', '.join(ENCODINGS)}")
        if self.format not in FORMATS:
            raise PackOptionError(f"`format` must be one of {', '.join(FORMATS)}")
        if self.max_pixels < 0:
            raise PackOptionError("`max_pixels` must be >= 0 (0 disables the limit)")


def check_integers(**values: Any) -> None:
    """Refuse a parameter that is not an integer (None passes: the option is not given), naming
    it, before a comparison could fail with a TypeError that names nothing."""
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not _is_integer(value)):
            raise PackOptionError(f"`{name}` must be an integer, not {value!r}")


def _is_integer(value: Any) -> bool:
    try:
        operator.index(value)  # int and numpy integers; not float, str
    except TypeError:
        return False
    return True


class Skipped(NamedTuple):
    """A source that is not in the store, and why; stored as ``{"path": ..., "reason": ...}``."""

    path: str
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}
