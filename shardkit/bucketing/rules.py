"""The bucket rules: which bucket an image goes to, what size it is resized to, where it is cut.

Every rule places an EXIF-oriented ``height`` x ``width`` source (:meth:`BucketRule.place`) as a
:class:`Placement`: resized (one scale factor, never squashed) so that it covers its bucket,
then cut to the bucket at ``(top, left)``. All sizes are (height, width).

* ``"area"`` (:class:`AreaRule`, ``buckets=1024``): shardkit's set on an area of ``side *
  side``, widths in steps up to ``2 * side``, the largest height in steps within the area,
  ratios within 1:4..4:1 (kohya's ``make_bucket_resolutions((side, side), side / 2, 2 * side,
  step)``); the nearest ``w / h``; resized to cover with the binding side exact and the other
  rounded up; torchvision v2 ``CenterCrop``'s anchor. A source smaller than its bucket keeps its
  own size cut to the step unless ``upscale``.
* ``"list"`` (:class:`ListRule`): the same with sizes of your own.
* ``"kohya"`` (:class:`KohyaRule`): sd-scripts' ``BucketManager`` (:mod:`.kohya`): its bucket
  set from ``resolution``, ``min_bucket_reso``, ``max_bucket_reso`` and ``bucket_reso_steps``
  and its selection, resize and centre trim; with ``bucket_no_upscale`` its ad-hoc buckets
  (a source over the area resized to the area at its own ratio, each side cut to the step).
* ``"sdxl"`` (:class:`SDXLRule`): SDXL's 40 training sizes, selected and resized as
  sd-scripts does for predefined sizes (nearest ``w / h``; always resized, up or down).

A rule may carry ``merged``: buckets that held fewer than ``min_bucket_count`` records when the
store was packed, each with the bucket its records went to instead (:mod:`.merge`); a source
whose bucket is merged is resized to cover the other bucket and centre-cut with the rule's
arithmetic (:meth:`BucketRule.fit`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from ..errors import PackOptionError
from . import kohya

MAX_RATIO = 4  # the area rule's aspect ratios lie within 1:4..4:1
DEFAULT_STEP = 64

#: SDXL's 40 training sizes, (width, height), in the order SDXL tools list them (the paper's
#: appendix): sd-scripts, given them as predefined sizes, breaks a tie by this order.
SDXL_LISTED: tuple[tuple[int, int], ...] = (
    (512, 2048), (512, 1984), (512, 1920), (512, 1856), (576, 1792), (576, 1728), (576, 1664),
    (640, 1600), (640, 1536), (704, 1472), (704, 1408), (704, 1344), (768, 1344), (768, 1280),
    (832, 1216), (832, 1152), (896, 1152), (896, 1088), (960, 1088), (960, 1024), (1024, 1024),
    (1024, 960), (1088, 960), (1088, 896), (1152, 896), (1152, 832), (1216, 832), (1280, 768),
    (1344, 768), (1408, 704), (1472, 704), (1536, 640), (1600, 640), (1664, 576), (1728, 576),
    (1792, 576), (1856, 512), (1920, 512), (1984, 512), (2048, 512))
#: The same sizes as (height, width), sorted.
SDXL_SIZES: tuple[tuple[int, int], ...] = tuple(sorted((h, w) for w, h in SDXL_LISTED))


class TooSmall(ValueError):
    """No bucket holds the image (a side under the step); the message is the reason."""


class Placement(NamedTuple):
    """Where one source lands: its oriented size, the size it is resized to (its own: not
    resized), the crop's top-left corner in that, and the bucket (the stored size). All
    (height, width)."""

    original: tuple[int, int]
    resized: tuple[int, int]
    top: int
    left: int
    size: tuple[int, int]


def area_sizes(side: int, step: int) -> list[tuple[int, int]]:
    """The area rule's set for ``side * side`` pixels, sorted (height, width) pairs."""
    area = side * side
    out = set()
    for w in range(step, 2 * side + 1, step):
        h = area // (w * step) * step  # the largest multiple of step with w * h <= area
        if h >= step and w <= MAX_RATIO * h and h <= MAX_RATIO * w:
            out.update(((h, w), (w, h)))
    return sorted(out)


def cover(height: int, width: int, bh: int, bw: int) -> tuple[int, int]:
    """The (height, width) an image is resized to, one scale factor, so that it covers
    ``bh`` x ``bw``: the binding side exact, the other rounded up."""
    if bh * width >= bw * height:  # bh / height >= bw / width: the height binds
        return bh, -(-width * bh // height)
    return -(-height * bw // width), bw


def center_anchor(resized: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """v2 ``CenterCrop``'s (top, left) for a crop of ``size`` from ``resized``."""
    return (int(round((resized[0] - size[0]) / 2.0)), int(round((resized[1] - size[1]) / 2.0)))


class BucketRule:
    """What every rule offers (see the module docstring). Subclasses are frozen dataclasses
    with ``name``, ``step``, ``upscale``, ``sizes`` (the candidate buckets, sorted (height,
    width); empty where buckets are made per image), ``area`` (no bucket is larger, in pixels,
    give or take a step's rounding for kohya's ad-hoc buckets) and ``merged``."""

    name: str = ""
    step: int = DEFAULT_STEP
    upscale: bool = True
    sizes: tuple[tuple[int, int], ...] = ()
    area: int = 0
    merged: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = ()
    min_bucket_count: int = 0  # 0: no merging asked for

    def params(self) -> dict[str, Any]:
        """The rule's own parameters, as the metadata records them."""
        raise NotImplementedError

    def select(self, height: int, width: int) -> Placement:
        """The rule's placement, before any merge."""
        raise NotImplementedError

    def fit(self, height: int, width: int, bucket: tuple[int, int]) -> Placement:
        """A source resized to cover ``bucket`` and cut to it with this rule's arithmetic."""
        raise NotImplementedError

    def as_meta(self) -> dict[str, Any]:
        meta = {"rule": self.name, **self.params()}
        if self.min_bucket_count:
            meta["min_bucket_count"] = self.min_bucket_count
            meta["merged"] = [[list(a), list(b)] for a, b in self.merged]
        return meta

    def place(self, height: int, width: int) -> Placement:
        """Where an oriented ``height`` x ``width`` source lands (TooSmall: nowhere)."""
        place = self.select(height, width)
        if self.merged:
            into = dict(self.merged).get(place.size)
            if into is not None:
                return self.fit(height, width, into)
        return place

    def with_merged(self, merged: Any, min_bucket_count: int | None = None) -> BucketRule:
        """This rule with buckets merged (``[(small, into), ...]``) for ``min_bucket_count``."""
        count = self.min_bucket_count if min_bucket_count is None else min_bucket_count
        return replace(self, merged=tuple((tuple(a), tuple(b)) for a, b in merged),
                       min_bucket_count=count)

    def admits(self, height: int, width: int) -> bool:
        """Whether a stored size can be one of this rule's buckets (a metadata check)."""
        if self.sizes and (height, width) in self.sizes:
            return True
        return (height * width <= self.area and not height % self.step
                and not width % self.step)

    def decode_size(self, width: int, height: int) -> int:
        """The shorter side a decode must keep for a file of ``width`` x ``height`` before EXIF
        orientation (read after the pixels): the larger need of either orientation. 0: decode
        at full size."""
        need = 0
        for h, w in ((height, width), (width, height)):
            try:
                place = self.place(h, w)
            except TooSmall:
                return 0
            if place.resized == place.original:
                return 0
            need = max(need, min(place.resized))
        return need


def _too_small(height: int, width: int, step: int, hint: str) -> TooSmall:
    return TooSmall(f"image {width}x{height} has a side under the bucket step {step}: no "
                    f"bucket holds it{hint}")


@dataclass(frozen=True)
class _Nearest(BucketRule):
    """The area and list rules: a set of sizes, the nearest ``w / h``, cover and v2's anchor."""

    def nearest(self, height: int, width: int) -> tuple[int, int]:
        """The bucket whose ``w / h`` is nearest the image's (absolute difference, kohya's
        measure; ties: the first in (h, w) order)."""
        ratios = self.__dict__.get("_ratio_cache")
        if ratios is None:
            ratios = np.array([w / h for h, w in self.sizes])
            object.__setattr__(self, "_ratio_cache", ratios)
        return self.sizes[int(np.argmin(np.abs(ratios - width / height)))]

    def select(self, height: int, width: int) -> Placement:
        bh, bw = self.nearest(height, width)
        if self.upscale or (height >= bh and width >= bw):
            return self.fit(height, width, (bh, bw))
        # not upscaled: its own size in steps, never past the bucket's sides
        bh, bw = min(height - height % self.step, bh), min(width - width % self.step, bw)
        if not bh or not bw:
            raise _too_small(height, width, self.step, " (`bucket_upscale=True` upscales it)")
        top, left = center_anchor((height, width), (bh, bw))
        return Placement((height, width), (height, width), top, left, (bh, bw))

    def fit(self, height: int, width: int, bucket: tuple[int, int]) -> Placement:
        resized = cover(height, width, *bucket)
        top, left = center_anchor(resized, bucket)
        return Placement((height, width), resized, top, left, tuple(bucket))


@dataclass(frozen=True)
class AreaRule(_Nearest):
    """shardkit's rule on an area of ``side * side`` (``buckets=1024``)."""

    side: int = 1024
    step: int = DEFAULT_STEP
    upscale: bool = False
    merged: tuple = ()
    min_bucket_count: int = 0
    name: str = field(default="area", init=False)
    sizes: tuple = field(default=(), init=False)
    area: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        _check_step(self.step)
        if not is_int(self.side) or self.side < self.step:
            raise PackOptionError(f"`buckets` must be a side of at least `bucket_step` "
                                  f"({self.step}), not {self.side!r}")
        _check_upscale(self.upscale)
        object.__setattr__(self, "side", int(self.side))
        object.__setattr__(self, "step", int(self.step))
        object.__setattr__(self, "sizes", tuple(area_sizes(self.side, self.step)))
        object.__setattr__(self, "area", self.side * self.side)

    def params(self) -> dict[str, Any]:
        return {"side": self.side, "area": self.area, "step": self.step, "upscale": self.upscale}


@dataclass(frozen=True)
class ListRule(_Nearest):
    """The area rule's placement over a list of (height, width) sizes of your own."""

    candidates: tuple = ()
    step: int = DEFAULT_STEP
    upscale: bool = False
    merged: tuple = ()
    min_bucket_count: int = 0
    name: str = field(default="list", init=False)
    sizes: tuple = field(default=(), init=False)
    area: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        _check_step(self.step)
        _check_upscale(self.upscale)
        object.__setattr__(self, "step", int(self.step))
        found = set()
        for size in self.candidates:
            pair = tuple(size) if isinstance(size, (list, tuple)) else ()
            if len(pair) != 2 or not all(is_int(v) and v >= 1 for v in pair):
                raise PackOptionError(f"`buckets` sizes must be (height, width) pairs of "
                                      f"positive integers, not {size!r}")
            found.add((int(pair[0]), int(pair[1])))
        if not found:
            raise PackOptionError("`buckets` must list at least one (height, width) size")
        object.__setattr__(self, "sizes", tuple(sorted(found)))
        object.__setattr__(self, "candidates", self.sizes)
        object.__setattr__(self, "area", max(h * w for h, w in self.sizes))

    def params(self) -> dict[str, Any]:
        return {"area": self.area, "step": self.step, "upscale": self.upscale,
                "candidates": [list(s) for s in self.sizes]}

    def admits(self, height: int, width: int) -> bool:
        return height * width <= self.area


@dataclass(frozen=True)
class _Kohya(BucketRule):
    """sd-scripts' selection over predefined sizes (:meth:`predefined`), its resize and its
    centre trim."""

    def predefined(self) -> list[tuple[int, int]]:
        """The sizes as sd-scripts holds them: (width, height), in its order."""
        return sorted((w, h) for h, w in self.sizes)  # make_bucket_resolutions sorts them

    def _listed(self) -> tuple[list, np.ndarray, frozenset]:
        cached = self.__dict__.get("_listed_cache")
        if cached is None:
            resos = self.predefined()
            cached = (resos, np.array([w / h for w, h in resos]), frozenset(resos))
            object.__setattr__(self, "_listed_cache", cached)
        return cached

    def select(self, height: int, width: int) -> Placement:
        reso, resized = kohya.select_listed(*self._listed(), width, height)
        return _placed(height, width, reso, resized)

    def fit(self, height: int, width: int, bucket: tuple[int, int]) -> Placement:
        reso = (bucket[1], bucket[0])
        return _placed(height, width, reso, kohya.resize_to(reso, width, height))


def _placed(height: int, width: int, reso: tuple[int, int], resized: tuple[int, int]
            ) -> Placement:
    """A placement from sd-scripts' (width, height) bucket and resized size."""
    left, top = kohya.trim_offsets(resized, reso)
    return Placement((height, width), (resized[1], resized[0]), top, left, (reso[1], reso[0]))


@dataclass(frozen=True)
class KohyaRule(_Kohya):
    """sd-scripts' ``BucketManager`` with its options' names and defaults (``--resolution``
    is (width, height) or one side; sd-scripts has no default: 1024, SDXL's)."""

    resolution: Any = 1024
    min_bucket_reso: int = 256
    max_bucket_reso: int = 1024
    bucket_reso_steps: int = 64
    bucket_no_upscale: bool = False
    merged: tuple = ()
    min_bucket_count: int = 0
    name: str = field(default="kohya", init=False)
    step: int = field(default=DEFAULT_STEP, init=False)
    upscale: bool = field(default=True, init=False)
    sizes: tuple = field(default=(), init=False)
    area: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        res = self.resolution
        res = (res, res) if is_int(res) else tuple(res) if isinstance(res, (list, tuple)) else ()
        if len(res) != 2 or not all(is_int(v) and v >= 1 for v in res):
            raise PackOptionError(f"`resolution` must be a side or a (width, height) pair of "
                                  f"positive integers, not {self.resolution!r}")
        steps = self.bucket_reso_steps
        if not is_int(steps) or steps < 1:
            raise PackOptionError(f"`bucket_reso_steps` must be a positive integer, not "
                                  f"{steps!r}")
        for name in ("min_bucket_reso", "max_bucket_reso"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise PackOptionError(f"`{name}` must be a positive integer, not "
                                      f"{getattr(self, name)!r}")
        if not isinstance(self.bucket_no_upscale, bool):
            raise PackOptionError(f"`bucket_no_upscale` must be True or False, not "
                                  f"{self.bucket_no_upscale!r}")
        low, high = kohya.adjust_min_max(self.min_bucket_reso, self.max_bucket_reso, steps)
        if min(res) < low or max(res) > high or high < low:
            raise PackOptionError(f"`min_bucket_reso` ({low}) and `max_bucket_reso` ({high}) "
                                  f"must bound the resolution {res[0]}x{res[1]} (sd-scripts' "
                                  "rule)")
        set_ = object.__setattr__
        set_(self, "resolution", (int(res[0]), int(res[1])))
        set_(self, "min_bucket_reso", low)
        set_(self, "max_bucket_reso", high)
        set_(self, "step", int(steps))
        set_(self, "upscale", not self.bucket_no_upscale)
        set_(self, "area", res[0] * res[1])
        if not self.bucket_no_upscale:
            made = kohya.make_resolutions(res, low, high, steps)
            set_(self, "sizes", tuple(sorted((h, w) for w, h in made)))

    def params(self) -> dict[str, Any]:
        return {"resolution": list(self.resolution), "min_bucket_reso": self.min_bucket_reso,
                "max_bucket_reso": self.max_bucket_reso,
                "bucket_reso_steps": self.bucket_reso_steps,
                "bucket_no_upscale": self.bucket_no_upscale}

    def select(self, height: int, width: int) -> Placement:
        if not self.bucket_no_upscale:
            return super().select(height, width)
        try:
            reso, resized = kohya.select_no_upscale(self.area, self.step, width, height)
        except ZeroDivisionError:
            reso = (0, 0)
        if not reso[0] or not reso[1]:
            raise _too_small(height, width, self.step, " (sd-scripts' bucket_no_upscale)")
        return _placed(height, width, reso, resized)

    def admits(self, height: int, width: int) -> bool:
        if not self.bucket_no_upscale:
            return (height, width) in self.sizes
        # an ad-hoc bucket: the area at the image's ratio, a side rounded up by up to a step
        return (not height % self.step and not width % self.step
                and height * width <= self.area + self.step * (height + width))


@dataclass(frozen=True)
class SDXLRule(_Kohya):
    """SDXL's 40 training sizes (:data:`SDXL_SIZES`), selected and resized as sd-scripts does
    for predefined sizes; every image is resized to one of them, up or down."""

    merged: tuple = ()
    min_bucket_count: int = 0
    name: str = field(default="sdxl", init=False)
    sizes: tuple = field(default=SDXL_SIZES, init=False)
    area: int = field(default=1024 * 1024, init=False)

    def params(self) -> dict[str, Any]:
        return {}

    def predefined(self) -> list[tuple[int, int]]:
        return list(SDXL_LISTED)

    def admits(self, height: int, width: int) -> bool:
        return (height, width) in self.sizes


def _check_step(step: Any) -> None:
    if not is_int(step) or step < 1:
        raise PackOptionError(f"`bucket_step` must be a positive integer, not {step!r}")


def _check_upscale(upscale: Any) -> None:
    if not isinstance(upscale, bool):
        raise PackOptionError(f"`bucket_upscale` must be True or False, not {upscale!r}")


def is_int(value: Any) -> bool:
    """An integer of any integral type, not a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True
