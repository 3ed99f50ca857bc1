"""SDXL's crop conditioning (``crop_top_left``) in each trainer's convention, from what a
bucketed store keeps per record (``original_size``, ``target_size``, the crop) and the rule.

* diffusers (``examples/text_to_image/train_text_to_image_sdxl.py``): ``(y1, x1)``, where its
  crop starts in the resized image, after a flip when it flips (it flips the resized image,
  then crops). For a record cut at ``left`` from an image resized to ``rw`` and then mirrored,
  the same pixels are the mirrored image cut at ``rw - width - left``.
* kohya sd-scripts: ``BucketManager.get_crop_ltrb(bucket, original)`` (where the original,
  fitted inside the bucket, lies in it), and the conditioning its SDXL dataset passes:
  ``(top, left)``, with ``left = target_w - right`` when it flips, each ``int()``.
"""

from __future__ import annotations

from . import kohya
from .rules import Placement


def diffusers_crop_top_left(place: Placement, flipped: bool = False) -> tuple[int, int]:
    """``(top, left)`` of the record's crop in the resized (and, ``flipped``, mirrored) image."""
    left = place.left
    if flipped:
        left = place.resized[1] - place.size[1] - left
    return place.top, left


def kohya_crop_ltrb(original: tuple[int, int], target: tuple[int, int]
                    ) -> tuple[float, float, float, float]:
    """``get_crop_ltrb((target_w, target_h), (original_w, original_h))``: (left, top, right,
    bottom) as floats (``original`` and ``target`` are (height, width))."""
    ltrb = kohya.crop_ltrb((target[1], target[0]), (original[1], original[0]))
    return tuple(float(v) for v in ltrb)  # type: ignore[return-value]


def kohya_crop_top_left(original: tuple[int, int], target: tuple[int, int],
                        flipped: bool = False) -> tuple[int, int]:
    """The ``crop_top_lefts`` entry sd-scripts' SDXL dataset yields: ``(int(top), int(left))``,
    the left ``target_w - right`` for a flipped sample."""
    left, top, right, _ = kohya.crop_ltrb((target[1], target[0]), (original[1], original[0]))
    return int(top), int(target[1] - right if flipped else left)
