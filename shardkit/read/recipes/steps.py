"""What follows a crop: its photometric steps (``then=[...]``), drawn per sample right after the
crop's own draws (``Compose`` order) and applied to the decoded uint8 batch, then an optional
``Normalize`` that makes the float batch."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ...errors import OptionError
from .normalize import Normalize
from .photometric import STEPS, Draws


class Then:
    """One crop's steps: ``draw`` (per sample, from its generator) and ``apply`` (per batch)."""

    def __init__(self, steps: Sequence[Any]) -> None:
        steps = list(steps)
        norm = [s for s in steps if isinstance(s, Normalize)]
        if len(norm) > 1 or (norm and steps[-1] is not norm[0]):
            raise OptionError("then: Normalize must be the last step, at most once")
        for step in steps:
            if not isinstance(step, (*STEPS, Normalize)):
                raise OptionError("then: each step must be one of shardkit.recipes' ColorJitter, "
                                  "RandomGrayscale, GaussianBlur, RandomSolarize, Normalize; got "
                                  f"{step!r}")
        self.normalize = norm[0] if norm else None
        self.steps = tuple(s for s in steps if not isinstance(s, Normalize))

    def draw(self, generator: torch.Generator | None) -> tuple:
        draws = Draws(generator)
        return tuple(step.draw(draws) for step in self.steps)

    def apply(self, x: torch.Tensor, params: Sequence[tuple | None],
              out: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` (uint8 ``[B, 3, H, W]``, each sample's drawn ``params``) changed in place; the
        float batch when the steps end with ``Normalize`` (in ``out``, where given)."""
        for k, step in enumerate(self.steps):
            step.apply(x, [None if p is None else p[k] for p in params])
        return x if self.normalize is None else self.normalize(x, out)


def check_then(then: Any, owner: str) -> tuple:
    if then is None:
        return ()
    if isinstance(then, (str, bytes)) or not isinstance(then, Sequence):
        raise OptionError(f"{owner} then must be a list of steps, got {then!r}")
    Then(then)  # validates
    return tuple(then)
