"""Aspect-ratio bucket rules, shared by the packer (which sizes each record with one) and the
reader (which derives the crop conditioning of each convention from it).

One registry of rule names (:data:`RULES`): ``"area"`` (shardkit's rule on an area of
``side * side``: ``buckets=1024``), ``"kohya"`` (sd-scripts' ``BucketManager`` with its
defaults, and its ``bucket_no_upscale`` rule), ``"sdxl"`` (SDXL's 40 training sizes) and
``"list"`` (sizes of your own). :func:`rule` builds one by name; each rule's
``as_meta()`` is what a store's metadata records (JSON) and :func:`from_meta` reads it back.

* :mod:`.rules`        the rules and their placement arithmetic (:class:`Placement`)
* :mod:`.registry`     the rules by name, and from a store's metadata
* :mod:`.kohya`        the arithmetic of sd-scripts' ``BucketManager``, restated
* :mod:`.conventions`  ``crop_top_left`` as diffusers computes it, ``get_crop_ltrb`` as kohya does
* :mod:`.merge`        folding buckets that hold too few records into their nearest neighbour
"""

from __future__ import annotations

from .conventions import diffusers_crop_top_left, kohya_crop_ltrb, kohya_crop_top_left
from .merge import merge_small
from .registry import RULES, from_meta, rule
from .rules import (SDXL_SIZES, AreaRule, BucketRule, KohyaRule, ListRule, Placement, SDXLRule,
                    TooSmall)

__all__ = ["AreaRule", "BucketRule", "KohyaRule", "ListRule", "Placement", "RULES", "SDXLRule",
           "SDXL_SIZES", "TooSmall", "diffusers_crop_top_left", "from_meta", "kohya_crop_ltrb",
           "kohya_crop_top_left", "merge_small", "rule"]
