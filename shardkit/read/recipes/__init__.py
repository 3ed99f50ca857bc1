"""Recipes as objects: what ``ShardDataset(path, recipe=...)`` does to each sample at decode,
named as torchvision v2 names it (public as ``shardkit.recipes``).

- crops (:mod:`.crops`): ``Whole``, ``CenterCrop``, ``RandomCrop``, ``RandomResizedCrop``,
  ``Views([...])``; each may end with steps, ``then=[...]``;
- steps (:mod:`.photometric`, :mod:`.normalize`): ``ColorJitter``, ``RandomGrayscale``,
  ``GaussianBlur``, ``RandomSolarize``, then optionally ``Normalize`` (the float batch);
- :func:`dino`: DINO's ``DataAugmentationDINO`` (:mod:`.dino`).

A recipe draws in the order its steps are written, view after view, as ``v2.Compose`` does:
the crop's draws, the flip's, then each step's, from the same per-sample seed as the crop
(:mod:`shardkit.read.draws`). The ``crop=``/``crop_mode=``/``scale=``/``ratio=``/``flip=``/
``views=`` options are shortcuts that build a crop recipe (:func:`from_flags`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from ... import codec
from ...errors import OptionError
from .. import augment
from .crops import (CROPS, INTERPOLATIONS, RATIO, SCALE, CenterCrop, RandomCrop,
                    RandomResizedCrop, Views, Whole, check_interpolation)
from .dino import dino
from .normalize import Normalize
from .photometric import ColorJitter, GaussianBlur, RandomGrayscale, RandomSolarize
from .steps import Then

__all__ = ["Whole", "CenterCrop", "RandomCrop", "RandomResizedCrop", "Views", "ColorJitter",
           "RandomGrayscale", "GaussianBlur", "RandomSolarize", "Normalize", "dino", "View"]

View = augment.View

_FLAG_DEFAULTS = {"crop": None, "crop_mode": "center", "scale": SCALE, "ratio": RATIO,
                  "flip": 0.0, "views": None}


def is_default(value: Any, default: Any) -> bool:
    """``value`` is ``default``: for a pair, a list or tuple of the same numbers."""
    if isinstance(default, tuple):
        try:
            return tuple(value) == default
        except TypeError:
            return False
    return value == default if default is not None else value is None


def resolve(recipe: Any, flags: dict[str, Any]) -> dict[str, Any]:
    """The options ``recipe`` stands for, checked against the ``flags`` given with it: a flag
    set away from its default next to a recipe raises one ``OptionError`` naming both."""
    if not isinstance(recipe, CROPS):
        raise OptionError("recipe must be one of shardkit.recipes' Whole, CenterCrop, RandomCrop, "
                          f"RandomResizedCrop, Views (or dino(...)), got {recipe!r}")
    given = [name for name, value in flags.items()
             if not is_default(value, _FLAG_DEFAULTS[name])]
    if given:
        raise OptionError(f"recipe and {given[0]} both say how to crop: pass "
                          f"{type(recipe).__name__}(...) alone, or the options without recipe")
    made = dict(_FLAG_DEFAULTS)
    made.update(recipe.flags())
    return made


def from_flags(crop: int | None, crop_mode: str, scale: Sequence[float],
               ratio: Sequence[float], flip: float, views: Sequence[Any] | None) -> Any:
    """The recipe the options build (``ShardDataset.recipe``)."""
    p = flip or None
    if views is not None:
        return Views(list(views))
    if crop is None:
        return Whole(p)
    if crop_mode == "random_resized":
        return RandomResizedCrop(crop, scale, ratio, p)
    return (RandomCrop if crop_mode == "random" else CenterCrop)(crop, p)


def attach(recipe: Any, made: tuple | None, flags: dict[str, Any],
           dct_scale: bool) -> tuple[tuple | None, tuple | None]:
    """The decode-time recipes (``made``: what the options built, one per view) with
    ``recipe``'s interpolation, flip draws and steps attached; and each view's steps (None:
    no view has any)."""
    if recipe is None:
        return made, None
    parts = recipe.parts()
    if made is None:
        if all(p.interpolation == "bilinear" and not p.draw_flip and p.then is None
               for p in parts):
            return None, None  # a plain centre crop or whole image: nothing drawn
        made = (augment.Recipe(flags["crop"] or 0, flags["crop_mode"], flags["scale"],
                               flags["ratio"], flags["flip"], dct_scale),)
    for r, part in zip(made, parts):
        r.interpolation, r.always_draw_flip, r.then = part
    thens = tuple(p.then for p in parts)
    return made, (thens if any(t is not None for t in thens) else None)


def floats(thens: tuple | None) -> bool:
    """Whether the steps end in ``Normalize`` (float output)."""
    return thens is not None and any(t is not None and t.normalize is not None for t in thens)


def finish_one(img: Any, plan: Any, then: Then | None) -> torch.Tensor | None:
    """One decoded HxWx3 uint8 ``img`` through ``then`` (in place; returns the float CxHxW
    image when it ends with ``Normalize``, else None)."""
    if then is None:
        return None
    x = torch.from_numpy(img).permute(2, 0, 1)[None]
    out = _apply(then, x, [plan.steps])
    return None if out is x else out[0]


def _apply(then: Then, x: torch.Tensor, steps: list,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``then`` on the N x 3 x H x W view ``x`` of channels-last memory: on a planar copy (each
    channel a dense plane: the steps' per-pixel arithmetic runs as vector loops, 2-5x faster than
    on interleaved channels), written back into ``x`` (returned) when the steps end uint8. The
    copy is this thread's scratch memory (a fresh one per batch costs its page faults), both
    copies numpy's (twice as fast as torch's for this transposition). ``out``: where the float
    batch goes (None: new memory)."""
    planar = codec.scratch(x.numel(), slot="planar")[:x.numel()].reshape(x.shape)
    np.copyto(planar, x.numpy())
    done = then.apply(torch.from_numpy(planar), steps, out)
    if done.dtype != torch.uint8:
        return done
    np.copyto(x.numpy(), done.numpy())
    return x


def finish_batch(thens: tuple | None, blocks: Sequence[torch.Tensor],
                 plans: Sequence[Sequence[Any]],
                 take: Callable[[tuple[int]], tuple[torch.Tensor, Any]] | None = None
                 ) -> list[torch.Tensor] | None:
    """Each view's N x H x W x 3 uint8 block through its steps, in place; the per-view
    N x C x H x W images (float where a view ends with ``Normalize``), or None without steps.
    ``take``: a batch pool's ``take`` (a uint8 buffer of a shape, and its slot), the memory the
    float views go to, one buffer for all of them (None: new memory per view)."""
    if thens is None:
        return None
    floats = [t is not None and t.normalize is not None for t in thens]
    sizes = [block.numel() * 4 if f else 0 for block, f in zip(blocks, floats)]
    flat = take((sum(sizes),))[0] if take is not None and sum(sizes) else None
    images, start = [], 0
    for v, (block, then) in enumerate(zip(blocks, thens)):
        x = block.permute(0, 3, 1, 2)
        out = None
        if flat is not None and floats[v]:
            out = flat[start:start + sizes[v]].view(torch.float32).view(x.shape)
            start += sizes[v]
        images.append(x if then is None else _apply(then, x, [p[v].steps for p in plans], out))
    return images
