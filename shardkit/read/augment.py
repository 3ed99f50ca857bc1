"""Training augmentation at decode time: torchvision v2's ``RandomResizedCrop`` and
``RandomHorizontalFlip``, drawn and resized exactly as torchvision does it, into the batch buffer.

``Recipe.draw`` makes the same torch global-RNG calls in the same order as
``v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(p)])`` (or ``CenterCrop`` /
``RandomCrop`` in place of the first), so under one ``torch.manual_seed`` both draw the same box and
flip for every sample. Given per-sample seeds (a ``ds.loader`` tags its samples with them,
:mod:`.draws`), each sample's calls go to one thread-local ``torch.Generator`` seeded with its
seed: what torchvision draws after ``torch.manual_seed(seed)``. ``cut.decode_into`` then decodes
the record, resizes the box with the kernel torchvision v2 uses on uint8 tensors
(anti-aliased bilinear; uint8 where the CPU has the vectorised kernel, float32 and rounding
elsewhere) straight into ``out`` and flips it (a flipped JPEG is decoded BGR and each resized
row written back to front: the mirror image in RGB, in one pass).

With ``dct_scale`` (an opt-in speed option; off by default, so every pixel is torchvision's) a
JPEG whose box is at least twice the output size on both sides is decoded DCT-scaled (1/2, 1/4
or 1/8: the factors libjpeg-turbo decodes faster than full size), the box mapped onto the
smaller image. The pixels then differ from torchvision's: the box's edges move by up to half a
scaled pixel and libjpeg's scaling does part of the downsizing. Small outputs qualify on any
store (a 64 px crop from a box of 128 px or more of a store packed at 256).

Several views of one sample (``View``: self-supervised multi-crop) are one recipe each, drawn one
after the other per sample (``draw_views``: what ``Compose([RandomResizedCrop, RandomHorizontalFlip])``
of each view, applied in turn, draws); a single crop is a recipe of one. The pixels are cut from
the decoded record by :mod:`shardkit.read.cut`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
import torch

from .. import codec
from ..errors import OptionError
# resize_into and mirror: names this module has always offered (shardkit.bench uses them)
from .cut import mirror, resize_into  # noqa: F401

DCT_FACTORS = (8, 4, 2)  # libjpeg-turbo's fast scaled decodes (3/8, 5/8, ... are slower than 1)


class Plan(NamedTuple):
    """One sample's crop box in the stored image (may reach outside it: zero padding), its flip,
    and the DCT scale-down a JPEG may be decoded at (1: full size)."""

    top: int
    left: int
    height: int
    width: int
    flip: bool
    dct: int = 1
    interpolation: str = "bilinear"  # the resize's: "bilinear", "bicubic" or "nearest"
    steps: Any = None  # what the recipe's steps after the crop drew (``Recipe.then``)


class _Draws(threading.local):
    """This thread's one-element tensors that torchvision's draws are made into, and its
    generator for draws seeded per sample (``shardkit.read.draws``).

    ``torch.empty(1).uniform_(a, b)``, ``torch.rand(1)`` and ``torch.randint(a, b, (1,))`` are
    ``uniform_``/``random_`` on a new tensor: the same calls on a reused one draw the same
    numbers, without an allocation each (a few µs a sample). ``manual_seed`` on one reused
    ``torch.Generator`` puts it where ``torch.manual_seed`` puts torch's global generator.
    """

    def __init__(self) -> None:
        self.real = torch.empty(1)
        self.integer = torch.empty(1, dtype=torch.int64)
        self.generator = torch.Generator()
        self.source: torch.Generator | None = None  # what ``integers`` draws from (None: global)

    def reals(self) -> torch.Tensor:
        if self.real.dtype != torch.get_default_dtype():  # torch.empty(1) follows the default
            self.real = torch.empty(1)
        return self.real

    def integers(self, low: int, high: int) -> int:
        """``codec.random_origin``'s ``integers``: ``torch.randint(low, high, ...)``."""
        if self.source is None:
            return self.integer.random_(low, high).item()
        return self.integer.random_(low, high, generator=self.source).item()


#: The random numbers the crops draw (torch's global RNG, or a loader's generator).
DRAWS = _Draws()


def _pair(value: Any, name: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise OptionError(f"{name} must be a pair (min, max) of numbers, got {value!r}") from None
    if not 0 < low <= high or not math.isfinite(high):
        raise OptionError(f"{name} must be (min, max) with 0 < min <= max, got {value!r}")
    return low, high


def _size(value: Any, owner: str) -> tuple[int, int]:
    given = value
    if isinstance(value, (bool, np.bool_)):
        value = None
    if isinstance(value, (list, tuple)) and len(value) == 1:  # v2: a sequence of one is square
        value = value[0]
    if isinstance(value, (int, np.integer)):
        value = (value, value)
    try:
        h, w = value
    except (TypeError, ValueError):
        h = w = None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v > 0
               for v in (h, w)):
        raise OptionError(f"{owner} size must be a positive int or a pair (height, width) of "
                          f"them, got {given!r}")
    return int(h), int(w)


def check_box(size: Any, scale: Any, ratio: Any, owner: str) -> tuple:
    """A random-resized crop's ``size`` as (height, width), ``scale`` and ``ratio`` as (min,
    max); an ``OptionError`` naming ``owner`` (the class the user wrote) otherwise."""
    return _size(size, owner), _pair(scale, f"{owner} scale"), _pair(ratio, f"{owner} ratio")


@dataclass(frozen=True)
class View:
    """One view of a sample: torchvision v2's ``RandomResizedCrop(size, scale, ratio,
    antialias=True)`` then ``RandomHorizontalFlip(flip)``, done at decode
    (``ShardDataset(path, views=[...])``). ``size``: an int (square) or (height, width); stored
    as (height, width)."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip: float = 0.5

    def __post_init__(self) -> None:
        size, scale, ratio = check_box(self.size, self.scale, self.ratio, "View")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)
        flip = self.flip
        if isinstance(flip, (bool, np.bool_)) or not isinstance(flip, (int, float)) \
                or not 0 <= flip <= 1:
            raise OptionError(f"View flip must be a probability between 0 and 1, got {flip!r}")
        object.__setattr__(self, "flip", float(flip))

    def recipe(self, dct_scale: bool = False) -> "Recipe":
        """The recipe that draws this view's box and flip (its flip drawn even at 0, as
        ``RandomHorizontalFlip(0)`` draws)."""
        return Recipe(self.size, "random_resized", self.scale, self.ratio, self.flip, dct_scale,
                      always_draw_flip=True)


def check_views(views: Any) -> tuple[View, ...]:
    """``ShardDataset``'s ``views``: a non-empty sequence of :class:`View`."""
    if isinstance(views, (View, str, bytes)) or not isinstance(views, Sequence) or not views \
            or not all(isinstance(v, View) for v in views):
        raise OptionError(f"views must be a non-empty list of shardkit.View, got {views!r}")
    return tuple(views)


class Recipe:
    """How a dataset draws each sample's crop box and flip: from torch's global RNG in the
    calling thread (DataLoader workers each have their own seed, ``torch.manual_seed``
    reproduces them), or, for samples a ``ds.loader`` tagged (:mod:`.draws`), from a generator
    seeded per sample."""

    #: The resize's interpolation (a tuple: one drawn per sample after the box), and the steps
    #: after the crop (``shardkit.recipes``): an object whose ``draw(generator)`` makes their
    #: draws right after the flip's (None: none).
    interpolation: str | tuple[str, ...] = "bilinear"
    then: Any = None

    def __init__(self, size: int | tuple[int, int], mode: str,
                 scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), flip: float = 0.0,
                 dct_scale: bool = False, always_draw_flip: bool = False) -> None:
        # ``size``: the output, square or (height, width) (``random_resized`` only).
        self.out = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        self.size = size if isinstance(size, int) else self.out[0]
        self.mode = mode
        # A view's ``RandomHorizontalFlip(p)`` draws ``torch.rand(1)`` even for p == 0.
        self.always_draw_flip = always_draw_flip
        self.dct_scale = dct_scale
        self.scale = _pair(scale, "scale")
        self.ratio = _pair(ratio, "ratio")
        self.flip = float(flip)
        self._flip32 = float(np.float32(self.flip))  # torch compares ``rand >= p`` in float32
        # torchvision draws the aspect ratio between these float32 logs.
        self.log_ratio = tuple(torch.log(torch.tensor(self.ratio)).tolist())

    def draw(self, height: int, width: int) -> Plan:
        return self.draws(((height, width),))[0]

    def draws(self, sizes: Iterable[Sequence[int]],
              seeds: Sequence[int] | None = None) -> list[Plan]:
        """Each (height, width)'s box and flip, sample after sample, with torchvision's calls:
        ``RandomResizedCrop.make_params`` (or ``CenterCrop``/``RandomCrop``), then
        ``RandomHorizontalFlip``. From torch's global RNG, or with ``seeds`` (one per size)
        each sample's from a generator seeded with its seed: what torchvision draws after
        ``torch.manual_seed(seed)``."""
        if seeds is None:
            return self._draw(sizes, None, None)
        return self._draw(sizes, seeds, DRAWS.generator)

    def _draw(self, sizes: Iterable[Sequence[int]], seeds: Sequence[int] | None,
              generator: torch.Generator | None) -> list[Plan]:
        """``draws`` from ``generator`` (None: the global RNG), reseeded before each sample
        with its seed in ``seeds`` (None: as it is)."""
        size, mode, dct_scale = self.size, self.mode, self.dct_scale
        out_h, out_w = self.out
        (s0, s1), (r0, r1) = self.scale, self.log_ratio
        real, integer = DRAWS.reals(), DRAWS.integer
        sqrt = math.sqrt
        if generator is None:
            uniform, randint = real.uniform_, integer.random_
        else:
            def uniform(low: float, high: float) -> torch.Tensor:
                return real.uniform_(low, high, generator=generator)

            def randint(low: int, high: int) -> torch.Tensor:
                return integer.random_(low, high, generator=generator)
        DRAWS.source = generator  # ``codec.random_origin``'s draws too
        reseed = None if seeds is None else generator.manual_seed
        seed_list = None if seeds is None else np.asarray(seeds, dtype=np.int64).tolist()
        # ``if torch.rand(1) >= p: return inputs`` (p == 0 draws nothing here, so a dataset
        # without flip draws exactly what it drew before flip existed).
        p = self._flip32 if self.flip > 0 or self.always_draw_flip else None
        then, interpolation = self.then, self.interpolation
        # several: one per sample, ``random.choice`` as timm draws it after the box, here from
        # the sample's torch stream (``torch.randint(0, n, (1,))``)
        choices = interpolation if isinstance(interpolation, tuple) else None
        plans = []
        for k, (height, width) in enumerate(sizes):
            if reseed is not None:
                reseed(seed_list[k])
            if not size and mode == "center":  # the whole record (a bucketed store's flip)
                top, left, h, w = 0, 0, height, width
            elif mode == "random_resized":
                area = height * width
                for _ in range(10):
                    target_area = area * uniform(s0, s1).item()
                    aspect_ratio = uniform(r0, r1).exp_().item()  # torch.exp's kernel, in place
                    w = round(sqrt(target_area * aspect_ratio))
                    h = round(sqrt(target_area / aspect_ratio))
                    if 0 < w <= width and 0 < h <= height:
                        top = randint(0, height - h + 1).item()
                        left = randint(0, width - w + 1).item()
                        break
                else:
                    top, left, h, w = self._central_box(height, width)
            else:
                top, left = (codec.center_origin(height, width, size) if mode == "center"
                             else codec.random_origin(height, width, size, DRAWS))
                h = w = size
            if choices is not None:
                interpolation = choices[randint(0, len(choices)).item()]
            flip = p is not None and not uniform(0, 1).item() >= p
            dct = (dct_factor(h, w, out_h, out_w)
                   if dct_scale and h >= 2 * out_h and w >= 2 * out_w else 1)
            steps = None if then is None else then.draw(generator)
            plans.append(Plan(top, left, h, w, flip, dct, interpolation, steps))
        return plans

    def _central_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``RandomResizedCrop``'s fallback after ten tries: the central box, ratio clamped."""
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w


def draw_views(recipes: Sequence[Recipe], sizes: Sequence[Sequence[int]],
               seeds: Sequence[int] | None = None) -> list[list[Plan]]:
    """Each sample's plans, one per recipe (view): sample after sample, each view's draws in
    turn, as ``[Compose([RandomResizedCrop, RandomHorizontalFlip]) for each view]`` applied one
    after the other to each sample. One recipe: its ``draws`` (the same calls). With ``seeds``
    (one per sample), a sample's views are drawn in turn from one generator seeded with its
    seed (``torch.manual_seed(seed)``, then each view's transform)."""
    if len(recipes) == 1:
        return [[plan] for plan in recipes[0].draws(sizes, seeds)]
    if seeds is None:
        return [[r.draws((size,))[0] for r in recipes] for size in sizes]
    generator = DRAWS.generator
    plans = []
    for size, seed in zip(sizes, np.asarray(seeds, dtype=np.int64).tolist()):
        generator.manual_seed(seed)
        plans.append([r._draw((size,), None, generator)[0] for r in recipes])
    return plans


def recipe(crop: int | None, mode: str, scale: Sequence[float], ratio: Sequence[float],
           flip: float, dct_scale: bool = False, whole: bool = False) -> Recipe | None:
    """A dataset's ``Recipe``, or None for a plain centre crop (the fast path draws nothing).
    ``whole``: without ``crop``, a flip draws for the whole record (a bucketed store's)."""
    if mode not in codec.CROP_MODES:
        raise OptionError(f"crop_mode must be one of {codec.CROP_MODES}, got {mode!r}")
    if isinstance(flip, bool) or not isinstance(flip, (int, float)) or not 0 <= flip <= 1:
        raise OptionError(f"flip must be a probability between 0 and 1, got {flip!r}")
    made = Recipe(crop or 0, mode, scale, ratio, flip, dct_scale)  # validates scale and ratio
    if crop is None:
        if whole and flip and mode == "center":
            return made
        if mode == "random_resized" or flip:
            what = "crop_mode='random_resized'" if mode == "random_resized" else "flip"
            raise OptionError(f"{what} needs crop (the output size)")
        return None
    return None if mode == "center" and not flip else made


def dct_factor(box_height: int, box_width: int, size: int, size_width: int | None = None) -> int:
    """Largest DCT scale-down (8, 4, 2 or 1) that keeps a box at least ``size`` (high, and
    ``size_width`` wide: ``size`` if None) on both sides."""
    size_width = size if size_width is None else size_width
    for k in DCT_FACTORS:
        if box_height >= k * size and box_width >= k * size_width:
            return k
    return 1


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float],
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` (on the GPU, typically) to normalised floats, ``(x / 255 - mean) /
    std`` per channel: exactly ``images.float().div_(255)`` then ``v2.Normalize(mean, std)``."""
    if images.dtype != torch.uint8:
        raise OptionError(f"images must be uint8 (as shardkit delivers them), got {images.dtype}")
    mean_t = torch.as_tensor(mean, dtype=dtype, device=images.device).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=dtype, device=images.device).view(-1, 1, 1)
    return images.to(dtype).div_(255).sub_(mean_t).div_(std_t)
