"""SDXL's crop conditioning of a bucketed store's records, in each trainer's convention.

A bucketed store keeps per record ``original_size``, ``crop_top_left`` and ``target_size``
(:mod:`shardkit.packing.buckets`); its metadata names the bucket rule. From them:

* ``crop_top_left`` (stored): diffusers' convention, where the crop starts in the resized
  image. On a whole-record flip (``flip=`` without ``crop``) it becomes where the same pixels
  start in the mirrored resized image, ``resized_w - target_w - left``, the resized width
  recomputed with the store's rule (:func:`shardkit.bucketing.diffusers_crop_top_left`).
* ``crop_ltrb`` (derived): sd-scripts' ``get_crop_ltrb(target, original)``, float64 (left,
  top, right, bottom); a flip leaves it as it is (sd-scripts keeps it and derives the left).
* ``crop_top_left_kohya`` (derived): what sd-scripts' SDXL dataset conditions on, int32
  ``(top, left)`` of ``get_crop_ltrb``; flipped, ``left = target_w - right``.

With a decode-time crop (``crop=``) these describe the stored record, not the crop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import bucketmeta
from ..bucketing import (BucketRule, TooSmall, diffusers_crop_top_left, kohya_crop_ltrb,
                         kohya_crop_top_left)
from ..errors import StoreError

STORED = ("original_size", "crop_top_left", "target_size")
DERIVED = ("crop_ltrb", "crop_top_left_kohya")


class Conditioning:
    """The crop conditioning of one bucketed store's records (see the module docstring)."""

    def __init__(self, rule: BucketRule, where: str) -> None:
        self.rule, self.where = rule, where

    @classmethod
    def of(cls, store: Any) -> Conditioning | None:
        """The store's, or None for a store packed without buckets."""
        spec = store.settings.get(bucketmeta.KEY)
        if spec is None:
            return None
        return cls(bucketmeta.rule(spec, store.path), store.path)

    def values(self, names: list[str], stored: dict[str, np.ndarray], flipped: bool
               ) -> dict[str, np.ndarray]:
        """``names`` (stored or derived) of one record whose stored fields are ``stored``,
        as seen after a whole-record flip where ``flipped``."""
        original = tuple(int(v) for v in stored["original_size"])
        target = tuple(int(v) for v in stored["target_size"])
        out: dict[str, np.ndarray] = {}
        for name in names:
            if name == "crop_ltrb":
                out[name] = np.array(kohya_crop_ltrb(original, target), np.float64)
            elif name == "crop_top_left_kohya":
                out[name] = np.array(kohya_crop_top_left(original, target, flipped), np.int32)
            elif name == "crop_top_left" and flipped:
                out[name] = np.array(diffusers_crop_top_left(
                    self._placement(original, target, stored[name]), True), np.int32)
        return out

    def _placement(self, original: tuple, target: tuple, crop: np.ndarray) -> Any:
        """The record's placement by the store's rule, which must give what is stored."""
        try:
            place = self.rule.place(*original)
        except TooSmall:
            place = None
        if place is None or place.size != target or (place.top, place.left) != tuple(
                int(v) for v in crop):
            raise StoreError(f"{self.where}: a record of original size {original} stored at "
                             f"{target} cut at {tuple(crop)} is not where the store's bucket "
                             "rule places it (damaged store)")
        return place
