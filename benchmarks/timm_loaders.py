#!/usr/bin/env python
"""timm's training loader three ways over the same images (run in the torchvision environment):

1. timm's own: ``timm.data.create_dataset("", root=FOLDER)`` (its ImageFolder) and
   ``timm.data.create_loader`` (RandomResizedCrop + flip on PIL images, per sample);
2. ``shardkit.timm``'s adapter: the store, the same recipe drawn and resized at decode;
3. timm's ``create_loader`` over a ``ShardDataset(output="pil")`` without the adapter (timm's
   per-sample transform on the decoded stored images).

All three: ``create_loader(ds, (3, 224, 224), 64, is_training=True, hflip=0.5,
color_jitter=0, interpolation="bilinear", use_prefetcher=True, device=cpu)`` with
``--workers`` workers, timm's ``PrefetchLoader`` normalising on the CPU. The loaders take turns
epoch by epoch (so a busy machine slows them alike); images/s is the median over the timed
epochs, after one warm-up epoch each.

    .venv-tv/bin/python benchmarks/timm_loaders.py --count 1000 --out benchmarks/results/timm_loaders.txt
"""

from __future__ import annotations

import argparse
import os
import sys
import platform
import statistics
import tempfile
import time

import psutil
import timm
import timm.data
import torch

import shardkit
import shardkit.timm
from shardkit.bench.sample import make_sample
from reports import emit  # beside this script

SIZE, BATCH = 224, 64
COMMON = dict(is_training=True, hflip=0.5, color_jitter=0.0, interpolation="bilinear",
              use_prefetcher=True, device=torch.device("cpu"))


def cpu_seconds() -> float:
    """CPU time of this process and its live children (the DataLoader workers)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def epoch_rate(loader) -> tuple[float, float]:
    """(images/s, CPU microseconds per image) over one epoch."""
    start, cpu, n = time.perf_counter(), cpu_seconds(), 0
    for images, _ in loader:
        n += len(images)
    return n / (time.perf_counter() - start), (cpu_seconds() - cpu) * 1e6 / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1000, help="sample photos to generate")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per loader")
    p.add_argument("--out", default="", help="also write the report here")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="shardkit-timm-bench-")
    images = os.path.join(work, "images")
    make_sample(os.path.join(images, "train"), args.count, 10, seed=7)
    stores = os.path.join(work, "stores")
    os.makedirs(stores)
    shardkit.pack(os.path.join(images, "train"), os.path.join(stores, "train.lmdb"),
                  progress=False)
    common = dict(COMMON, num_workers=args.workers)
    loaders = {
        "timm ImageFolder + create_loader": timm.data.create_loader(
            timm.data.create_dataset("", root=images, split="train", is_training=True),
            (3, SIZE, SIZE), BATCH, **common),
        "shardkit.timm adapter (recipe at decode)": shardkit.timm.create_loader(
            shardkit.timm.create_dataset("shardkit", root=stores, split="train"),
            (3, SIZE, SIZE), BATCH, **common),
        "timm create_loader over ShardDataset(output='pil')": timm.data.create_loader(
            shardkit.ShardDataset(os.path.join(stores, "train.lmdb"), output="pil"),
            (3, SIZE, SIZE), BATCH, **common),
    }
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    cpu: dict[str, list[float]] = {name: [] for name in loaders}
    for name, loader in loaders.items():
        epoch_rate(loader)  # warm-up: workers start, files reach the page cache
    for _ in range(args.epochs):
        for name, loader in loaders.items():
            rate, micros = epoch_rate(loader)
            rates[name].append(rate)
            cpu[name].append(micros)
    base = statistics.median(rates["timm ImageFolder + create_loader"])
    lines = [f"command: {' '.join(['python', *sys.argv])}",
             f"machine: {platform.processor() or platform.machine()}, "
             f"{len(os.sched_getaffinity(0))} CPUs; torch {torch.__version__}, "
             f"timm {timm.__version__}; load average at end {os.getloadavg()}",
             f"input: {args.count} photo-like JPEGs (10 classes), packed at 256; batch {BATCH}, "
             f"RandomResizedCrop({SIZE}) + flip, {args.workers} workers, median of "
             f"{args.epochs} epochs",
             "", f"{'loader':52} {'images/s':>9} {'x timm':>7} {'CPU us/img':>11}   epochs"]
    for name, values in rates.items():
        median = statistics.median(values)
        lines.append(f"{name:52} {median:9.0f} {median / base:7.2f} "
                     f"{statistics.median(cpu[name]):11.0f}   "
                     + ", ".join(f"{v:.0f}" for v in values))
    emit(lines, args.out)


if __name__ == "__main__":
    main()
