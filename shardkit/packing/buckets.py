"""Aspect-ratio buckets at pack time: each image is stored at the resolution it trains at.

The bucket set (``buckets=N``, rule ``"kohya"``), on an area of ``N * N`` pixels: for every width
``w`` that is a multiple of ``step`` from ``step`` up to ``2 * N``, the height is the largest
multiple of ``step`` with ``w * h <= N * N``; ``(h, w)`` and ``(w, h)`` are both buckets, kept
when the aspect ratio lies within 1:4..4:1 (that bound, not a minimum side, is what limits the
sides: from ``N / 2`` to ``2 * N``). Where ``N`` is a multiple of ``2 * step`` this is exactly
kohya sd-scripts' ``make_bucket_resolutions((N, N), min_size=N / 2, max_size=2 * N,
divisible=step)`` (not its defaults, 256 and 1024). For 1024 and step 64: 33 sizes from 512x2048
to 2048x512, 33 of the 40 sizes SDXL lists (without its 960x1024, 1024x960, 896x1088,
1088x896, 832x1152, 1152x832 and 1344x704, height x width), so an image nearest one of those
ratios lands in a neighbour. An explicit list of ``(height, width)`` sizes (rule ``"list"``)
replaces the set: SDXL's own list, say.

Assignment (:meth:`BucketSpec.place`), on the EXIF-oriented source of ``height`` x ``width``:

1. The bucket whose aspect ratio is nearest: the absolute difference of the ``width / height``
   ratios (``|bw / bh - W / H|``), as kohya's ``BucketManager.select_bucket`` measures it; a tie
   goes to the first in ``(h, w)`` order (kohya's: the first in its ``(w, h)`` order).
2. The image is resized, never squashed, so that it covers the bucket: one scale factor, the
   smallest that makes both sides at least the bucket's. In integers: the side that binds
   becomes the bucket's exactly and the other ``ceil`` of the scaled side (so it always covers).
   The resize is the packer's (:mod:`.resize`: anti-aliased bicubic).
3. Centre crop to the bucket with torchvision v2 ``CenterCrop``'s anchor,
   ``int(round((resized - bucket) / 2.0))`` per side (Python's round, half to even: a 3-pixel
   excess starts the crop at 2, not 1). So the record is ``v2.Resize(size=(rh, rw))`` followed
   by ``v2.CenterCrop((bh, bw))`` of the oriented source, and boxes and masks move with exactly
   that arithmetic (:mod:`shardkit.fields.geometry`; :class:`BucketFields`).
4. No upscaling (the default): a source smaller than its bucket on either side is not resized;
   it is centre-cropped to its own size cut down to multiples of ``step`` (and to the bucket's
   side where it is larger there: a record is never larger than the bucket it was assigned), a
   bucket of its own. A source under ``step`` on a side is skipped with the reason.
   ``upscale=True`` resizes it up to cover its bucket instead. This is not kohya's
   ``bucket_no_upscale``, which never resizes a source of at most ``N * N`` pixels but cuts
   each side down to the step (this rule's record has that size where it fits inside the
   source's bucket; otherwise a side is cut to the bucket's, or a source at least its bucket's
   size is resized to cover it), and gives a larger source a bucket of its own (resized to the
   area at its own ratio, each side cut down to the step), where this rule resizes it to cover
   the nearest bucket.

Per record the store keeps ``original_size`` (the oriented source's (height, width)),
``crop_top_left`` ((top, left) of the crop in the resized image, as diffusers' SDXL training
script computes it for its centre crop; kohya's ``get_crop_ltrb`` gives other values: the offset
of the image fitted inside the bucket) and ``target_size`` (the bucket): SDXL's
micro-conditioning inputs. The store's metadata ``buckets`` lists the buckets that hold
records and how many (:mod:`shardkit.bucketmeta`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import PackError, PackOptionError
from .record_fields import RecordFields

RULES = ("kohya", "list")
MAX_RATIO = 4  # aspect ratios within 1:4..4:1
DEFAULT_STEP = 64
#: The per-record fields of a bucketed store (int32 (height, width) / (top, left) pairs).
BUCKET_FIELDS = ("original_size", "crop_top_left", "target_size")


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


def kohya_sizes(side: int, step: int) -> list[tuple[int, int]]:
    """The bucket set for an area of ``side * side`` (see the module docstring), sorted
    (height, width) pairs."""
    area = side * side
    out = set()
    for w in range(step, 2 * side + 1, step):
        h = area // (w * step) * step  # the largest multiple of step with w * h <= area
        if h >= step and w <= MAX_RATIO * h and h <= MAX_RATIO * w:
            out.update(((h, w), (w, h)))
    return sorted(out)


def cover(height: int, width: int, bh: int, bw: int) -> tuple[int, int]:
    """The (height, width) an image of ``height`` x ``width`` is resized to, one scale factor,
    so that it covers ``bh`` x ``bw``: the binding side exact, the other rounded up."""
    if bh * width >= bw * height:  # bh / height >= bw / width: the height binds
        return bh, -(-width * bh // height)
    return -(-height * bw // width), bw


def center_anchor(resized: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """v2 ``CenterCrop``'s (top, left) for a crop of ``size`` from ``resized``."""
    return (int(round((resized[0] - size[0]) / 2.0)), int(round((resized[1] - size[1]) / 2.0)))


@dataclass(frozen=True)
class BucketSpec:
    """How a bucketed pack sizes each image (part of :class:`.settings.PackSettings`)."""

    rule: str
    area: int  # pixels: side * side (kohya), the largest listed size's (list)
    step: int
    upscale: bool
    sizes: tuple[tuple[int, int], ...]  # the candidate buckets, sorted (height, width)
    side: int = 0  # the kohya rule's side (0 for a list)

    def as_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"rule": self.rule, "area": self.area, "step": self.step,
                                "upscale": self.upscale}
        if self.rule == "kohya":
            meta["side"] = self.side
        else:
            meta["candidates"] = [list(s) for s in self.sizes]
        return meta

    def nearest(self, height: int, width: int) -> tuple[int, int]:
        """The bucket whose ``w / h`` is nearest the image's (absolute difference; ties: the
        first in (h, w) order)."""
        ratios = self._ratios()
        return self.sizes[int(np.argmin(np.abs(ratios - width / height)))]

    def _ratios(self) -> np.ndarray:
        ratios = self.__dict__.get("_ratio_cache")
        if ratios is None:
            ratios = np.array([w / h for h, w in self.sizes])
            object.__setattr__(self, "_ratio_cache", ratios)
        return ratios

    def place(self, height: int, width: int) -> Placement:
        """Where an oriented ``height`` x ``width`` source lands (TooSmall: nowhere)."""
        bh, bw = self.nearest(height, width)
        if self.upscale or (height >= bh and width >= bw):
            resized = cover(height, width, bh, bw)
        else:  # not upscaled: its own size in steps, never past the bucket's sides
            bh = min(height - height % self.step, bh)
            bw = min(width - width % self.step, bw)
            if not bh or not bw:
                raise TooSmall(f"image {width}x{height} has a side under the bucket step "
                               f"{self.step}: no bucket holds it (`bucket_upscale=True` "
                               "upscales it)")
            resized = (height, width)
        top, left = center_anchor(resized, (bh, bw))
        return Placement((height, width), resized, top, left, (bh, bw))

    def decode_size(self, width: int, height: int) -> int:
        """The shorter side a decode must keep (at least twice it, :mod:`.imaging` rule 3) for
        a file of ``width`` x ``height`` before EXIF orientation, which is read after the
        pixels: the larger need of either orientation. 0: decode at full size."""
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


def make_spec(buckets: Any, step: int | None, upscale: bool) -> BucketSpec | None:
    """The spec of ``shardkit.pack``'s bucket options (PackOptionError naming the parameter);
    None without ``buckets``."""
    if buckets is None:
        if step is not None:
            raise PackOptionError("`bucket_step` needs `buckets`")
        if upscale:
            raise PackOptionError("`bucket_upscale` needs `buckets`")
        return None
    step = DEFAULT_STEP if step is None else step
    if isinstance(step, bool) or not _is_int(step) or step < 1:
        raise PackOptionError(f"`bucket_step` must be a positive integer, not {step!r}")
    step = int(step)
    if not isinstance(upscale, bool):
        raise PackOptionError(f"`bucket_upscale` must be True or False, not {upscale!r}")
    if _is_int(buckets) and not isinstance(buckets, bool):
        side = int(buckets)
        if side < step:
            raise PackOptionError(f"`buckets` must be a side of at least `bucket_step` "
                                  f"({step}), not {buckets!r}")
        return BucketSpec("kohya", side * side, step, upscale, tuple(kohya_sizes(side, step)),
                          side)
    if isinstance(buckets, (str, bytes)) or not hasattr(buckets, "__iter__"):
        raise PackOptionError("`buckets` must be a side (an integer: the area side * side) or "
                              f"a list of (height, width) sizes, not {buckets!r}")
    sizes = set()
    for size in buckets:
        pair = tuple(size) if isinstance(size, (list, tuple)) else ()
        if len(pair) != 2 or not all(_is_int(v) and not isinstance(v, bool) and v >= 1
                                     for v in pair):
            raise PackOptionError(f"`buckets` sizes must be (height, width) pairs of positive "
                                  f"integers, not {size!r}")
        sizes.add((int(pair[0]), int(pair[1])))
    if not sizes:
        raise PackOptionError("`buckets` must list at least one (height, width) size")
    listed = tuple(sorted(sizes))
    return BucketSpec("list", max(h * w for h, w in listed), step, upscale, listed)


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


class BucketFields(RecordFields):
    """A bucketed pack's fields: the source's own (``inner``, or none), with boxes and masks
    moved by each record's :class:`Placement` as v2 ``Resize(size=resized)`` +
    ``CenterCrop(size)`` move them, and the three bucket fields.

    The source's fields are asked for at the resized size (``fields_at(..., *resized)``: COCO
    scales its boxes and masks there as ``v2.Resize`` does), then cropped here. Boxes are
    stored, as always, XYXY float32 pixels of the stored image; their declaration in the store
    says so (``format="XYXY"``, not normalised): a ``normalized`` or XYWH input was converted
    at the resized size before the crop."""

    def __init__(self, inner: RecordFields | None) -> None:
        from ..fields import Array, Boxes, Schema

        self.inner = inner
        own = list(inner.schema) if inner is not None and inner.schema is not None else []
        clash = next((f.name for f in own if f.name in BUCKET_FIELDS), None)
        if clash is not None:
            raise PackError(f"the source's field {clash!r} has the name of a bucket field "
                            f"({', '.join(BUCKET_FIELDS)}); rename it to pack with `buckets`")
        stored = []
        for f in own:
            if f.kind == "boxes":
                g = Boxes(f.name, max_rows=f.max_rows)
                g.optional = f.optional
                f = g
            stored.append(f)
        self.moved = [f for f in own if f.geometric]
        self.schema = Schema(stored + [Array(n, (2,), "int32") for n in BUCKET_FIELDS])

    def plan_key(self) -> str:
        return "buckets:" + (self.inner.plan_key() if self.inner is not None else "")

    def meta(self) -> dict[str, Any]:
        return self.inner.meta() if self.inner is not None else {}

    def fields(self, path: str, height: int, width: int) -> dict[str, Any]:
        return self.fields_at(-1, path, height, width)

    def fields_at(self, index: int, path: str, height: int, width: int) -> dict[str, Any]:
        """A record stored as it is (no placement known): its own size everywhere."""
        size = (height, width)
        return self.record_at(index, path, None, Placement(size, size, 0, 0, size))

    def record_at(self, index: int, path: str, result: Any, place: Any = None
                  ) -> dict[str, Any]:
        place = result.place if place is None else place
        rh, rw = place.resized
        values: dict[str, Any] = {}
        if self.inner is not None:
            values = (self.inner.fields(path, rh, rw) if index < 0
                      else self.inner.fields_at(index, path, rh, rw))
            for f in self.moved:
                if values.get(f.name) is not None:
                    values[f.name] = _crop(f, values[f.name], place)
        return values | {"original_size": place.original,
                         "crop_top_left": (place.top, place.left), "target_size": place.size}


def _crop(f: Any, value: Any, place: Placement) -> Any:
    """One geometric field's value on the resized image, centre-cropped to the bucket."""
    from ..fields import FieldError

    (rh, rw), (bh, bw), top, left = place.resized, place.size, place.top, place.left
    if f.kind == "boxes":
        from ..fields.geometry import Move, move_boxes

        boxes = f.check(value, {"height": rh, "width": rw, "values": {}})  # XYXY pixels
        if (rh, rw) == (bh, bw):
            return boxes
        return move_boxes(boxes, Move(top, left, bh, bw, (bh, bw), False, (top, left)))
    arr = np.asarray(value)  # masks, label maps: (..., rh, rw) planes
    if arr.ndim < 2 or arr.shape[-2:] != (rh, rw):
        if f.kind == "masks" and arr.size == 0:
            return np.zeros((0, bh, bw), np.uint8)
        raise FieldError(f"field {f.name!r}: shape {list(arr.shape)}, expected [..., {rh}, "
                         f"{rw}] (the resized image's size)")
    return np.ascontiguousarray(arr[..., top:top + bh, left:left + bw])


__all__ = ["BUCKET_FIELDS", "BucketFields", "BucketSpec", "DEFAULT_STEP", "Placement", "RULES",
           "TooSmall", "center_anchor", "cover", "kohya_sizes", "make_spec"]
