"""shardkit's pack-side resize against stock Pillow's BICUBIC: speed and pixel difference.

Backs the README's figures for ``shardkit.packing.resize.resize_rgb`` (torch's antialiased bicubic uint8
kernel). Both run on one thread, as in a pack's encoding workers, on photo-like images
(``shardkit.bench.sample.photo_like``) at the sizes a pack resizes to a 256-px shorter side: a
full-size image under 512 px, or a JPEG that libjpeg-turbo decoded DCT-scaled to between 512 and
1023 px. Timing rounds alternate the two resizers, so drift in the machine's speed hits both.
Prints, per size, the median time per image of each, their ratio, and the largest and mean
absolute difference between their pixel values.

    python benchmarks/resize_vs_pillow.py > benchmarks/results/resize.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
import PIL
import torch
from PIL import Image

from shardkit.packing import resize
from shardkit.bench.sample import photo_like

SIZES = [(500, 375), (375, 500), (900, 675), (1024, 768), (1500, 1500)]  # (width, height)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=16, help="images per size")
    parser.add_argument("--rounds", type=int, default=15, help="timing rounds per size")
    args = parser.parse_args()
    resize.single_thread()
    rng = np.random.default_rng(0)
    print(f"# Pillow {PIL.__version__}, torch {torch.__version__}, {platform.processor() or '?'}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"# {args.images} photo-like images per size, median of {args.rounds} rounds; "
          "time per image, one thread")
    print(f"{'size':>21}  {'shardkit ms':>11}  {'Pillow ms':>9}  {'Pillow/shardkit':>15}  "
          f"{'max diff':>8}  {'mean diff':>9}")
    ratios, worst, means = [], 0, []
    for width, height in SIZES:
        arrays = [photo_like(rng, width, height) for _ in range(args.images)]
        images = [Image.fromarray(a) for a in arrays]
        new = resize.target_size(width, height, 256)
        diff = [np.abs(resize.resize_rgb(a, *new).astype(np.int16)
                       - np.asarray(im.resize(new, Image.Resampling.BICUBIC), np.int16))
                for a, im in zip(arrays, images)]
        ours, pillows = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for a in arrays:
                resize.resize_rgb(a, *new)
            t1 = time.perf_counter()
            for im in images:
                im.resize(new, Image.Resampling.BICUBIC)
            t2 = time.perf_counter()
            ours.append((t1 - t0) / len(arrays))
            pillows.append((t2 - t1) / len(arrays))
        ratio = statistics.median(p / o for p, o in zip(pillows, ours))
        ratios.append(ratio)
        worst = max(worst, max(int(d.max()) for d in diff))
        means.append(float(np.mean([d.mean() for d in diff])))
        print(f"{width:>5}x{height:<5} -> {new[0]:>3}x{new[1]:<3}  "
              f"{statistics.median(ours) * 1e3:>11.3f}  {statistics.median(pillows) * 1e3:>9.3f}  "
              f"{ratio:>15.2f}  {max(int(d.max()) for d in diff):>8}  {means[-1]:>9.4f}")
    print(f"all sizes: Pillow/shardkit time ratio {min(ratios):.1f}-{max(ratios):.1f} "
          f"(geometric mean {statistics.geometric_mean(ratios):.1f}); largest difference {worst}, "
          f"mean difference {statistics.mean(means):.4f}")


if __name__ == "__main__":
    main()
