#!/usr/bin/env python
"""Self-supervised views (``ShardDataset(views=[View(...), ...])``): images/s of one decode for
several RandomResizedCrop + flip views, against the plain random crop, the one-view recipe and
torchvision doing each view per sample.

One process, one torch thread, no DataLoader: each configuration reads every record in batches of
64 as a DataLoader worker does (``ShardDataset.__getitems__``, then ``shardkit.collate``), under
``torch.manual_seed(round)``. Rounds alternate the configurations, so drift in the machine's
speed hits all of them. Printed per configuration: median images/s (wall clock) and median CPU ms
per image (this process's CPU time: less sensitive to other load on the machine); the ratios are
of images per CPU second. The torchvision row is ``ShardDataset(path, transform=...)`` whose
transform applies each view's ``v2.Compose([RandomResizedCrop(size, scale, antialias=True),
RandomHorizontalFlip()])`` in turn (the crop and flip of DINO's ``DataAugmentationDINO``,
bilinear where DINO's is bicubic, without its colour steps): run it with the torchvision
environment. Images: ``shardkit.bench.sample.make_sample`` photos packed at 256 (the default).

    .venv-tv/bin/python benchmarks/views.py > benchmarks/results/views.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile

import torch

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
from shardkit import ShardDataset, View
from shardkit.bench import systems

from reports import sample_store, time_rounds  # beside this script

BATCH = 64
GLOBAL = View(224, scale=(0.32, 1.0))
LOCAL = View(96, scale=(0.05, 0.32))
DINO = [GLOBAL] * 2 + [LOCAL] * 6


class EachView:
    """torchvision per sample: each view's v2 transform applied in turn (DINO's way)."""

    def __init__(self, views: list[View]) -> None:
        from torchvision.transforms import v2

        self.steps = [v2.Compose([v2.RandomResizedCrop(v.size, scale=v.scale, ratio=v.ratio,
                                                       antialias=True),
                                  v2.RandomHorizontalFlip(v.flip)]) for v in views]

    def __call__(self, img: torch.Tensor) -> list[torch.Tensor]:
        return [step(img) for step in self.steps]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=320, help="ImageNet-like images [320]")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds [5]")
    parser.add_argument("--work-dir", help="keep the images and the store here (default: a "
                        "temporary folder, removed afterwards)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # per core: one thread, as in a DataLoader worker
    tv = systems.torchvision_version()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        _, store = sample_store(work, args.sample)
        configs = {
            "plain random crop 224 (no resize)": ShardDataset(store, crop=224, crop_mode="random"),
            "one view (recipe: crop_mode=random_resized, scale 0.32-1, flip)":
                ShardDataset(store, crop=224, crop_mode="random_resized", scale=GLOBAL.scale,
                             flip=0.5),
            "views: 2 x 224": ShardDataset(store, views=[GLOBAL] * 2),
            "views: DINO 2 x 224 + 6 x 96": ShardDataset(store, views=DINO),
        }
        if tv is not None:
            configs["torchvision per sample: DINO 2 x 224 + 6 x 96"] = ShardDataset(
                store, transform=EachView(DINO))
        wall, cpu = time_rounds(configs, args.rounds, BATCH)
        count = len(next(iter(configs.values())))

    def per_cpu(name: str) -> float:
        return 1e3 / statistics.median(cpu[name])

    print(f"# {'.venv-tv/bin/' if tv else ''}python benchmarks/views.py "
          f"{' '.join(sys.argv[1:])}".rstrip())
    print(f"# shardkit {shardkit.__version__}, torch {torch.__version__}, torchvision {tv}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, one torch thread; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print(f"# {count} photos packed at 256; median of {args.rounds} rounds, every record in "
          f"batches of {BATCH}, one core, exact decode")
    print(f"{'configuration':66s} {'images/s':>9s} {'CPU ms/img':>10s}")
    for name in configs:
        print(f"{name:66s} {statistics.median(wall[name]):9.0f} "
              f"{statistics.median(cpu[name]):10.3f}")
    names = list(configs)
    plain, one, two, dino = names[:4]
    print("ratios of images per CPU second:")
    print(f"  one view / plain random crop      = {per_cpu(one) / per_cpu(plain):.2f}"
          "  (target >= 0.9)")
    print(f"  2 x 224 views / one view          = {per_cpu(two) / per_cpu(one):.2f}"
          "  (target >= 0.9)")
    print(f"  DINO views / one view             = {per_cpu(dino) / per_cpu(one):.2f}"
          "  (target >= 0.5)")
    if tv is not None:
        print(f"  DINO views / torchvision per view = {per_cpu(dino) / per_cpu(names[4]):.2f}"
              "  (target >= 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
