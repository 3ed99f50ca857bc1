"""DINO's multi-crop augmentation (``DataAugmentationDINO`` of facebookresearch/dino's
``main_dino.py``) as one recipe of views, drawn and applied on uint8 batches at decode.

Its distribution, view by view: 2 global crops (224, ``global_crops_scale``) and
``local_crops_number`` local crops (96, ``local_crops_scale``), bicubic; each then flip 0.5,
``RandomApply(ColorJitter(0.4, 0.4, 0.2, 0.1), p=0.8)``, ``RandomGrayscale(0.2)``; a Gaussian
blur of sigma uniform in (0.1, 2.0) with p 1.0 / 0.1 / 0.5 (global 1 / global 2 / locals);
solarisation (threshold 128) with p 0.2 on global 2 only; ImageNet normalisation.

What differs from DINO's PIL pipeline (``docs/training-recipe.md``, *DINO*): these are
torchvision v2's tensor kernels, so the resize is v2's anti-aliased bicubic, the colour
adjustments v2's (hue through HSV in float32), and the blur a ``kernel`` x ``kernel`` Gaussian
(sigma as drawn) instead of PIL's box-filter approximation of radius sigma; the random numbers
come from torch (per-sample seeds) instead of Python's ``random``.
"""

from __future__ import annotations

import numbers
from typing import Sequence

from ...errors import OptionError
from .crops import RandomResizedCrop, Views
from .normalize import Normalize
from .photometric import ColorJitter, GaussianBlur, RandomGrayscale, RandomSolarize

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def dino(global_crops_scale: Sequence[float] = (0.4, 1.0),
         local_crops_scale: Sequence[float] = (0.05, 0.4), local_crops_number: int = 8,
         global_size: int = 224, local_size: int = 96, blur_kernel: int = 13,
         normalize: bool = True) -> Views:
    """``DataAugmentationDINO(global_crops_scale, local_crops_scale, local_crops_number)`` as a
    ``Views`` recipe (main_dino.py's defaults). ``blur_kernel``: the Gaussian's side (13 covers
    three sigmas of the largest, 2.0). ``normalize=False`` leaves the views uint8."""
    if isinstance(local_crops_number, bool) \
            or not isinstance(local_crops_number, numbers.Integral) or local_crops_number < 0:
        raise OptionError(f"dino local_crops_number must be an int >= 0, got "
                          f"{local_crops_number!r}")
    jitter = [ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8), RandomGrayscale(0.2)]
    tail = [Normalize(IMAGENET_MEAN, IMAGENET_STD)] if normalize else []

    def crop(size: int, scale: Sequence[float], *steps) -> RandomResizedCrop:
        return RandomResizedCrop(size, scale, flip=0.5, interpolation="bicubic",
                                 then=[*jitter, *steps, *tail])

    return Views([crop(global_size, global_crops_scale, GaussianBlur(blur_kernel, p=1.0)),
                  crop(global_size, global_crops_scale, GaussianBlur(blur_kernel, p=0.1),
                       RandomSolarize(128, p=0.2))]
                 + [crop(local_size, local_crops_scale, GaussianBlur(blur_kernel, p=0.5))
                    for _ in range(int(local_crops_number))])
