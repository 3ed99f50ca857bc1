#!/usr/bin/env python
"""Per-core cost of the training recipe at decode: DCT-scaled decoding of large records, and the
recipe at decode against the same recipe as a per-sample transform.

Backs the README's "Large records" and per-core figures (section "Training recipe"). One process,
one torch thread, no DataLoader: each configuration reads every record in batches of 64 as a
DataLoader worker does (``ShardDataset.__getitems__``, then ``shardkit.collate``), under
``torch.manual_seed(round)``, so that in one round every configuration draws the same boxes and
flips. Rounds alternate the configurations, so drift in the machine's speed hits all of them.
Printed per configuration: the median images/s (wall clock) and the median CPU ms per image (this
process's CPU time: less sensitive than images/s to other load on the machine); for DCT scaling,
the mean difference from decoding at full size, per image.

Stores: ``--large`` photo-like 1600x1200 JPEGs (``shardkit.bench.sample.photo_like``, quality 90)
packed at size 0 (full size), and ``--sample`` ImageNet-like photos
(``shardkit.bench.sample.make_sample``) packed at 256 (the default). The per-sample transform is
torchvision v2's ``RandomResizedCrop(224, antialias=True)`` + ``RandomHorizontalFlip()`` when
torchvision is installed, else shardkit's implementation of the same pixels
(``shardkit.bench.systems.TensorRecipe``); the output says which.

    python benchmarks/recipe_decode.py > benchmarks/results/recipe_decode.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile

import numpy as np
import torch
from PIL import Image

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
from shardkit import ShardDataset
from shardkit.bench import systems
from shardkit.bench.sample import make_sample, photo_like
from shardkit.read import augment

from reports import time_rounds  # beside this script

BATCH = 64
CROP = 224


def large_folder(root: str, count: int) -> None:
    """``count`` photo-like 1600x1200 JPEGs (quality 90) in two classes."""
    rng = np.random.default_rng(1600)
    for i in range(count):
        folder = os.path.join(root, f"class_{i % 2}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(photo_like(rng, 1600, 1200)).save(os.path.join(folder, f"{i:04d}.jpg"),
                                                          quality=90)


def check_crop(images: torch.Tensor) -> None:
    assert images.shape[1:] == (3, CROP, CROP) and images.dtype == torch.uint8


def dct_difference(path: str, fast: bool) -> tuple[float, float, int]:
    """Mean |difference| per image between DCT-scaled and full-size decoding of the same boxes:
    (mean over images, worst image, images decoded scaled)."""
    kwargs = dict(crop=CROP, crop_mode="random_resized", flip=0.5, fast_decode=fast)
    scaled, full = ShardDataset(path, dct_scale=True, **kwargs), ShardDataset(path, **kwargs)
    shard = scaled.store.shard(0)
    recipe = augment.Recipe(CROP, "random_resized", flip=0.5, dct_scale=True)  # to count them
    torch.manual_seed(0)
    plans = [recipe.draw(int(shard.heights[i]), int(shard.widths[i])) for i in range(len(scaled))]
    torch.manual_seed(0)
    a = torch.stack([scaled[i][0] for i in range(len(scaled))]).float()
    torch.manual_seed(0)
    b = torch.stack([full[i][0] for i in range(len(full))]).float()
    per_image = (a - b).abs().mean(dim=(1, 2, 3))
    return per_image.mean().item(), per_image.max().item(), sum(p.dct > 1 for p in plans)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", type=int, default=64, help="1600x1200 images [64]")
    parser.add_argument("--sample", type=int, default=512, help="ImageNet-like images [512]")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds [7]")
    parser.add_argument("--fast-decode", action="store_true",
                        help="libjpeg-turbo's fast DCT and upsampling (default: exact, as "
                             "ShardDataset's default)")
    parser.add_argument("--work-dir", help="keep the images and stores here (default: a "
                        "temporary folder, removed afterwards)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # per core: one thread, as in a DataLoader worker
    fast = args.fast_decode
    tv = systems.torchvision_version()
    transform, transform_name = systems.recipe_transform(tv is not None)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        large_src, sample_src = os.path.join(work, "large"), os.path.join(work, "sample")
        large, packed256 = os.path.join(work, "large-size0.lmdb"), os.path.join(work, "s256.lmdb")
        if not os.path.isdir(large_src):
            large_folder(large_src, args.large)
        if not os.path.isdir(sample_src):
            make_sample(sample_src, args.sample, 10, seed=0, workers=1)
        for src, out, size in ((large_src, large, 0), (sample_src, packed256, 256)):
            if not os.path.exists(out):
                shardkit.pack(src, out, size=size, workers=1, progress=False)
        recipe = dict(crop=CROP, crop_mode="random_resized", flip=0.5, fast_decode=fast)
        configs = {
            "1600x1200 packed at size 0, recipe at decode, DCT-scaled (dct_scale=True)":
                ShardDataset(large, dct_scale=True, **recipe),
            "1600x1200 packed at size 0, recipe at decode, full size (default)":
                ShardDataset(large, **recipe),
            "1600x1200 packed at size 0, recipe as a per-sample transform":
                ShardDataset(large, transform=transform, fast_decode=fast),
            "photos packed at 256, recipe at decode": ShardDataset(packed256, **recipe),
            "photos packed at 256, recipe as a per-sample transform":
                ShardDataset(packed256, transform=transform, fast_decode=fast),
            "photos packed at 256, random crop at decode (no resize)":
                ShardDataset(packed256, crop=CROP, crop_mode="random", fast_decode=fast),
        }
        wall, cpu = time_rounds(configs, args.rounds, BATCH, check_crop)
        diff_mean, diff_worst, scaled = dct_difference(large, fast)
        counts = {name: len(ds) for name, ds in configs.items()}

    print(f"# python benchmarks/recipe_decode.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"# shardkit {shardkit.__version__}, torch {torch.__version__}, Pillow "
          f"{Image.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, one torch thread; "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print(f"# {'fast' if fast else 'exact'} JPEG decode; per-sample transform: {transform_name}")
    print(f"# median of {args.rounds} rounds, every record in batches of {BATCH}, one core")
    print(f"{'configuration':70s} {'images':>6s} {'images/s':>9s} {'CPU ms/img':>10s}")
    for name in configs:
        print(f"{name:70s} {counts[name]:6d} {statistics.median(wall[name]):9.0f} "
              f"{statistics.median(cpu[name]):10.2f}")

    def per_core(a: str, b: str) -> str:
        """a's images per CPU second over b's, round by round (the same boxes), median."""
        return f"{statistics.median(y / x for x, y in zip(cpu[a], cpu[b])):.2f}"

    names = list(configs)
    print(f"images per CPU second (one core), 1600x1200 records: DCT-scaled / full-size decode "
          f"= {per_core(names[0], names[1])} ({scaled} of {counts[names[0]]} boxes decoded "
          f"scaled; pixels differ by {diff_mean:.2f} grey levels on average, worst image "
          f"{diff_worst:.2f})")
    print(f"images per CPU second (one core), recipe at decode / as a per-sample transform: "
          f"1600x1200 records {per_core(names[0], names[2])}, packed at 256 "
          f"{per_core(names[3], names[4])}")
    print(f"images per CPU second (one core), packed at 256: recipe at decode / plain random "
          f"crop = {per_core(names[3], names[5])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
