"""What the tests of stores that change share: image folders that grow, and a store's records
by key (its pixels' digest and class name), to compare a changed store with a fresh pack."""

from __future__ import annotations

import hashlib
import os

import numpy as np
from PIL import Image


def write_images(root, seed: int, classes: dict[str, int]) -> None:
    """``classes[name]`` small noise JPEGs of varied sizes in ``root/name/s<seed>_<i>.jpg``."""
    rng = np.random.default_rng(seed)
    for name, n in classes.items():
        os.makedirs(root / name, exist_ok=True)
        for i in range(n):
            h, w = 30 + int(rng.integers(0, 40)), 30 + int(rng.integers(0, 40))
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
                root / name / f"s{seed}_{i}.jpg", quality=95)


def by_key(ds) -> dict[str, tuple[str, str]]:
    """Every record of a ``ShardDataset``: its pixels' SHA-256 and class name, by key."""
    out = {}
    for i in range(len(ds)):
        image, label = ds[i]
        out[ds.key(i)] = (hashlib.sha256(image.numpy().tobytes()).hexdigest(),
                          ds.classes[label])
    return out
