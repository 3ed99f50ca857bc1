"""Masks stored as side records: what a shard open and a mask read cost.

Writes a store of N records with instance masks (noisy: incompressible, the worst case) in each
format, then times, in this process (page cache warm): opening the store's shard (index arrays
checksummed), reading every record's masks through ``fields.value``, and peak Python memory
while writing (tracemalloc). Public API only, so the same script measures an older checkout
(``PYTHONPATH=/path/to/old python benchmarks/mask_records.py``).

    python benchmarks/mask_records.py [--records 2000] [--masks 6] [--out benchmarks/results/mask_records.txt]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc

import numpy as np

import shardkit
from shardkit import fields as F
from shardkit.codec import encode
from shardkit.read.store import Store

H, W = 192, 256


def build(path: str, records: int, masks: int) -> tuple[float, float]:
    """(MiB of mask bytes, peak MiB traced while writing)."""
    rng = np.random.default_rng(0)
    jpeg = encode(np.full((H, W, 3), 90, np.uint8), "jpeg", 90)
    boxes = [[0, 0, W, H]] * masks
    tracemalloc.start()
    with shardkit.StoreWriter(path, ["a"], schema=[F.Boxes("boxes"), F.Masks("masks")]) as w:
        for _ in range(records):
            w.add_encoded(jpeg, 0, H, W, boxes=boxes,
                          masks=rng.integers(0, 2, (masks, H, W), dtype=np.uint8))
        peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return records * masks * H * W / 8 / 2**20, peak / 2**20


def best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--masks", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lines = [f"shardkit {shardkit.__version__} ({os.path.dirname(shardkit.__file__)}), "
             f"{args.records} records x {args.masks} noise masks of {H}x{W}"]
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".lmdb", ".h5"):
            path = os.path.join(tmp, "m" + suffix)
            mib, peak = build(path, args.records, args.masks)

            def open_shard() -> None:
                Store(path).shard(0)

            store = Store(path)
            fields = store.shard(0).fields

            def read_all() -> None:
                for i in range(args.records):
                    fields.value("masks", i)

            open_s, read_s = best(open_shard), best(read_all, 3)
            lines.append(f"  {suffix:5s}: {mib:6.0f} MiB of masks; write peak {peak:6.1f} MiB; "
                         f"shard open {open_s * 1e3:7.1f} ms; masks read "
                         f"{read_s / args.records * 1e6:6.0f} us/record")
            store.close()
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
