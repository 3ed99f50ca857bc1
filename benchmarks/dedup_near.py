#!/usr/bin/env python
"""Near-duplicate detection at pack time (``shardkit pack --dedup near``): recall on planted
near-duplicates, false pairs between distinct images, and what it costs the pack.

Corpus: COUNT ImageNet-like photo JPEGs (``shardkit.bench.sample.make_sample``: mean area
about 500x375, quality 75-95, 100 classes) plus 5 % planted near-duplicates of randomly chosen
originals, in the original's class folder and named after it in the sources' order (so the
original is the one kept), each one of: re-encoded at quality 40-70, resized by 10-20 %, or
cropped by 2-5 % of each side's length (split at random between the two ends), then saved at
quality 85.

1. Distances: every source's pHash as ``pack --dedup near`` computes it (decode, orient,
   resize to 256, :func:`shardkit.dedup.thumbnail`, hashed HASH_BATCH at a time by
   :func:`shardkit.dedup.phash_many` as the encoding workers do), then, for each threshold, the planted pairs
   found (recall) and the pairs of distinct images within it (false pairs: as a share of all
   distinct pairs, and of the pairs reported), by exact Hamming search.
2. Cost, CPU: the pack's per-image work (``load_rgb`` + JPEG q90 encode) against the pHash,
   this process's CPU seconds (``time.process_time``, one torch thread), so load from other
   processes barely moves it.
3. Cost of the whole pack: ``shardkit.pack`` of the corpus to a single-file store without and
   with ``dedup="near"``, alternating, ROUNDS each: CPU seconds of this process and its encoding
   workers (``getrusage``: self and reaped children; the hashes, the search in the packing
   process and everything else the pack does), and the wall clock; and the store with dedup
   checked: its dropped records against the planted ones.

    python benchmarks/dedup_near.py --count 10000 --dir /tmp/dedup-bench \
        > benchmarks/results/dedup_near.txt
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import resource
import sys
import time

import numpy as np
import torch
from PIL import Image

import shardkit
from shardkit.bench.sample import make_sample
from shardkit.codec import encode
from shardkit.dedup import DEFAULT_THRESHOLD, cross_pairs, phash_many, thumbnail
from shardkit.packing.dedup_run import HASH_BATCH
from shardkit.packing.imaging import load_rgb

KINDS = ("reencoded", "resized", "cropped")


def plant(path: str, kind: str, rng: np.random.Generator) -> str:
    im = Image.open(path).convert("RGB")
    w, h = im.size
    quality = 85
    if kind == "reencoded":
        quality = int(rng.integers(40, 71))
    elif kind == "resized":
        s = 1 - rng.uniform(0.10, 0.20)
        im = im.resize((round(w * s), round(h * s)), Image.Resampling.BICUBIC)
    else:
        fx, fy = rng.uniform(0.02, 0.05, size=2)
        dx, dy = round(w * fx), round(h * fy)
        left, top = int(rng.integers(0, dx + 1)), int(rng.integers(0, dy + 1))
        im = im.crop((left, top, w - (dx - left), h - (dy - top)))
    stem = os.path.splitext(os.path.basename(path))[0]
    out = os.path.join(os.path.dirname(path), f"zz_{stem}_{kind}.JPEG")
    im.save(out, "JPEG", quality=quality)
    return out


def make_corpus(root: str, count: int, seed: int) -> dict[str, str]:
    """The corpus under ``root``; {planted path: its original}, both relative to ``root``."""
    listing = os.path.join(root, "planted.json")
    if os.path.exists(listing):
        with open(listing) as f:
            return json.load(f)
    make_sample(root, count, 100, seed=seed)
    originals = sorted(glob.glob(os.path.join(root, "*", "*.JPEG")))
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(originals), size=count // 20, replace=False)
    planted = {}
    for n, i in enumerate(sorted(chosen)):
        made = plant(originals[i], KINDS[n % 3], rng)
        planted[os.path.relpath(made, root)] = os.path.relpath(originals[i], root)
    with open(listing, "w") as f:
        json.dump(planted, f)
    return planted


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its reaped children (the workers)."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10_000, help="original images [10000]")
    ap.add_argument("--dir", default="/tmp/dedup-bench", help="where the corpus is made/kept")
    ap.add_argument("--rounds", type=int, default=3, help="packs of each kind [3]")
    ap.add_argument("--workers", type=int, default=None, help="encoding workers [all CPUs]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    src = os.path.join(args.dir, "src")
    planted = make_corpus(src, args.count, args.seed)
    paths = sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, "*", "*.JPEG")))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}, shardkit {shardkit.__version__}")
    print(f"corpus: {len(paths)} sources ({len(paths) - len(planted)} originals + "
          f"{len(planted)} planted: " + ", ".join(
              f"{sum(p.endswith(k + '.JPEG') for p in planted)} {k}" for k in KINDS) + ")")

    # 1 and 2: distances and CPU per image.
    hashes = np.empty(len(paths), dtype=np.uint64)
    work = hashing = 0.0
    thumbs = []
    for i, rel in enumerate(paths):
        with open(os.path.join(src, rel), "rb") as f:
            data = f.read()
        t0 = time.process_time()
        pixels = load_rgb(data, 256)
        encode(pixels, "jpeg", 90)
        t1 = time.process_time()
        thumbs.append(thumbnail(pixels))  # as an encoding worker: each record's thumbnail,
        if len(thumbs) == HASH_BATCH or i == len(paths) - 1:  # then a batch's hashes
            hashes[i + 1 - len(thumbs):i + 1] = phash_many(np.stack(thumbs))
            thumbs = []
        t2 = time.process_time()
        work, hashing = work + t1 - t0, hashing + t2 - t1
    print(f"CPU per image: pack work (load_rgb + encode) {work / len(paths) * 1e3:.2f} ms, "
          f"pHash {hashing / len(paths) * 1e3:.3f} ms ({hashing / work:.1%} of the work)")
    index = {rel: i for i, rel in enumerate(paths)}
    group = {rel: planted.get(rel, rel) for rel in paths}  # an image and its planted copies
    dist = {}
    t0 = time.perf_counter()
    found = cross_pairs(hashes, hashes, 16)
    search = time.perf_counter() - t0
    planted_d = {p: int(np.bitwise_count(hashes[index[p]] ^ hashes[index[o]]))
                 for p, o in planted.items()}
    false = [d for i, j, d in found if i < j and group[paths[i]] != group[paths[j]]]
    same = [d for i, j, d in found if i < j and group[paths[i]] == group[paths[j]]]
    all_pairs = len(paths) * (len(paths) - 1) // 2
    print(f"all-pairs search of {len(paths)} hashes within 16 bits: {search:.2f} s")
    print("threshold  recall  (reencoded resized cropped)  false pairs  of all pairs  "
          "of reported")
    for t in range(4, 17, 2):
        rec = {k: np.mean([d <= t for p, d in planted_d.items() if p.endswith(k + ".JPEG")])
               for k in KINDS}
        nf = sum(d <= t for d in false)
        reported = nf + sum(d <= t for d in same)
        print(f"{t:>9}  {np.mean([d <= t for d in planted_d.values()]):6.1%}  "
              f"({rec['reencoded']:.1%} {rec['resized']:.1%} {rec['cropped']:.1%})  "
              f"{nf:>11}  {nf / all_pairs:12.2e}  {nf / max(reported, 1):11.2%}"
              + ("   <- default" if t == DEFAULT_THRESHOLD else ""))
    dist = {k: np.percentile([d for p, d in planted_d.items() if p.endswith(k + ".JPEG")],
                             [50, 95, 100]).tolist() for k in KINDS}
    print("planted distances, median/95th/max: " + ", ".join(
        f"{k} {'/'.join(f'{v:.0f}' for v in vs)}" for k, vs in dist.items()))

    # 3: the pack itself, without and with dedup, alternating.
    times: dict[str, list[float]] = {"none": [], "near": []}
    cpu: dict[str, list[float]] = {"none": [], "near": []}
    out = os.path.join(args.dir, "out.lmdb")
    result = None
    for _ in range(args.rounds):
        for mode in ("none", "near"):
            before = cpu_seconds()
            r = shardkit.pack(src, out, overwrite=True, progress=False, workers=args.workers,
                              **({"dedup": "near"} if mode == "near" else {}))
            cpu[mode].append(cpu_seconds() - before)
            times[mode].append(r.seconds)
            if mode == "near":
                result = r
    base, near = np.median(cpu["none"]), np.median(cpu["near"])
    print(f"pack CPU seconds (this process + workers), median of {args.rounds}: without "
          f"{base:.1f} s, with --dedup near {near:.1f} s ({near / base - 1:+.1%}); runs: "
          + "; ".join(f"{k} " + " ".join(f"{t:.1f}" for t in v) for k, v in cpu.items()))
    base, near = np.median(times["none"]), np.median(times["near"])
    print(f"pack wall clock, median of {args.rounds}: without {base:.1f} s, with --dedup near "
          f"{near:.1f} s ({near / base - 1:+.1%}); runs: " + "; ".join(
              f"{k} " + " ".join(f"{t:.1f}" for t in v) for k, v in times.items()))
    with open(out + ".dedup.json") as f:
        report = json.load(f)
    pairs = {(p["kept"], p["dropped"]) for p in report["pairs"]}
    hit = sum((o, p) in pairs for p, o in planted.items())
    wrong = sum(group[k] != group[d] for k, d in pairs)
    print(f"pack --dedup near (threshold {report['threshold']}): {result.count} kept, "
          f"{report['dropped']} dropped; planted dropped as duplicates of their original: "
          f"{hit}/{len(planted)} ({hit / len(planted):.1%}); pairs of distinct images: {wrong}")
    os.remove(out)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
