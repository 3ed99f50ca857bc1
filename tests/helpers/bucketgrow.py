"""What the tests of appends to bucketed stores share: sources whose buckets a
``min_bucket_count`` merges, added in steps, and a store's records by key with their bucket
fields and its bucket counts, to compare an appended store with a fresh pack."""

from __future__ import annotations

import hashlib
import os

import numpy as np
from PIL import Image

import shardkit
from shardkit import ShardDataset

FIELDS = ["original_size", "crop_top_left", "target_size"]
# buckets=256, step 32, upscaled: (width, height) of each source and the bucket it selects
# (height, width): A (192, 320), B (224, 288), C (256, 256). With min_bucket_count=3 the store
# holds 1 A, 3 B, 3 C: A is merged into B (its nearest ratio). The first append adds one of each
# (A still under 3 in the union, so a fresh pack of it merges A the same way); the second adds
# a third A, which a fresh pack would keep, and the store still puts in B.
A, B, C = (500, 260), (400, 300), (300, 300)
FIRST = {"a/a0.png": A, "a/b0.png": B, "b/b1.png": (420, 310), "b/b2.png": (380, 300),
         "a/c0.png": C, "b/c1.png": (340, 330), "b/c2.png": (310, 320)}
SECOND = {"b/a1.png": (480, 250), "a/b3.png": (350, 300), "a/c3.png": (320, 300)}
THIRD = {"a/a2.png": (490, 255)}
OPTIONS = dict(buckets=256, bucket_step=32, bucket_upscale=True, encoding="raw", workers=0,
               progress=False)
MERGED = dict(OPTIONS, min_bucket_count=3)


def write(root, sizes: dict[str, tuple[int, int]]) -> None:
    for rel, (w, h) in sizes.items():
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        seed = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:4], "little")
        pixels = np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / rel)


def records(out) -> dict[str, tuple]:
    """Every record by key: pixels' digest, class name and bucket fields."""
    ds = ShardDataset(out, fields=FIELDS, output="numpy")
    found = {}
    for i in range(len(ds)):
        image, fields = ds[i]
        found[ds.key(i)] = (hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest(),
                            ds.classes[int(ds.targets[i])],
                            {k: np.asarray(fields[k]).tolist() for k in FIELDS})
    return found


def held(out) -> dict[tuple[int, int], int]:
    entry = shardkit.info(out)["buckets"]
    return {tuple(s): n for s, n in zip(entry["sizes"], entry["counts"])}
