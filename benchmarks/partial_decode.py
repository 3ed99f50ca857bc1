#!/usr/bin/env python
"""Decoding only the rows a crop needs: images/s of the centre crop, the random crop and the
recipe (``random_resized`` + flip) on a store packed with row markers (decoded by rows) against
the same images packed without them (as stores were before: decoded whole), and the size cost.

One process, one torch thread, no DataLoader: each configuration reads every record in batches of
64 as a DataLoader worker does (``__getitems__`` then ``shardkit.collate``) under
``torch.manual_seed(round)``; rounds alternate the configurations. Printed per configuration: the
median images/s (wall clock) and the median CPU ms per image (this process's CPU time, less
sensitive to other load on the machine); then per-core ratios from the CPU times.

Images: ImageNet-like photos (``shardkit.bench.sample.make_sample``) packed at 256 (the
default). The store without markers is packed by the same code with ``codec.encode(...,
row_markers=False)``: the same pixels (checked here), no row index.

    python benchmarks/partial_decode.py > benchmarks/results/partial_decode.txt
    python benchmarks/partial_decode.py --fast-decode >> benchmarks/results/partial_decode.txt
"""

from __future__ import annotations

import argparse
import functools
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
import shardkit.packing.encoding as encoding
from shardkit import ShardDataset, codec
from shardkit.bench.sample import make_sample

from reports import time_rounds  # beside this script

BATCH = 64
CROP = 224


def check_crop(images: torch.Tensor) -> None:
    assert images.shape[1:] == (3, CROP, CROP)


def record_bytes(path: str) -> int:
    ds = ShardDataset(path)
    total = 0
    for k in range(len(ds.store.shards)):
        shard = ds.store.shard(k)
        with shard.reader.records() as get:
            total += sum(len(get(i)) for i in range(shard.entry.count))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=512, help="ImageNet-like images [512]")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds [7]")
    parser.add_argument("--fast-decode", action="store_true",
                        help="libjpeg-turbo's fast DCT and upsampling (default: exact)")
    parser.add_argument("--work-dir", help="keep the images and stores here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fast = args.fast_decode
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        src = os.path.join(work, "sample")
        rows, old = os.path.join(work, "rows.lmdb"), os.path.join(work, "old.lmdb")
        if not os.path.isdir(src):
            make_sample(src, args.sample, 10, seed=0, workers=1)
        if not os.path.exists(rows):
            shardkit.pack(src, rows, workers=1, progress=False)
        if not os.path.exists(old):
            plain = encoding.encode
            encoding.encode = functools.partial(codec.encode, row_markers=False)
            try:  # workers=1 encodes in this process
                shardkit.pack(src, old, workers=1, progress=False)
            finally:
                encoding.encode = plain
        assert shardkit.info(rows)["row_markers"] == shardkit.info(old)["count"]
        assert shardkit.info(old)["row_markers"] == 0
        a, b = ShardDataset(rows, output="numpy"), ShardDataset(old, output="numpy")
        assert all((a[i][0] == b[i][0]).all() for i in range(len(a))), "pixels differ"
        size_rows, size_old = record_bytes(rows), record_bytes(old)
        disk_rows, disk_old = (shardkit.info(p)["bytes_on_disk"] for p in (rows, old))
        modes = {"centre crop": dict(crop=CROP),
                 "random crop": dict(crop=CROP, crop_mode="random"),
                 "recipe (random_resized + flip)": dict(crop=CROP, crop_mode="random_resized",
                                                         flip=0.5)}
        configs = {}
        for mode, opts in modes.items():
            configs[f"{mode}, decoded by rows"] = ShardDataset(rows, fast_decode=fast, **opts)
            configs[f"{mode}, decoded whole (no markers)"] = ShardDataset(old, fast_decode=fast,
                                                                          **opts)
        wall, cpu = time_rounds(configs, args.rounds, BATCH, check_crop)
        count = len(a)

    print(f"# python benchmarks/partial_decode.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"# shardkit {shardkit.__version__}, torch {torch.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, one torch thread; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print(f"# {'fast' if fast else 'exact'} JPEG decode; {count} ImageNet-like photos packed at "
          f"256; median of {args.rounds} rounds, batches of {BATCH}, one core")
    print(f"record bytes: with row markers {size_rows}, without {size_old} "
          f"(+{100 * (size_rows / size_old - 1):.2f} %); store on disk {disk_rows} vs "
          f"{disk_old} (+{100 * (disk_rows / disk_old - 1):.2f} %, row index included)")
    print(f"{'configuration':60s} {'images/s':>9s} {'CPU ms/img':>10s}")
    for name in configs:
        print(f"{name:60s} {statistics.median(wall[name]):9.0f} "
              f"{statistics.median(cpu[name]):10.3f}")

    def per_core(x: str, y: str) -> float:
        """x's images per CPU second over y's, round by round, median."""
        return statistics.median(b / a for a, b in zip(cpu[x], cpu[y]))

    for mode in modes:
        print(f"images per CPU second, {mode}: by rows / whole = "
              f"{per_core(f'{mode}, decoded by rows', f'{mode}, decoded whole (no markers)'):.3f}")
    recipe, crop = "recipe (random_resized + flip)", "random crop"
    print(f"images per CPU second, recipe / plain random crop: with row markers "
          f"{per_core(f'{recipe}, decoded by rows', f'{crop}, decoded by rows'):.3f}, without "
          f"{per_core(f'{recipe}, decoded whole (no markers)', f'{crop}, decoded whole (no markers)'):.3f}; "
          f"recipe by rows / random crop without markers (today) "
          f"{per_core(f'{recipe}, decoded by rows', f'{crop}, decoded whole (no markers)'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
