#!/usr/bin/env python
"""How hard the benchmark's sample images are to decode, against a real photo.

    python benchmarks/decode_realism.py                 # 200 sample images, 25 rounds
    python benchmarks/decode_realism.py --sample 500 --out benchmarks/results/decode_realism.txt

A flat image (one grey level) decodes fastest; real photos decode at a fraction of its speed.
This packs matplotlib's ``grace_hopper.jpg`` (a real photograph, 512x600) and ``--sample``
photo-like images (``shardkit.bench.sample``, as ``--sample`` in throughput.py) with
``shardkit.pack`` (shorter side 256, q90, as the benchmark's stores), then times libjpeg-turbo
(simplejpeg, the decode ``ShardDataset`` uses, exact and ``fast_decode``) on each stored record
against a flat image of the same size encoded the same way, and prints decode speed as a
fraction of the flat image's: the figure benchmarks/README.md quotes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import simplejpeg

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
from shardkit.bench.sample import make_sample
from reports import command_line, emit  # beside this script


def _decode_seconds(data: bytes, fast: bool) -> float:
    t = time.perf_counter()
    simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast, fastupsample=fast)
    return time.perf_counter() - t


def speed_vs_flat(record: bytes, rounds: int, fast: bool) -> float:
    """Decode speed of ``record`` as a fraction of a flat image's of the same size and encoding.
    The two decodes alternate and each keeps its best of ``rounds`` (the least disturbed by
    other load), so a drift in the machine's speed hits both alike."""
    h, w = simplejpeg.decode_jpeg_header(record)[:2]
    flat = simplejpeg.encode_jpeg(np.full((h, w, 3), 128, np.uint8), quality=90,
                                  colorsubsampling="420")
    best_flat = best_record = float("inf")
    for _ in range(rounds):
        best_flat = min(best_flat, _decode_seconds(flat, fast))
        best_record = min(best_record, _decode_seconds(record, fast))
    return best_flat / best_record


def records(src: str, out: str) -> list[bytes]:
    """The stored records of ``src`` packed into the new store ``out``."""
    shardkit.pack(src, out, size=256, quality=90, workers=1, progress=False)
    ds = shardkit.ShardDataset(out, output="bytes")
    try:
        return [ds[i][0] for i in range(len(ds))]
    finally:
        ds.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=200, help="photo-like images [200]")
    parser.add_argument("--rounds", type=int, default=25, help="timings per image [25]")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    import matplotlib.cbook

    photo = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    work = tempfile.mkdtemp(prefix="decode-realism-")
    try:
        real = os.path.join(work, "real", "photo")
        os.makedirs(real)
        shutil.copy(photo, real)
        make_sample(os.path.join(work, "sample"), args.sample, classes=4, seed=0, workers=1)
        real_record = records(os.path.dirname(real), work + "/real.lmdb")[0]
        sample_records = records(os.path.join(work, "sample"), work + "/sample.lmdb")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"decode speed as a fraction of a flat image of the same size (q90 4:2:0, "
             f"simplejpeg {simplejpeg.__version__}, best of {args.rounds}), records packed "
             "at 256:"]
    for fast in (False, True):
        mode = "fast_decode" if fast else "exact decode"
        real_ratio = speed_vs_flat(real_record, args.rounds, fast)
        ratios = np.array([speed_vs_flat(r, args.rounds, fast) for r in sample_records])
        q1, median, q3 = np.percentile(ratios, [25, 50, 75])
        lines.append(f"  {mode:12s}: grace_hopper.jpg {real_ratio:.2f}; "
                     f"{len(ratios)} sample images median {median:.2f} "
                     f"(quartiles {q1:.2f}-{q3:.2f}, min {ratios.min():.2f}, "
                     f"max {ratios.max():.2f})")
    lines.append(f"load average at the end: {os.getloadavg()[0]:.1f}")
    emit(lines, args.out, command=command_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
