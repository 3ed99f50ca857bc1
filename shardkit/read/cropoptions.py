"""``ShardDataset``'s crop options checked together: ``crop``, ``crop_mode``, ``scale``,
``ratio``, ``flip`` and ``views``, or the ``recipe`` of :mod:`shardkit.read.recipes` they stand
for, against ``output``. Whatever would be ignored (``scale`` next to a centre crop, a recipe next
to ``output='bytes'``) raises one ``OptionError`` naming it, never a sample made without it."""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple, Sequence

from .. import codec
from ..errors import OptionError
from . import augment, recipes

class CropOptions(NamedTuple):
    """The checked options (``views`` checked into a tuple of ``View``, ``crop`` an int)."""

    crop: int | None
    crop_mode: str
    scale: Sequence[float]
    ratio: Sequence[float]
    flip: float
    views: tuple | None


def check(recipe: Any, output: str, crop: Any, crop_mode: Any, scale: Any, ratio: Any,
          flip: Any, views: Any) -> CropOptions:
    """The options a ``ShardDataset`` crops with, from ``recipe`` (refused next to a shortcut of
    its own set away from its default) or from the shortcuts."""
    if recipe is not None:
        made = recipes.resolve(recipe, dict(crop=crop, crop_mode=crop_mode, scale=scale,
                                            ratio=ratio, flip=flip, views=views))
        crop, crop_mode, scale, ratio, flip, views = (
            made[k] for k in ("crop", "crop_mode", "scale", "ratio", "flip", "views"))
    if output == "bytes" and (flip or recipe not in (None, recipes.Whole())):
        # The stored record is returned undecoded: a flip or a step would be dropped.
        what = f"flip={flip!r}" if recipe is None else f"recipe={type(recipe).__name__}(...)"
        raise OptionError(f"output='bytes' returns each stored record as it is and cannot be "
                          f"used with {what}: pass output='tensor' (or 'numpy', 'pil')")
    if crop_mode not in codec.CROP_MODES:
        raise OptionError(f"crop_mode must be one of {codec.CROP_MODES}, got {crop_mode!r}")
    if crop_mode == "random" and crop is None:
        raise OptionError("crop_mode='random' needs crop (the size of the square to cut)")
    if crop is not None and (isinstance(crop, bool) or not isinstance(crop, numbers.Integral)
                             or crop <= 0):
        raise OptionError(f"crop must be a positive integer size, got crop={crop!r}")
    if crop is not None and output == "bytes":
        raise OptionError(f"crop cannot be used with output='bytes' (each stored record as "
                          f"it is), got crop={crop!r}")
    crop = None if crop is None else int(crop)
    if views is not None:
        views = augment.check_views(views)
        if crop is not None or crop_mode != "center" or flip or output == "bytes" \
                or not recipes.is_default(scale, recipes.SCALE) \
                or not recipes.is_default(ratio, recipes.RATIO):
            raise OptionError("views cannot be used with crop, crop_mode, scale, ratio, "
                              "flip (each View has its own) or output='bytes'")
    elif crop_mode != "random_resized":  # another crop would ignore them
        for name, value, default in (("scale", scale, recipes.SCALE),
                                     ("ratio", ratio, recipes.RATIO)):
            if not recipes.is_default(value, default):
                raise OptionError(f"{name} is the random-resized crop's: it needs crop_mode="
                                  f"'random_resized', got crop_mode={crop_mode!r} "
                                  f"({name}={value!r})")
    return CropOptions(crop, crop_mode, scale, ratio, flip, views)
