#!/usr/bin/env python
"""Where a partial decode stops paying: CPU µs of decoding a record whole against decoding by
rows a window that leaves out 0..4 of its MCU rows (the cut's Python and byte copy against the
rows it saves), and the centre crop both ways. One thread, the median of 7 runs of ``--n`` calls.

    python benchmarks/partial_window.py [--height 256] [--n 400]

What it decided: a window leaving out at most one MCU row decodes whole
(``shardkit.read.partial.WHOLE_BELOW``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

try:
    import shardkit  # noqa: F401
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from shardkit import codec, jpegrows
from shardkit.read import partial


def cpu_us(call, n: int) -> float:
    runs = []
    for _ in range(7):
        t = time.process_time()
        for _ in range(n):
            call()
        runs.append((time.process_time() - t) / n)
    return sorted(runs)[3] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--n", type=int, default=400)
    args = parser.parse_args()
    torch.set_num_threads(1)
    h, w = args.height, args.height * 4 // 3
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    photo = (np.sin(x / 17.0) * 60 + np.cos(y / 23.0) * 60 + 128)[..., None]
    arr = np.clip(photo + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
    data = jpegrows.encode_rows(arr, 90)
    starts = jpegrows.row_starts(data)
    buf = codec.scratch(h * w * 3)
    crop = np.empty((h * 7 // 8, h * 7 // 8, 3), np.uint8)
    print(f"# {h}x{w} JPEG, {len(starts) - 1} MCU rows; CPU us per call")
    whole = cpu_us(lambda: codec.decode_crop_into(crop, data, "jpeg", h, w), args.n)
    print(f"whole decode + centre crop {whole:.0f}")
    for k in range(5):  # the bottom k MCU rows left out (0: a centre crop's window)
        bottom = h - 16 * k - 1 if k else h

        def by_rows(bottom=bottom) -> None:
            partial.decode_rows(data, starts, 0, bottom, False, buf, size=(h, w))
        print(f"window leaving out {k} MCU rows, decoded by rows {cpu_us(by_rows, args.n):.0f}")


if __name__ == "__main__":
    main()
