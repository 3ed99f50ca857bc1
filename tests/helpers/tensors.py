"""Image-free datasets for sampler tests: shards of tensors, each item its own index."""

from __future__ import annotations

from typing import Iterable

import torch
from torch.utils.data import ConcatDataset, TensorDataset


def tensor_shards(sizes: Iterable[int], start: int = 0) -> ConcatDataset:
    """One ``TensorDataset`` a shard, ``sizes`` items each, concatenated: item ``i`` is the
    tensor ``[start + i]``, so a sampler's indices can be checked against what it yields."""
    parts = []
    for s in sizes:
        parts.append(TensorDataset(torch.arange(start, start + s)))
        start += s
    return ConcatDataset(parts)
