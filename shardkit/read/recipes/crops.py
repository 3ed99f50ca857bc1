"""The crops a recipe starts with, named as torchvision v2 names them: ``Whole`` (no crop),
``CenterCrop``, ``RandomCrop``, ``RandomResizedCrop`` and ``Views`` (several crops of each
sample: self-supervised multi-crop). Each may end with photometric steps (``then=[...]``).

A crop with ``flip`` is the crop then ``RandomHorizontalFlip(flip)`` (its ``torch.rand(1)``
drawn even at 0, as v2 draws it; ``flip=None``: no flip step, nothing drawn). Each crop is
carried out by the decode-time machinery that the ``crop=``/``crop_mode=``/``views=`` options
use (:mod:`shardkit.read.augment`): ``flags()`` says which options it is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np

from ...errors import OptionError
from ..augment import View, check_box
from .steps import Then, check_then

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
#: ``RandomResizedCrop``'s (and v2's) default scale and ratio ranges.
SCALE, RATIO = (0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0)


class Part(NamedTuple):
    """What a crop adds to its decode-time draws: the resize's interpolation (a tuple: one drawn
    per sample), whether its flip step draws (v2's ``RandomHorizontalFlip`` draws even at 0), and
    its steps."""

    interpolation: str | tuple[str, ...]
    draw_flip: bool
    then: Then | None


def check_interpolation(value: Any, owner: str) -> str | tuple[str, ...]:
    """A resize's interpolation as its name (torchvision's ``InterpolationMode`` is an Enum of
    these names), or a sequence of them as a tuple (one of a single name: that name)."""
    many = isinstance(value, (list, tuple))
    names = [getattr(v, "value", v) if isinstance(v, enum.Enum) else v
             for v in (value if many else [value])]
    if not names or not all(isinstance(n, str) and n in INTERPOLATIONS for n in names):
        raise OptionError(f"{owner} interpolation must be one of {INTERPOLATIONS} (or "
                          f"torchvision's InterpolationMode of one), or a sequence of them to "
                          f"draw one per sample from; got {value!r}")
    return tuple(names) if many and len(names) > 1 else names[0]


def _side(value: Any, owner: str) -> int:
    # v2's sizes: an int, or a sequence of one or two (here square) of them
    if isinstance(value, (list, tuple)) and len(value) in (1, 2) and value[0] == value[-1]:
        value = value[0]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value <= 0:
        hint = (" (a (height, width) crop is a random-resized view only: "
                "Views([RandomResizedCrop((h, w))]))") if isinstance(value, (list, tuple)) else ""
        raise OptionError(f"{owner} size must be a positive int, got {value!r}{hint}")
    return int(value)


def _flip(value: Any, owner: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float)) \
            or not 0 <= value <= 1:
        raise OptionError(f"{owner} flip must be a probability between 0 and 1 or None, "
                          f"got {value!r}")
    return float(value)


class _Crop:
    then: Sequence[Any] = ()

    def _check_then(self) -> None:
        object.__setattr__(self, "then", check_then(self.then, type(self).__name__))

    def parts(self) -> list[Part]:
        """Per crop: its resize's interpolation, whether its flip step draws, its steps."""
        return [Part(getattr(self, "interpolation", "bilinear"), self.flip is not None,
                     Then(self.then) if self.then else None)]


@dataclass(frozen=True)
class Whole(_Crop):
    """The whole stored image (no crop; ``flip`` only on a store packed with buckets)."""

    flip: float | None = None
    then: Sequence[Any] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "flip", _flip(self.flip, "Whole"))
        self._check_then()

    def flags(self) -> dict[str, Any]:
        return {"crop": None, "flip": self.flip or 0.0}


@dataclass(frozen=True)
class CenterCrop(_Crop):
    """v2's ``CenterCrop(size)`` (zero padding for smaller images)."""

    size: int
    flip: float | None = None
    then: Sequence[Any] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _side(self.size, "CenterCrop"))
        object.__setattr__(self, "flip", _flip(self.flip, "CenterCrop"))
        self._check_then()

    def flags(self) -> dict[str, Any]:
        return {"crop": self.size, "crop_mode": "center", "flip": self.flip or 0.0}


@dataclass(frozen=True)
class RandomCrop(_Crop):
    """v2's ``RandomCrop(size)`` (images at least ``size`` on both sides)."""

    size: int
    flip: float | None = None
    then: Sequence[Any] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _side(self.size, "RandomCrop"))
        object.__setattr__(self, "flip", _flip(self.flip, "RandomCrop"))
        self._check_then()

    def flags(self) -> dict[str, Any]:
        return {"crop": self.size, "crop_mode": "random", "flip": self.flip or 0.0}


@dataclass(frozen=True)
class RandomResizedCrop(_Crop):
    """v2's ``RandomResizedCrop(size, scale, ratio, interpolation, antialias=True)``.
    ``interpolation``: ``"bilinear"``, ``"bicubic"`` or ``"nearest"`` (or v2's
    ``InterpolationMode`` of one), or a sequence of them: one drawn per sample, uniformly, right
    after the box (timm's ``RandomResizedCropAndInterpolation``; its ``random`` is
    ``("bilinear", "bicubic")``). ``size``: an int, or (height, width) inside ``Views``."""

    size: Any
    scale: Sequence[float] = SCALE
    ratio: Sequence[float] = RATIO
    flip: float | None = None
    interpolation: str = "bilinear"
    then: Sequence[Any] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "interpolation",
                           check_interpolation(self.interpolation, "RandomResizedCrop"))
        size, scale, ratio = check_box(self.size, self.scale, self.ratio, "RandomResizedCrop")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)
        object.__setattr__(self, "flip", _flip(self.flip, "RandomResizedCrop"))
        self._check_then()

    def view(self) -> View:
        return View(self.size, self.scale, self.ratio, self.flip or 0.0)

    def flags(self) -> dict[str, Any]:
        h, w = self.size
        if h != w:
            raise OptionError(f"RandomResizedCrop size {self.size!r}: a (height, width) crop "
                              "is a view: Views([RandomResizedCrop((h, w))])")
        return {"crop": h, "crop_mode": "random_resized", "scale": self.scale,
                "ratio": self.ratio, "flip": self.flip or 0.0}


@dataclass(frozen=True)
class Views:
    """Several crops of each sample from one decode, drawn view after view per sample (each a
    ``RandomResizedCrop`` or a ``shardkit.View``), as ``[transform(img) for transform in
    views]`` draws them: an item is ``([view_0, ...], label)``."""

    views: Sequence[Any]

    def __post_init__(self) -> None:
        views = self.views
        if isinstance(views, (str, bytes)) or not isinstance(views, Sequence) or not views \
                or not all(isinstance(v, (RandomResizedCrop, View)) for v in views):
            raise OptionError("Views takes a non-empty list of RandomResizedCrop (or "
                              f"shardkit.View), got {views!r}")
        object.__setattr__(self, "views", tuple(views))

    def flags(self) -> dict[str, Any]:
        return {"views": [v.view() if isinstance(v, RandomResizedCrop) else v
                          for v in self.views]}

    def parts(self) -> list[Part]:
        return [v.parts()[0] if isinstance(v, RandomResizedCrop) else Part("bilinear", True, None)
                for v in self.views]


CROPS = (Whole, CenterCrop, RandomCrop, RandomResizedCrop, Views)
