#!/usr/bin/env python
"""Aspect-ratio buckets: how much the bucket crop cuts, how fast a bucketed store
reads against what training scripts do today, and what bucketing costs at pack time.

Photos: ``shardkit.bench.sample.photo_like`` content at common photo aspect ratios (1:1, 5:4,
4:3, 3:2, 16:9, 2:1 and their portrait turns, each jittered by up to 3 %), the long side 1.2-2x
the bucket side, JPEG quality 90.

1. **Cut**: the mean share of each resized image's pixels that the bucket's centre crop cuts
   (from the records' ``original_size`` and ``target_size`` fields), against the share a square
   centre crop of the same images cuts.
2. **Read**: images/s of ``ds.loader(batch_sampler=BucketSampler(...))`` over the bucketed
   store, against the per-sample path of kohya's sd-scripts and diffusers' examples: PIL opens
   the full-size file, applies its EXIF orientation, resizes it (bilinear, antialiased) to cover
   the same bucket and centre-crops it, then ``torch`` CHW uint8. Same DataLoader settings
   (``--workers``, the same batches from one ``BucketSampler``), rounds alternating, medians.
3. **Pack**: seconds of ``shardkit.pack(buckets=side)`` against a plain ``pack(size=side)`` of
   the same images (the shorter side resized to the bucket side: the same kind of work),
   alternating, medians.

    python benchmarks/buckets.py --out benchmarks/results/buckets.txt
    python benchmarks/buckets.py --images 48 --side 512 --rounds 1   # a quick check
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
import torch
from PIL import Image, ImageOps

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
from shardkit.bench.sample import photo_like

from reports import command_line, emit  # beside this script

RATIOS = (1.0, 5 / 4, 4 / 3, 3 / 2, 16 / 9, 2.0)  # width / height, and each turned portrait


def make_photos(root: str, count: int, side: int, seed: int = 0) -> None:
    """``count`` JPEGs of mixed aspect ratios in 2 class folders."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        ratio = RATIOS[int(rng.integers(len(RATIOS)))] * rng.uniform(0.97, 1.03)
        if rng.random() < 0.4:
            ratio = 1 / ratio
        long = int(side * rng.uniform(1.2, 2.0))
        w, h = (long, round(long / ratio)) if ratio >= 1 else (round(long * ratio), long)
        folder = os.path.join(root, f"c{i % 2}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(photo_like(rng, w, h), "RGB").save(
            os.path.join(folder, f"{i:05d}.jpg"), "JPEG", quality=90)


class PerSample(torch.utils.data.Dataset):
    """Today's training-script path: open the full-size file, orient, resize to cover the
    record's bucket, centre-crop (kohya sd-scripts / diffusers), one sample at a time."""

    def __init__(self, files: list[str], sizes: np.ndarray) -> None:
        self.files, self.sizes = files, sizes

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        bh, bw = (int(v) for v in self.sizes[i])
        with Image.open(self.files[i]) as raw:
            img = ImageOps.exif_transpose(raw).convert("RGB")
        scale = max(bh / img.height, bw / img.width)
        rh, rw = max(bh, round(img.height * scale)), max(bw, round(img.width * scale))
        img = img.resize((rw, rh), Image.Resampling.BILINEAR)
        top, left = (rh - bh) // 2, (rw - bw) // 2
        img = img.crop((left, top, left + bw, top + bh))
        return torch.from_numpy(np.array(img)).permute(2, 0, 1), 0


def read_rate(loader: torch.utils.data.DataLoader) -> float:
    """Images per second of one pass of ``loader``."""
    count = 0
    t0 = time.perf_counter()
    for images, _ in loader:
        count += len(images)
    return count / (time.perf_counter() - t0)


def cpu_ms(read, batches: list[list[int]]) -> float:
    """CPU milliseconds per image of ``read(batch)`` over ``batches`` in this process, one
    torch thread (what one worker spends: less sensitive to other load than images/s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.process_time()
        for batch in batches:
            read(batch)
        return (time.process_time() - t0) * 1e3 / sum(map(len, batches))
    finally:
        torch.set_num_threads(threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=300, help="photos [300]")
    parser.add_argument("--side", type=int, default=1024, help="the bucket side: area side^2 "
                        "[1024]")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers, and pack "
                        "workers [2]")
    parser.add_argument("--batch-size", type=int, default=8, help="[8]")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds [3]")
    parser.add_argument("--work-dir", help="keep the photos and stores here (default: a "
                        "temporary folder, removed afterwards)")
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        src = os.path.join(work, f"photos-{args.images}-{args.side}")
        if not os.path.isdir(src):
            make_photos(src, args.images, args.side)
        bucketed, plain = os.path.join(work, "bucketed.lmdb"), os.path.join(work, "plain.lmdb")

        # 3. pack speed, alternating (the last bucketed pack is the store read below)
        seconds: dict[str, list[float]] = {"bucketed": [], "plain": []}
        for _ in range(args.rounds):
            for name, out, options in (("plain", plain, dict(size=args.side)),
                                       ("bucketed", bucketed, dict(buckets=args.side))):
                t0 = time.perf_counter()
                shardkit.pack(src, out, workers=args.workers, progress=False, overwrite=True,
                              **options)
                seconds[name].append(time.perf_counter() - t0)

        # 1. the share cut
        ds = shardkit.ShardDataset(bucketed, output="bytes", fields=["original_size"])
        original = np.stack([ds[i][1]["original_size"].numpy() for i in range(len(ds))])
        target = ds.bucket_sizes[ds.buckets]
        oh, ow = original[:, 0].astype(float), original[:, 1].astype(float)
        scale = np.maximum(target[:, 0] / oh, target[:, 1] / ow)
        cut = 1 - target[:, 0] * target[:, 1] / (oh * ow * scale ** 2)
        square = 1 - np.minimum(oh, ow) ** 2 / (oh * ow)

        # 2. read throughput, the same batches, alternating
        sampler = shardkit.BucketSampler(shardkit.ShardDataset(bucketed), args.batch_size,
                                         num_replicas=1, rank=0)
        batches = list(sampler)
        store_ds = shardkit.ShardDataset(bucketed)
        files = [os.path.join(src, store_ds.source_path(i)) for i in range(len(ds))]
        store_loader = store_ds.loader(batch_sampler=sampler, num_workers=args.workers)
        base_ds = PerSample(files, target)
        base_loader = torch.utils.data.DataLoader(base_ds, batch_sampler=batches,
                                                  num_workers=args.workers,
                                                  persistent_workers=args.workers > 0)
        read_rate(base_loader)  # warm up: page cache, workers
        read_rate(store_loader)
        rates: dict[str, list[float]] = {"bucketed": [], "per-sample": []}
        cpu: dict[str, list[float]] = {"bucketed": [], "per-sample": []}
        for _ in range(args.rounds):
            rates["per-sample"].append(read_rate(base_loader))
            rates["bucketed"].append(read_rate(store_loader))
            cpu["per-sample"].append(cpu_ms(lambda b: [base_ds[i] for i in b], batches))
            cpu["bucketed"].append(cpu_ms(store_ds.__getitems__, batches))
        hist = np.bincount(ds.buckets, minlength=len(ds.bucket_sizes))
        ds.close()
        store_ds.close()
        if not args.work_dir:
            shutil.rmtree(src, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in rates.items()}
    med.update({f"{k}-pack": statistics.median(v) for k, v in seconds.items()})
    med.update({f"{k}-cpu": statistics.median(v) for k, v in cpu.items()})
    lines = [
        f"# shardkit {shardkit.__version__}, torch {torch.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs; load average "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end",
        f"# {args.images} photos of mixed aspect ratios, long side 1.2-2x {args.side}; buckets "
        f"on {args.side}^2 (step 64): {len(hist)} used, most records in one: {hist.max()}",
        f"# medians of {args.rounds} alternating rounds; {args.workers} workers; batches of "
        f"{args.batch_size}",
        "",
        f"cut by the bucket crop: mean {cut.mean() * 100:.2f} % of the resized pixels, max "
        f"{cut.max() * 100:.2f} %  (target <= 5 %; a square centre crop cuts "
        f"{square.mean() * 100:.1f} %)",
        f"read, bucketed store (BucketSampler, ds.loader): {med['bucketed']:8.1f} images/s, "
        f"{med['bucketed-cpu']:6.2f} CPU ms/image",
        f"read, per-sample open + resize + crop (PIL):      {med['per-sample']:8.1f} images/s, "
        f"{med['per-sample-cpu']:6.2f} CPU ms/image",
        f"  ratio {med['bucketed'] / med['per-sample']:.1f}x images/s, "
        f"{med['per-sample-cpu'] / med['bucketed-cpu']:.1f}x images per CPU second  "
        "(target >= 5x)",
        f"pack, buckets={args.side}: {med['bucketed-pack']:.2f} s; plain size={args.side}: "
        f"{med['plain-pack']:.2f} s",
        f"  bucketed / plain {med['bucketed-pack'] / med['plain-pack']:.3f}  (target <= 1.10)",
    ]
    emit(lines, args.out, command_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
