"""``Normalize(mean, std)``: the float batch a recipe may end with, made in the worker or thread
that decoded it: exactly v2's ``ToDtype(torch.float32, scale=True)`` then ``Normalize(mean,
std)`` (``x.to(float32).mul_(1 / 255)``, then ``(x - mean) / std`` per channel)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import OptionError
from . import kernels


def _three(value: Any, name: str, positive: bool) -> tuple[float, float, float]:
    try:
        values = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3 or not all(math.isfinite(v) and (v > 0 or not positive)
                                   for v in values):
        what = "three positive numbers" if positive else "three numbers"
        raise OptionError(f"Normalize {name} must be {what} (one per channel), got {value!r}")
    return values


@dataclass(frozen=True)
class Normalize:
    """Float32 ``(x / 255 - mean) / std`` per channel: the last step of a recipe (it makes
    the float batch; every other step works on uint8)."""

    mean: Any = (0.485, 0.456, 0.406)
    std: Any = (0.229, 0.224, 0.225)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", _three(self.mean, "mean", False))
        object.__setattr__(self, "std", _three(self.std, "std", True))

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 ``[..., 3, H, W]`` to float32, contiguous (into ``out``, where given)."""
        return kernels.normalize(x, self.mean, self.std, out).contiguous()
