#!/usr/bin/env python
"""DINO's full augmentation per CPU second: DINO's own loader, the same pipeline as torchvision v2
per sample on a ``ShardDataset``, ``shardkit.recipes.dino()`` at decode; and the crop + flip
views alone (2 x 224 + 6 x 96) against one view.

One process, one torch thread, no DataLoader: each configuration reads every image once in batches
of 64 as a DataLoader worker does (items, then the collate), rounds alternating the
configurations so that drift in the machine's speed hits all of them. Printed per configuration:
median images/s (wall clock) and median CPU ms per image (this process's CPU time); ratios are of
images per CPU second, round by round, median.

- DINO's loader: ``torchvision.datasets.ImageFolder`` over the source JPEGs with
  ``DataAugmentationDINO``'s transforms as main_dino.py builds them (torchvision v1 on PIL images:
  ``RandomResizedCrop`` bicubic, ``RandomHorizontalFlip(0.5)``, ``RandomApply(ColorJitter(0.4, 0.4,
  0.2, 0.1), p=0.8)``, ``RandomGrayscale(0.2)``, PIL ``GaussianBlur(radius=uniform(0.1, 2.0))`` with
  p 1.0 / 0.1 / 0.5, ``ImageOps.solarize`` with p 0.2 on global 2, ``ToTensor`` + ImageNet
  ``Normalize``; 2 x 224 at scale (0.4, 1) + 8 x 96 at (0.05, 0.4)), torch's default collate.
- v2 per sample: ``ShardDataset(store, transform=...)``, the same steps as v2 transforms on the
  uint8 tensor (what ``shardkit.recipes.dino()`` equals pixel for pixel), ``shardkit.collate``.
- at decode: ``ShardDataset(store, recipe=shardkit.recipes.dino())``.

Images: ``shardkit.bench.sample.make_sample`` photos (mean about 500x375); DINO's loader decodes
the source JPEGs, the ``ShardDataset`` rows read them packed at 256 (shorter side; the default).
Needs torchvision:

    .venv-tv/bin/python benchmarks/recipe_dino.py --out benchmarks/results/recipe_dino.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time

import torch

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
import shardkit.recipes as R
from shardkit import ShardDataset, View, collate

from reports import command_line, emit, sample_store  # beside this script

BATCH = 64
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
GLOBAL_SCALE, LOCAL_SCALE, LOCALS = (0.4, 1.0), (0.05, 0.4), 8


class PilBlur:
    """DINO's blur: with probability ``p``, PIL's ``GaussianBlur`` of radius uniform(0.1, 2)."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, img):
        from PIL import ImageFilter

        if random.random() > self.p:
            return img
        return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))


class PilSolarize:
    """DINO's solarisation: with probability ``p``, ``ImageOps.solarize`` (threshold 128)."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, img):
        from PIL import ImageOps

        return ImageOps.solarize(img) if random.random() < self.p else img


class DinoPil:
    """``DataAugmentationDINO``'s ten views of one PIL image (torchvision v1 transforms)."""

    def __init__(self) -> None:
        from torchvision import transforms as T

        bicubic = T.InterpolationMode.BICUBIC
        jitter = T.Compose([T.RandomHorizontalFlip(p=0.5),
                            T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                            T.RandomGrayscale(p=0.2)])
        norm = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
        self.global1 = T.Compose([T.RandomResizedCrop(224, GLOBAL_SCALE, interpolation=bicubic),
                                  jitter, PilBlur(1.0), norm])
        self.global2 = T.Compose([T.RandomResizedCrop(224, GLOBAL_SCALE, interpolation=bicubic),
                                  jitter, PilBlur(0.1), PilSolarize(0.2), norm])
        self.local = T.Compose([T.RandomResizedCrop(96, LOCAL_SCALE, interpolation=bicubic),
                                jitter, PilBlur(0.5), norm])

    def __call__(self, img) -> list:
        return [self.global1(img), self.global2(img)] + [self.local(img) for _ in range(LOCALS)]


class DinoV2:
    """The same ten views with torchvision v2 on the uint8 tensor a ``ShardDataset`` delivers."""

    def __init__(self) -> None:
        from torchvision.transforms import v2

        def view(size, scale, blur_p, solarize=False):
            steps = [v2.RandomResizedCrop(size, scale, interpolation=v2.InterpolationMode.BICUBIC,
                                          antialias=True),
                     v2.RandomHorizontalFlip(0.5),
                     v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                     v2.RandomGrayscale(0.2),
                     v2.RandomApply([v2.GaussianBlur(13, (0.1, 2.0))], p=blur_p)]
            if solarize:
                steps.append(v2.RandomSolarize(128, p=0.2))
            return v2.Compose(steps + [v2.ToDtype(torch.float32, scale=True),
                                       v2.Normalize(MEAN, STD)])

        self.views = ([view(224, GLOBAL_SCALE, 1.0), view(224, GLOBAL_SCALE, 0.1, True)]
                      + [view(96, LOCAL_SCALE, 0.5) for _ in range(LOCALS)])

    def __call__(self, img: torch.Tensor) -> list:
        return [v(img) for v in self.views]


def epoch(read, n: int, seed: int) -> tuple[float, float]:
    """Every item once in batches of ``BATCH``: (wall seconds, CPU seconds)."""
    torch.manual_seed(seed)
    random.seed(seed)
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, n, BATCH):
        read(list(range(start, min(n, start + BATCH))))
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=128, help="photos [128]")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds [5]")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--work-dir", help="keep the images and the store here (default: a "
                        "temporary folder, removed afterwards)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # per core: one thread, as in a DataLoader worker
    import PIL
    import torchvision
    from torch.utils.data import default_collate
    from torchvision.datasets import ImageFolder

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        src, store = sample_store(work, args.sample)
        folder = ImageFolder(src, transform=DinoPil())

        def shards(ds):
            return lambda idx: collate(ds.__getitems__(idx))

        configs = {
            "DINO's loader: ImageFolder + DataAugmentationDINO (PIL, v1)":
                lambda idx: default_collate([folder[i] for i in idx]),
            "v2 per sample: ShardDataset(transform=DINO's steps in v2)":
                shards(ShardDataset(store, transform=DinoV2())),
            "at decode: ShardDataset(recipe=shardkit.recipes.dino())":
                shards(ShardDataset(store, recipe=R.dino())),
            "crop + flip views at decode: 2 x 224 + 6 x 96": shards(ShardDataset(
                store, views=[View(224, GLOBAL_SCALE)] * 2 + [View(96, LOCAL_SCALE)] * 6)),
            "crop + flip, one view at decode: 1 x 224": shards(ShardDataset(
                store, recipe=R.RandomResizedCrop(224, GLOBAL_SCALE, flip=0.5))),
        }
        n = len(folder)
        assert len(ShardDataset(store)) == n
        for read in configs.values():  # warm up: page cache, scratch buffers, imports
            epoch(read, n, 0)
        wall = {name: [] for name in configs}
        cpu = {name: [] for name in configs}
        for r in range(args.rounds):
            for name, read in configs.items():
                seconds, cpu_seconds = epoch(read, n, r)
                wall[name].append(n / seconds)
                cpu[name].append(cpu_seconds / n * 1e3)

    def ratio(a: str, b: str) -> float:
        """a's images per CPU second over b's, round by round, median."""
        return statistics.median(y / x for x, y in zip(cpu[a], cpu[b]))

    names = list(configs)
    lines = [
        f"# .venv-tv/bin/{command_line()}".rstrip(),
        f"# shardkit {shardkit.__version__}, torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}, Pillow {PIL.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs (shared), one torch thread; load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end",
        f"# {n} photos (DINO's loader: the source JPEGs; ShardDataset: packed at 256); median of "
        f"{args.rounds} alternating rounds, every image in batches of {BATCH}, one core",
        f"{'configuration':64s} {'images/s':>9s} {'CPU ms/img':>10s}",
    ]
    for name in names:
        lines.append(f"{name:64s} {statistics.median(wall[name]):9.1f} "
                     f"{statistics.median(cpu[name]):10.2f}")
    lines += [
        "images per CPU second, ratios (median of the rounds):",
        f"  dino() at decode / DINO's loader      = {ratio(names[2], names[0]):.2f}"
        "  (target >= 5)",
        f"  dino() at decode / v2 per sample      = {ratio(names[2], names[1]):.2f}"
        "  (target >= 3)",
        f"  views 2 x 224 + 6 x 96 / one view     = {ratio(names[3], names[4]):.2f}"
        "  (target >= 0.5)",
    ]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
