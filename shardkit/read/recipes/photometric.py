"""The photometric steps a recipe may end with: torchvision v2's ``ColorJitter``,
``RandomGrayscale``, ``GaussianBlur`` and ``RandomSolarize``, drawn with v2's calls and applied
to a decoded uint8 batch with per-sample parameters (:mod:`.kernels`).

A step with ``p`` is ``v2.RandomApply([step], p)``: one ``torch.rand(1)`` first, the step (and its
own draws) only where it is below ``p`` (compared in float32, as torch compares). ``p=None``
(``ColorJitter``, ``GaussianBlur``): the step itself, always applied. ``RandomGrayscale`` and
``RandomSolarize`` are v2's, which draw as ``RandomApply`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ...errors import OptionError
from ..augment import DRAWS
from . import kernels


class Draws:
    """Random numbers as v2's transforms take them: from torch's global RNG (``generator``
    None) or a sample's seeded generator. ``torch.rand(1)`` and ``torch.empty(1).uniform_`` are
    ``uniform_`` on a new one-element tensor: drawn into this thread's reused one (the same
    numbers, without an allocation each)."""

    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = generator
        self.real = DRAWS.reals()

    def rand(self) -> float:
        return self.real.uniform_(0.0, 1.0, generator=self.generator).item()

    def uniform(self, low: float, high: float) -> float:
        return float(self.real.uniform_(low, high, generator=self.generator).item())

    def randperm(self, n: int) -> list[int]:
        return torch.randperm(n, generator=self.generator).tolist()


def _probability(value: Any, name: str, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float)) \
            or not 0 <= value <= 1:
        raise OptionError(f"{name} p must be a probability between 0 and 1, got {value!r}")
    return float(value)


def _applied(p: float | None, draws: Draws) -> bool:
    """``RandomApply``'s ``torch.rand(1) >= p`` (False: skipped); None: no draw, applied."""
    return p is None or not draws.rand() >= float(np.float32(p))


def _jitter_range(value: Any, name: str, center: float = 1.0,
                  bound: tuple[float, float] = (0.0, math.inf),
                  clip: bool = True) -> tuple[float, float] | None:
    """v2's ``ColorJitter._check_input``: a number ``v`` is ``(center - v, center + v)``."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise OptionError(f"ColorJitter {name} must be non-negative, got {value!r}")
        low, high = center - value, center + value
        if clip:
            low = max(low, 0.0)
    else:
        try:
            low, high = (float(v) for v in value)
        except (TypeError, ValueError):
            raise OptionError(f"ColorJitter {name} must be a number or a pair (min, max), "
                              f"got {value!r}") from None
    if not bound[0] <= low <= high <= bound[1]:
        raise OptionError(f"ColorJitter {name} must be within {bound} and increasing, "
                          f"got {value!r}")
    return None if low == high == center else (float(low), float(high))


@dataclass(frozen=True)
class ColorJitter:
    """v2's ``ColorJitter(brightness, contrast, saturation, hue)`` (in ``RandomApply(..., p)``
    with ``p``): the four adjustments in a random order per sample (``torch.randperm(4)``)."""

    brightness: Any = None
    contrast: Any = None
    saturation: Any = None
    hue: Any = None
    p: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", _probability(self.p, "ColorJitter", allow_none=True))
        for name in ("brightness", "contrast", "saturation", "hue"):  # a list kept hashable
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        ranges = (_jitter_range(self.brightness, "brightness"),
                  _jitter_range(self.contrast, "contrast"),
                  _jitter_range(self.saturation, "saturation"),
                  _jitter_range(self.hue, "hue", 0.0, (-0.5, 0.5), clip=False))
        object.__setattr__(self, "_ranges", ranges)

    def draw(self, draws: Draws) -> Any:
        if not _applied(self.p, draws):
            return None
        order = draws.randperm(4)
        factors = [None if r is None else draws.uniform(*r) for r in self._ranges]
        return order, factors

    def apply(self, x: torch.Tensor, params: Sequence[Any]) -> None:
        """``x``'s samples adjusted in place, each in its own order (samples grouped by the
        adjustment they make at each of the four places)."""
        ops = (kernels.brightness, kernels.contrast, kernels.saturation, kernels.hue)
        for place in range(4):
            for op in range(4):
                chosen = [(i, prm[1][op]) for i, prm in enumerate(params)
                          if prm is not None and prm[0][place] == op and prm[1][op] is not None]
                if chosen:
                    ops[op](x, [i for i, _ in chosen], [f for _, f in chosen])


@dataclass(frozen=True)
class RandomGrayscale:
    """v2's ``RandomGrayscale(p)``: luma in all three channels."""

    p: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", _probability(self.p, "RandomGrayscale"))

    def draw(self, draws: Draws) -> Any:
        return _applied(self.p, draws) or None

    def apply(self, x: torch.Tensor, params: Sequence[Any]) -> None:
        idx = [i for i, prm in enumerate(params) if prm]
        if idx:
            kernels.grayscale(x, idx)


@dataclass(frozen=True)
class RandomSolarize:
    """v2's ``RandomSolarize(threshold, p)``: values at or above ``threshold`` inverted."""

    threshold: float
    p: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", _probability(self.p, "RandomSolarize"))
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 255:
            raise OptionError(f"RandomSolarize threshold must be a number in 0..255 (uint8 "
                              f"pixels), got {t!r}")

    def draw(self, draws: Draws) -> Any:
        return _applied(self.p, draws) or None

    def apply(self, x: torch.Tensor, params: Sequence[Any]) -> None:
        idx = [i for i, prm in enumerate(params) if prm]
        if idx:
            kernels.solarize(x, idx, self.threshold)


@dataclass(frozen=True)
class GaussianBlur:
    """v2's ``GaussianBlur(kernel, sigma)`` (in ``RandomApply(..., p)`` with ``p``): a square
    odd ``kernel``, ``sigma`` drawn uniformly from (min, max) per sample (a number: fixed),
    reflect padding."""

    kernel: int
    sigma: Any = (0.1, 2.0)
    p: float | None = None

    def __post_init__(self) -> None:
        k = self.kernel
        if isinstance(k, (list, tuple)) and len(k) in (1, 2) and k[0] == k[-1]:
            k = k[0]  # v2's kernel_size as a sequence: square here
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0 or k % 2 == 0:
            raise OptionError(f"GaussianBlur kernel must be an odd positive int (or a square "
                              f"(k, k)), got {self.kernel!r}")
        object.__setattr__(self, "kernel", k)
        sigma = self.sigma
        if isinstance(sigma, (int, float)) and not isinstance(sigma, bool):
            sigma = (float(sigma), float(sigma))
        try:
            low, high = (float(s) for s in sigma)
        except (TypeError, ValueError):
            low = high = math.nan
        if not 0 < low <= high < math.inf:
            raise OptionError(f"GaussianBlur sigma must be a positive number or (min, max) with "
                              f"0 < min <= max, got {self.sigma!r}")
        object.__setattr__(self, "sigma", (low, high))
        object.__setattr__(self, "p", _probability(self.p, "GaussianBlur", allow_none=True))

    def draw(self, draws: Draws) -> Any:
        if not _applied(self.p, draws):
            return None
        return draws.uniform(*self.sigma)

    def apply(self, x: torch.Tensor, params: Sequence[Any]) -> None:
        idx = [i for i, prm in enumerate(params) if prm is not None]
        if idx:
            kernels.blur(x, idx, self.kernel, [params[i] for i in idx])


STEPS = (ColorJitter, RandomGrayscale, RandomSolarize, GaussianBlur)
