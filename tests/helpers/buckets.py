"""Small aspect-ratio bucketed stores for the read-side bucket tests."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

#: The buckets of the test store (height, width), and how many records each gets (uneven).
SIZES = ((24, 64), (32, 48), (40, 40), (48, 32))
COUNTS = (11, 20, 9, 13)


def write_sources(root: str, seed: int = 0, captions: bool = False) -> None:
    """PNGs a little larger than the bucket sizes (each bucket's aspect ratio, a few pixels off),
    shuffled over 2 classes; with ``captions``, a ``<stem>.txt`` caption beside each."""
    rng = np.random.default_rng(seed)
    order = [b for b, c in enumerate(COUNTS) for _ in range(c)]
    rng.shuffle(order)
    for i, b in enumerate(order):
        h, w = SIZES[b]
        grow = 1 + rng.random()  # 1x..2x the bucket, then a few pixels more on one side
        h, w = int(h * grow) + int(rng.integers(0, 3)), int(w * grow)
        folder = os.path.join(root, f"c{i % 2}")
        os.makedirs(folder, exist_ok=True)
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(os.path.join(folder, f"{i:03d}.png"))
        if captions:
            with open(os.path.join(folder, f"{i:03d}.txt"), "w") as f:
                f.write(f"photo {i} of class {i % 2}, {h} by {w}")


def bucketed_store(root: str, out: str, **options) -> str:
    """The sources packed with ``buckets=SIZES`` (raw records: pixels compare exactly);
    ``captions=True`` writes and packs captions too."""
    import shardkit

    write_sources(root, captions=options.get("captions", False))
    shardkit.pack(root, out, buckets=list(SIZES), bucket_step=8, workers=1, progress=False,
                  encoding="raw", **options)
    return out
