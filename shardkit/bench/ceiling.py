"""The decode ceiling: one process decoding a store's own bytes to the same crops in a tight loop
(no Dataset, no DataLoader), times the number of cores, and that loop in every core at once."""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from typing import Any, Callable

import numpy as np

from ..packing.workers import default_workers
from .read import Fingerprint, repeat
from .systems import BATCH, CROP


def decode_ceiling(path: str, fast: bool, epochs: int, check: bool,
                   min_seconds: float = 0.0) -> dict[str, Any]:
    """One process, tight loop: the store's own bytes to centre crops, no Dataset/DataLoader.

    Crops go to successive places of one batch-sized array, as any loader's must (one reused
    crop-sized buffer would stay in cache and flatter the loop). Also timed: decoding alone.
    """
    from .. import codec
    from ..read.store import Store

    store = Store(path)
    records, shapes, labels = [], [], []
    for k in range(len(store.shards)):
        shard = store.shard(k)
        with shard.reader.records() as get:
            for i in range(shard.entry.count):
                records.append(bytes(get(i)))
                shapes.append((int(shard.heights[i]), int(shard.widths[i])))
                labels.append(int(shard.labels[i]))
    store.close()
    batch = np.zeros((BATCH, CROP, CROP, 3), np.uint8)
    encoding = store.encoding
    fingerprint = Fingerprint() if check else None

    def one_pass(fp: Fingerprint | None) -> float:
        t0 = time.perf_counter()
        for i, (data, (h, w), label) in enumerate(zip(records, shapes, labels)):
            out = batch[i % BATCH]
            codec.decode_crop_into(out, data, encoding, h, w, None, fast)
            if fp is not None:
                fp.add_image(out, label)
        return time.perf_counter() - t0

    def decode_only() -> float:
        t0 = time.perf_counter()
        for data, (h, w) in zip(records, shapes):
            codec.decode(data, encoding, h, w, fast, codec.scratch(h * w * 3))
        return time.perf_counter() - t0

    one_pass(fingerprint)
    cpu0 = time.process_time()
    times = repeat(lambda: one_pass(None), epochs, float, min_seconds)
    cpu = time.process_time() - cpu0
    rate = len(records) / statistics.median(times)
    parallel = _parallel_rate(one_pass, len(records), len(times)) if default_workers() > 1 else None
    decode_times = repeat(decode_only, epochs, float, min_seconds / 2)
    return {"encoding": encoding, "store": os.path.basename(path), "images": len(records),
            "epochs_s": times, "single_core_images_per_s": rate,
            "cpu_us_per_image": cpu / (len(records) * len(times)) * 1e6,
            "cores": default_workers(), "images_per_s": rate * default_workers(),
            "parallel_images_per_s": parallel,
            "decode_only_single_core_images_per_s": len(records) / statistics.median(decode_times),
            "mean_record_bytes": sum(map(len, records)) / max(1, len(records)),
            "digest": fingerprint.digest() if fingerprint else None,
            "labels_digest": fingerprint.labels_digest() if fingerprint else None}


def _parallel_loop(one_pass: Callable, count: int, epochs: int, start: Any, queue: Any) -> None:
    one_pass(None)
    start.wait()
    t0 = time.perf_counter()
    for _ in range(max(1, epochs)):
        one_pass(None)
    queue.put(count * max(1, epochs) / (time.perf_counter() - t0))


def _parallel_rate(one_pass: Callable, count: int, epochs: int) -> float | None:
    """The same tight loop in one forked process per core at once: what the cores really give
    together (shared caches, memory bandwidth, a busy machine). Reported beside cores x one."""
    if not hasattr(os, "fork"):
        return None
    ctx = multiprocessing.get_context("fork")
    start, queue = ctx.Barrier(default_workers()), ctx.Queue()
    procs = [ctx.Process(target=_parallel_loop, args=(one_pass, count, epochs, start, queue))
             for _ in range(default_workers())]
    for proc in procs:
        proc.start()
    try:
        return sum(queue.get(timeout=600) for _ in procs)
    finally:
        for proc in procs:
            proc.join()
