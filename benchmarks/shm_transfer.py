"""Worker batches in memfd memory (``shardkit.collate``) against torch's default collate
(``/dev/shm``): the per-sample transform path, where each batch is stacked once either way.

A store of 256 x 256 JPEG records (64 distinct photo-like images), ``crop=224`` and a per-sample
float transform (``img.float().div_(255)``: 602 KB a sample), batches of 64, two forked workers.
The same dataset is read through ``ds.loader`` (memfd) and through ``DataLoader(ds, ...)`` with
the default collate (/dev/shm), alternately, each pass after one warm-up epoch; prints images/s
per pass and the medians. Run it where /dev/shm is large enough for the default collate.

    python benchmarks/shm_transfer.py [--records 1024] [--passes 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import simplejpeg
from torch.utils.data import DataLoader

import shardkit
from shardkit.bench.sample import photo_like
from shardkit.packing import StoreWriter


def to_float(img):
    return img.float().div_(255)


def build(path: str, records: int) -> None:
    rng = np.random.default_rng(0)
    payloads = [simplejpeg.encode_jpeg(photo_like(rng, 256, 256), quality=90, colorspace="RGB")
                for _ in range(64)]
    root = os.path.join(os.path.dirname(path), "src")
    with StoreWriter(path, ["a", "b"], encoding="jpeg", size=0, source_root=root) as writer:
        for i in range(records):
            writer.add_encoded(payloads[i % 64], i % 2, 256, 256,
                               os.path.join(root, "ab"[i % 2], f"{i:06d}.jpg"))


def rate(loader, records: int) -> float:
    for _ in loader:  # warm-up epoch (workers started, page cache warm)
        pass
    start = time.perf_counter()
    seen = sum(len(labels) for _, labels in loader)
    assert seen == records
    return records / (time.perf_counter() - start)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1024)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.lmdb")
        build(path, args.records)
        ds = shardkit.ShardDataset(path, crop=224, transform=to_float)
        common = dict(batch_size=64, num_workers=2, multiprocessing_context="fork",
                      persistent_workers=True)
        results: dict[str, list[float]] = {"ds.loader (memfd)": [],
                                           "DataLoader default collate (/dev/shm)": []}
        for _ in range(args.passes):
            for name in results:
                loader = (ds.loader(**common) if name.startswith("ds.loader")
                          else DataLoader(ds, worker_init_fn=shardkit.worker_init_fn, **common))
                results[name].append(rate(loader, args.records))
                del loader
        print(f"records {args.records}, crop 224, float transform, batch 64, 2 fork workers; "
              f"load average {os.getloadavg()[0]:.1f}")
        for name, rates in results.items():
            print(f"{name:40s} median {statistics.median(rates):7.0f} img/s  passes "
                  + " ".join(f"{r:.0f}" for r in rates))


if __name__ == "__main__":
    main(sys.argv[1:])
