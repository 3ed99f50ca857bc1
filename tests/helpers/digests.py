"""Digests of what a store gives, for comparing two environments (torch versions, Pillow builds)
without shipping pixels between processes."""

from __future__ import annotations

import hashlib

import numpy as np


def digest(array) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def record_digests(store: str) -> list[str]:
    """sha256 of every stored record, in order."""
    from shardkit import ShardDataset

    ds = ShardDataset(store, output="bytes")
    return [hashlib.sha256(ds[i][0]).hexdigest() for i in range(len(ds))]


def loader_digests(store: str, crop: int, batch: int) -> tuple[list[str], list[int]]:
    """What a training loop gets: 2 workers, crop at decode, shardkit.collate; batch digests and
    labels."""
    from torch.utils.data import DataLoader

    import shardkit

    loader = DataLoader(shardkit.ShardDataset(store, crop=crop), batch_size=batch, num_workers=2,
                        collate_fn=shardkit.collate, worker_init_fn=shardkit.worker_init_fn)
    digests, labels = [], []
    for images, targets in loader:
        digests.append(digest(images.numpy()))
        labels += targets.tolist()
    return digests, labels
