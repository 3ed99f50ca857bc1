"""Small aspect-ratio bucketed stores for the read-side bucket tests."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

#: The buckets of the test store (height, width), and how many records each gets (uneven).
SIZES = ((24, 64), (32, 48), (40, 40), (48, 32))
COUNTS = (11, 20, 9, 13)


def write_sources(root: str, seed: int = 0) -> list[tuple[int, int]]:
    """PNGs at exactly the bucket sizes, interleaved over 2 classes with captions; returns each
    image's (height, width) in ImageFolder order (c0 first, then c1, by name)."""
    rng = np.random.default_rng(seed)
    order = [b for b, c in enumerate(COUNTS) for _ in range(c)]
    rng.shuffle(order)
    made = []
    for i, b in enumerate(order):
        h, w = SIZES[b]
        folder = os.path.join(root, f"c{i % 2}")
        os.makedirs(folder, exist_ok=True)
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(os.path.join(folder, f"{i:03d}.png"))
        made.append((f"c{i % 2}/{i:03d}.png", (h, w)))
    return [hw for _, hw in sorted(made)]


def bucketed_store(root: str, out: str) -> str:
    """A store whose records are each one of ``SIZES``, with the ``buckets`` metadata a bucketed
    pack writes (packed at the sources' own sizes, the metadata key added as ``pack`` adds it)."""
    import shardkit

    from . import rewrite_metadata

    write_sources(root)
    shardkit.pack(root, out, size=0, workers=1, progress=False, encoding="raw")
    rewrite_metadata(out, lambda meta: meta.update(buckets={
        "sizes": sorted(list(s) for s in SIZES), "area": 1600, "step": 8, "upscale": False,
        "counts": [COUNTS[SIZES.index(s)] for s in sorted(SIZES)]}))
    return out
