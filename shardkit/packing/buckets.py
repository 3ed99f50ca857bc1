"""Aspect-ratio buckets at pack time: each image is stored at the resolution it trains at.

The rules live in :mod:`shardkit.bucketing` (shared with the reader, which derives the crop
conditioning from them); here ``shardkit.pack``'s options become one (:func:`make_spec`) and a
bucketed pack's records get their fields (:class:`BucketFields`).

``buckets=`` takes a side ``N`` (the ``"area"`` rule on ``N * N`` pixels: for every width ``w``
in steps of ``step`` up to ``2 * N``, the largest height in steps with ``w * h <= N * N``, both
turns, ratios within 1:4..4:1; where ``N`` is a multiple of ``2 * step`` exactly kohya
sd-scripts' ``make_bucket_resolutions((N, N), min_size=N / 2, max_size=2 * N, divisible=step)``:
for 1024 and 64, 33 sizes, 33 of the 40 sizes SDXL lists, without its 960x1024, 1024x960,
896x1088, 1088x896, 832x1152, 1152x832 and 1344x704, height x width), a list of ``(height,
width)`` sizes (``"list"``), a rule name (``"sdxl"``: SDXL's 40 sizes; ``"kohya"``:
sd-scripts' ``BucketManager`` with its defaults) or a rule object
(``shardkit.bucketing.KohyaRule(resolution=768, ...)``).

The area and list rules' assignment (:meth:`shardkit.bucketing.AreaRule.place`), on the
EXIF-oriented source of ``height`` x ``width``:

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
   ``bucket_no_upscale`` (the ``"kohya"`` rule with ``bucket_upscale=False``), which never
   resizes a source of at most ``N * N`` pixels but cuts each side down to the step (this
   rule's record has that size where it fits inside the source's bucket; otherwise a side is
   cut to the bucket's, or a source at least its bucket's size is resized to cover it), and
   gives a larger source a bucket of its own (resized to the area at its own ratio, each side
   cut down to the step), where this rule resizes it to cover the nearest bucket.

``min_bucket_count``: buckets that would hold fewer records are merged into their nearest
neighbour before any pixel is decoded (:mod:`shardkit.bucketing.merge`; the sources' headers
are read once for it: :mod:`.bucket_census`). An append places new images by the store's
recorded rule, its merges kept as they are (:mod:`.bucket_append`).

Per record the store keeps ``original_size`` (the oriented source's (height, width)),
``crop_top_left`` ((top, left) of the crop in the resized image, as diffusers' SDXL training
script computes it for its centre crop; kohya's ``get_crop_ltrb`` gives other values: the offset
of the image fitted inside the bucket, which the reader derives as ``crop_ltrb``) and
``target_size`` (the bucket): SDXL's micro-conditioning inputs. The store's metadata
``buckets`` lists the buckets that hold records and how many (:mod:`shardkit.bucketmeta`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..bucketing import (AreaRule, BucketRule, KohyaRule, ListRule, Placement, SDXLRule,
                         TooSmall)
from ..bucketing.rules import DEFAULT_STEP, area_sizes, center_anchor, cover, is_int
from ..errors import PackError, PackOptionError
from .record_fields import RecordFields

#: The per-record fields of a bucketed store (int32 (height, width) / (top, left) pairs).
BUCKET_FIELDS = ("original_size", "crop_top_left", "target_size")
BucketSpec = BucketRule  # what PackSettings holds
kohya_sizes = area_sizes


def make_spec(buckets: Any, step: Any, upscale: Any, min_bucket_count: Any = None
              ) -> BucketRule | None:
    """The rule of ``shardkit.pack``'s bucket options (PackOptionError naming the parameter);
    None without ``buckets``. ``upscale`` None: the rule's default (the area and list rules
    keep small sources small; ``"kohya"`` upscales as sd-scripts does unless
    ``bucket_upscale=False``, its ``bucket_no_upscale``; ``"sdxl"`` always resizes)."""
    if buckets is None:
        for name, given in (("bucket_step", step is not None), ("bucket_upscale", bool(upscale)),
                            ("min_bucket_count", min_bucket_count is not None)):
            if given:
                raise PackOptionError(f"`{name}` needs `buckets`")
        return None
    if step is not None and (not is_int(step) or step < 1):
        raise PackOptionError(f"`bucket_step` must be a positive integer, not {step!r}")
    if upscale is not None and not isinstance(upscale, bool):
        raise PackOptionError(f"`bucket_upscale` must be True or False, not {upscale!r}")
    if min_bucket_count is not None and (not is_int(min_bucket_count)
                                         or min_bucket_count < 1):
        raise PackOptionError(f"`min_bucket_count` must be an integer >= 1, not "
                              f"{min_bucket_count!r}")
    rule = _rule(buckets, step, upscale)
    if min_bucket_count is not None and min_bucket_count > 1:
        rule = rule.with_merged((), int(min_bucket_count))
    return rule


def _rule(buckets: Any, step: Any, upscale: Any) -> BucketRule:
    steps = DEFAULT_STEP if step is None else int(step)
    if isinstance(buckets, BucketRule):
        if step is not None or upscale is not None:
            raise PackOptionError("`bucket_step` and `bucket_upscale` are parameters of the "
                                  "rule object given as `buckets`: set them there")
        return buckets
    if is_int(buckets):
        return AreaRule(int(buckets), steps, bool(upscale))
    if buckets == "sdxl":
        if step is not None or upscale is False:
            raise PackOptionError("`buckets='sdxl'` is SDXL's 40 sizes in steps of 64, every "
                                  "image resized to one: it takes no `bucket_step` or "
                                  "`bucket_upscale=False` (buckets=1024 keeps small images "
                                  "small)")
        return SDXLRule()
    if buckets == "kohya":
        return KohyaRule(bucket_reso_steps=steps, bucket_no_upscale=upscale is False)
    if isinstance(buckets, (str, bytes)) or not hasattr(buckets, "__iter__"):
        raise PackOptionError("`buckets` must be a side (an integer: the area side * side), a "
                              "list of (height, width) sizes, 'sdxl', 'kohya' or a "
                              f"shardkit.bucketing rule, not {buckets!r}")
    return ListRule(tuple(buckets), steps, bool(upscale))


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


__all__ = ["BUCKET_FIELDS", "BucketFields", "BucketSpec", "DEFAULT_STEP", "Placement", "TooSmall",
           "center_anchor", "cover", "kohya_sizes", "make_spec"]
