#!/usr/bin/env python
"""Where the CPU of crop + flip views goes, per image, and the highest "views / one view" ratio
torchvision v2's pixels allow.

Two datasets over the same store: DINO's crop + flip views at decode (2 x 224 at scale (0.4, 1)
and 6 x 96 at (0.05, 0.4), ``RandomHorizontalFlip(0.5)`` each) and one such 224 view. Each reads
every record in batches of 64 as a DataLoader worker does (``__getitems__`` then
``shardkit.collate``), one process, one torch thread, rounds alternating, medians. Timers wrap
the stages inside the read (each timer costs well under a microsecond a call):

- kernel: torch's anti-aliased uint8 resize (``_upsample_bilinear2d_aa``), the kernel v2 runs;
- decode: libjpeg-turbo, whole records and rows of records (``codec.decode``,
  ``partial.decode_rows``);
- box copies: each box copied to dense memory for the kernel, which reads contiguous rows only;
- flips: ``RandomHorizontalFlip`` on each flipped view (torch's flip);
- draws: the crop and flip draws, torch's generator calls in v2's order (``draw_views``);
- the rest: Python per view and per batch, collation.

The floor: views can cost no less than their kernels, their decode, their box copies, their
flips and their draws: v2's work, or the cheapest exact form of it measured (one decode makes a
flipped or an unflipped view free of a separate flip, not both; each draw is one of torch's
generator calls that v2 makes, in its order, about 1.1-2.6 us a call here). The ceiling of the
ratio is one view's whole cost over that floor: what the ratio would be if every other line of
the views (their Python, collation) cost nothing, while one view kept its own.

    .venv-tv/bin/python benchmarks/views_floor.py --out benchmarks/results/views_floor.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter

import numpy as np
import torch

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
from shardkit import ShardDataset, codec
from shardkit import recipes as R
from shardkit.read import augment, cut, partial

from reports import command_line, emit, epoch, sample_store  # beside this script

BATCH = 64
SPENT: Counter = Counter()  # seconds per stage


def timed(owner, name: str, stage: str) -> None:
    """Replace ``owner.name`` by the same function that adds its time to ``stage``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SPENT[stage] += time.perf_counter() - t

    setattr(owner, name, wrapper)


def instrument() -> None:
    timed(torch._C._nn, "_upsample_bilinear2d_aa", "kernel")
    timed(codec, "decode", "decode")
    timed(partial, "decode_rows", "decode")
    timed(cut, "mirror", "flips")
    timed(augment, "draw_views", "draws")
    # the box copy is the one np.copyto of resize_into; the other stages copy with torch
    timed(cut.np, "copyto", "box copies")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=256, help="ImageNet-like photos [256]")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds [7]")
    parser.add_argument("--work-dir", help="keep the images and the store here")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        _, store = sample_store(args.work_dir or tmp, args.sample)
        one = R.RandomResizedCrop(224, (0.4, 1.0), flip=0.5)
        configs = {
            "views (2 x 224 + 6 x 96)": ShardDataset(store, recipe=R.Views(
                [one] * 2 + [R.RandomResizedCrop(96, (0.05, 0.4), flip=0.5)] * 6)),
            "one view (224)": ShardDataset(store, recipe=one),
        }
        instrument()
        stages = ("kernel", "decode", "box copies", "flips", "draws")
        per: dict[str, dict[str, list[float]]] = {
            name: {s: [] for s in (*stages, "the rest", "total")} for name in configs}
        for name, ds in configs.items():  # warm up
            epoch(ds, 0, BATCH)
        for r in range(args.rounds):
            for name, ds in configs.items():
                SPENT.clear()
                _, cpu, _ = epoch(ds, r, BATCH)
                n = len(ds)
                us = {s: SPENT[s] / n * 1e6 for s in stages}
                us["total"] = cpu / n * 1e6
                us["the rest"] = us["total"] - sum(us[s] for s in stages)
                for s, v in us.items():
                    per[name][s].append(v)
        count = len(next(iter(configs.values())))
    med = {name: {s: statistics.median(v) for s, v in d.items()} for name, d in per.items()}
    views, single = med["views (2 x 224 + 6 x 96)"], med["one view (224)"]
    floor = sum(views[s] for s in stages)
    lines = [
        f"# shardkit {shardkit.__version__}, torch {torch.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, one torch thread; load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end",
        f"# {count} photos packed at 256; median of {args.rounds} alternating rounds, every "
        f"record in batches of {BATCH}, one core, exact decode; CPU us per image",
        f"{'stage':14s} {'views':>8s} {'one view':>9s}",
    ]
    for s in (*stages, "the rest", "total"):
        lines.append(f"{s:14s} {views[s]:8.0f} {single[s]:9.0f}")
    lines += [
        f"views / one view, images per CPU second: {single['total'] / views['total']:.2f} "
        "(target >= 0.5)",
        f"floor of the views (kernel + decode + box copies + flips + draws): {floor:.0f} us",
        f"ceiling of the ratio (one view's total / that floor): "
        f"{single['total'] / floor:.2f}",
    ]
    emit(lines, args.out, ".venv-tv/bin/" + command_line().rstrip())
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
