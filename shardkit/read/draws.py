"""One reproducible stream: each sample's augmentation draws keyed by ``(seed, epoch, position)``.

A DataLoader worker draws crop boxes and flips from its own generator (``base_seed +
worker_id``), so what a sample gets depends on which worker read it, in which batch, after which
other samples: another ``num_workers``, another engine or a resumed epoch draws other boxes. In
``ds.loader`` the draws of a sample are instead a pure function of three numbers:

- ``seed``: the loader's ``generator``'s ``initial_seed()`` if one was passed, else
  ``torch.initial_seed()``, taken when an epoch's iterator starts (a ``load_state_dict`` pins
  the saved one, see :class:`shardkit.read.loading.loader.ShardLoader`);
- ``epoch``: the sampler's ``epoch`` where it has one (``ShardSampler``, ``MixSampler``,
  ``DistributedSampler``), else the count of epochs the loader started before this one;
- ``position``: the sample's place in the epoch. Under a ``ShardSampler``/``MixSampler`` its place
  in the epoch's global sequence, which every rank shares at every world size dividing
  ``num_canonical`` (two ranks never share a position, and after an elastic resume a sample keeps
  its draws); under a ``DistributedSampler`` ``rank + k * num_replicas`` for the rank's ``k``-th
  sample (its place in the sampler's global list); under any other sampler ``k``.

:func:`sample_seed` mixes them into one 63-bit seed (splitmix64: each step adds the golden gamma
``0x9E3779B97F4A7C15`` and applies its finaliser; ``mix(mix(mix(seed) ^ epoch) ^ position) >> 1``,
all modulo 2**64). A ``torch.Generator`` seeded with it makes torchvision's own calls for that
sample, so ``torch.manual_seed(shardkit.sample_seed(seed, epoch, position))`` followed by
``v2.Compose([v2.RandomResizedCrop(...), v2.RandomHorizontalFlip(...)])`` (or each ``View``'s
transform in turn) reproduces that sample's pixels with torchvision.

The loader's index sampler tags what it hands out: a batch's index list becomes a
:class:`Keyed` (a ``list`` with the samples' seeds, computed in numpy once per batch), a single
index (``batch_size=None``) a :class:`KeyedIndex` (an ``int`` with its seed). Both pickle to
worker processes (fork or spawn) as a plain list and an int array, and pass unchanged through
DataLoader's fetcher (or a thread engine) to ``ShardDataset.__getitems__``/``__getitem__``,
which draw from a generator seeded per sample. An untagged index (``ds[i]``, a plain
DataLoader) draws from torch's global RNG, as before. ``Mix`` hands each part its samples'
seeds; torch's own ``Subset`` and ``ConcatDataset`` hand their datasets plain indices, so a
loader refuses them around a dataset that draws (:func:`check_carried`).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from torch.utils.data import ConcatDataset, Subset

from ..errors import OptionError

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_U = np.uint64


def _mix_int(x: int) -> int:
    """splitmix64's step on a Python int: add the gamma, then the finaliser (mod 2**64)."""
    z = (x + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def _mix(z: np.ndarray) -> np.ndarray:
    """:func:`_mix_int` on a uint64 array (wrapping arithmetic)."""
    z = z + _U(_GAMMA)
    z = (z ^ (z >> _U(30))) * _U(_M1)
    z = (z ^ (z >> _U(27))) * _U(_M2)
    return z ^ (z >> _U(31))


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of one sample's draws (0 .. 2**63 - 1): ``torch.manual_seed`` of it, then the
    torchvision transform, draws what ``ds.loader`` drew for the sample at ``position`` of
    ``epoch`` under ``seed`` (see the module docstring)."""
    z = _mix_int(_mix_int(_mix_int(int(seed) & _MASK64) ^ (int(epoch) & _MASK64))
                 ^ (int(position) & _MASK64))
    return z >> 1


def sample_seeds(seed: int, epoch: int, positions: Any) -> np.ndarray:
    """:func:`sample_seed` of each of ``positions`` (int64), in one numpy pass."""
    head = _mix_int(_mix_int(int(seed) & _MASK64) ^ (int(epoch) & _MASK64))
    with np.errstate(over="ignore"):
        z = _mix(np.asarray(positions, dtype=np.int64).astype(_U) ^ _U(head))
    return (z >> _U(1)).astype(np.int64)


class Keyed(list):
    """A batch's indices, and each sample's draw seed (``seeds``: int64, one per index)."""

    __slots__ = ("seeds",)

    def __init__(self, indices: Iterable[Any], seeds: np.ndarray) -> None:
        super().__init__(indices)
        self.seeds = seeds

    def __reduce__(self) -> tuple:
        return Keyed, (list(self), self.seeds)


class KeyedIndex(int):
    """One index (``batch_size=None``) and its sample's draw seed (``seed``)."""

    seed: int

    def __new__(cls, index: int, seed: int) -> "KeyedIndex":
        made = super().__new__(cls, index)
        made.seed = int(seed)
        return made

    def __reduce__(self) -> tuple:
        return KeyedIndex, (int(self), self.seed)


def seeds_of(indices: Any) -> np.ndarray | None:
    """The per-sample seeds a loader tagged ``indices`` with (None: untagged)."""
    return indices.seeds if type(indices) is Keyed else None


def seed_of(index: Any) -> int | None:
    """The seed a loader tagged one ``index`` with (None: untagged)."""
    return index.seed if type(index) is KeyedIndex else None


def tag(batch: Any, seed: int, epoch: int, first: int, step: int, done: int) -> Any:
    """``batch`` (an index list, or one index) tagged with its samples' seeds: the samples at
    ``done``, ``done + 1``, ... of the epoch, at positions ``first + k * step``. Anything else
    (a user batch sampler's own objects) passes unchanged, untagged."""
    if isinstance(batch, (list, tuple)):
        positions = first + step * np.arange(done, done + len(batch), dtype=np.int64)
        return Keyed(batch, sample_seeds(seed, epoch, positions))
    if isinstance(batch, (int, np.integer)) and not isinstance(batch, (bool, np.bool_)):
        return KeyedIndex(batch, sample_seed(seed, epoch, first + step * done))
    return batch


#: What to use instead of each of torch's wrappers that lose the seeds.
_INSTEAD = {Subset: "take the records with ds.subset(indices), a ShardDataset",
            ConcatDataset: "put the datasets end to end with shardkit.Mix([...])"}


def check_carried(dataset: Any) -> None:
    """Refuse torch's own ``Subset``/``ConcatDataset`` around a dataset whose items draw random
    numbers (``random_draws``: random crops, flips, views): they hand it plain indices, so its
    draws would follow each worker's RNG and the batches change with ``num_workers``."""
    def walk(part: Any, wrapper: type | None, seen: set[int]) -> None:
        if id(part) in seen:
            return
        seen.add(id(part))
        if type(part) in _INSTEAD:
            wrapper = wrapper or type(part)
        elif wrapper is not None and getattr(part, "random_draws", False):
            raise OptionError(
                f"dataset: torch's {wrapper.__name__} hands {type(part).__name__} plain indices, "
                "without the per-sample seeds of its random crops and flips, which would then "
                f"change with num_workers; {_INSTEAD[wrapper]}, instead")
        inner = getattr(part, "dataset", None)
        for child in ([inner] if inner is not None else []) + list(
                getattr(part, "datasets", None) or ()):
            walk(child, wrapper, seen)

    walk(dataset, None, set())
