#!/usr/bin/env python
"""What an append costs against a full pack: a folder store of ``--count`` images, then 1 % more
images appended (``pack(..., append=True)``), against a fresh pack of all of them.

One process (torch imported once, as in a session that packs repeatedly; the separate start-up of
a ``shardkit pack`` command is in docs/benchmark.md), the default workers; rounds alternate the
two configurations, each from scratch (the store before the append is copied back each round).
Printed: median wall seconds and the CPU seconds of this process and its workers
(``os.times``: user + system, children included), and the ratio append / full for both.

Images: ``shardkit.bench.sample.photo_like`` JPEGs (about 500x375, quality 75-95) in 10 classes;
the appended ones are new files in the same classes.

    python benchmarks/append_cost.py --count 10000 --out benchmarks/results/append_cost.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from PIL import Image

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
from shardkit.bench.sample import image_size, photo_like

from reports import command_line, emit  # beside this script


def make_images(root: str, start: int, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(start, start + count):
        folder = os.path.join(root, f"class{i % 10}")
        os.makedirs(folder, exist_ok=True)
        h, w = image_size(rng)
        Image.fromarray(photo_like(rng, h, w)).save(os.path.join(folder, f"{i:06d}.jpg"),
                                                    quality=int(rng.integers(75, 96)))


def cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - w, cpu() - c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--share", type=float, default=0.01, help="the share appended [0.01]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work-dir", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="append-cost-")
    src, new = os.path.join(work, "src"), max(1, int(args.count * args.share))
    if not os.path.isdir(src):
        make_images(src, 0, args.count - new, 0)
    before = os.path.join(work, "before")
    if not os.path.isdir(before):
        shardkit.pack(src, before, shard_size=64 << 20, progress=False)
    if len(os.listdir(os.path.join(src, "class0"))) * 10 < args.count:
        make_images(src, args.count - new, new, 1)
    full, append = [], []
    for _ in range(args.rounds):
        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        full.append(timed(lambda: shardkit.pack(src, out, shard_size=64 << 20,
                                                progress=False)))
        shutil.rmtree(out)
        shutil.copytree(before, out)
        append.append(timed(lambda: shardkit.pack(src, out, append=True, progress=False)))
        assert len(shardkit.ShardDataset(out)) == args.count
    wall = [statistics.median(w for w, _ in runs) for runs in (full, append)]
    cpus = [statistics.median(c for _, c in runs) for runs in (full, append)]
    lines = [f"# shardkit {shardkit.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, "
             f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end",
             f"# {args.count} images (~500x375 JPEG) packed at 256; append of {new} new ones "
             f"({args.share:.0%}); median of {args.rounds} alternating rounds",
             f"{'':34}{'wall s':>8}{'CPU s':>8}",
             f"{'full pack of every image':34}{wall[0]:8.2f}{cpus[0]:8.2f}",
             f"{'append of the new ones':34}{wall[1]:8.2f}{cpus[1]:8.2f}",
             f"append / full: wall {wall[1] / wall[0]:.1%}, CPU {cpus[1] / cpus[0]:.1%} "
             "(target <= 3 %)"]
    emit(lines, args.out, command_line())


if __name__ == "__main__":
    main()
