"""``shardkit bench --memory-records N``: worker memory over a full pass of an N-record store of
tiny records."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from ..formats import FORMATS, SUFFIXES
from .machine import log, machine_info, memory_of, memory_report, worker_pids
from .read import shutdown
from .report import command_line, mb, signed
from .stores import pack_tiny
from .systems import store_of


def memory_main(args: argparse.Namespace) -> int:
    """Pack N tiny records (in a child process, so the parent holds no per-record objects),
    then read them all through a DataLoader and report each worker's memory growth."""
    count = args.memory_records
    workers = [w for w in (args.workers_list or [2]) if w > 0] or [2]
    formats = sorted({store_of(s).split("-")[0] for s in args.systems if store_of(s)},
                     key=FORMATS.index) or list(FORMATS)
    work = args.work_dir or tempfile.mkdtemp(prefix="shardkit-mem-")
    os.makedirs(work, exist_ok=True)
    results = []
    try:
        for fmt in formats:
            path = os.path.join(work, f"tiny-{count}" + SUFFIXES[fmt])
            if not os.path.exists(path):
                t0 = time.perf_counter()
                ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux")
                                                  else "spawn")
                proc = ctx.Process(target=pack_tiny, args=(path, count, 4, fmt))
                proc.start()
                proc.join()
                if proc.exitcode != 0:
                    print("shardkit bench: error: packing the tiny store failed", file=sys.stderr)
                    return 1
                log(f"packed {count} tiny records ({fmt}) in {time.perf_counter() - t0:.1f} s")
            for w in workers:
                results.append(_memory_pass(path, fmt, count, w, args.seed))
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "memory.json"), "w") as f:
            json.dump({"command": command_line(args),
                       "machine": machine_info(), "results": results}, f, indent=1)
        worst = max((r["max_private_dirty_growth_mb"] for r in results
                     if r["max_private_dirty_growth_mb"] is not None), default=None)
        if worst is not None:
            print(f"worker Private_Dirty growth over a full pass: at most +{worst:.2f} MB")
        return 0
    finally:
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _memory_pass(path: str, fmt: str, count: int, w: int, seed: int) -> dict[str, Any]:
    """One shuffled pass with ``w`` workers; worker memory after a few batches and at the end."""
    import torch
    from torch.utils.data import DataLoader

    from .. import ShardDataset, collate, worker_init_fn

    loader = DataLoader(ShardDataset(path, crop=4), batch_size=256, shuffle=True, num_workers=w,
                        persistent_workers=True, collate_fn=collate, worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(seed))
    it = iter(loader)
    n = 0
    for _ in range(min(20, len(loader) // 4)):  # past start-up: imports, store, first buffers
        n += len(next(it)[1])
    before = {pid: memory_of(pid) for pid in worker_pids(loader)}
    t0 = time.perf_counter()
    for _, labels in it:
        n += len(labels)
    seconds = time.perf_counter() - t0
    after = {pid: memory_of(pid) for pid in worker_pids(loader)}
    shutdown(loader)
    mem = memory_report(before, after)
    growth = [p["private_dirty_growth_mb"] for p in mem["processes"]
              if p.get("private_dirty_growth_mb") is not None]
    result = {"format": fmt, "num_workers": w, "records": count, "images_read": n,
              "seconds": seconds, "memory": mem,
              "max_private_dirty_growth_mb": max(growth) if growth else None}
    lines = [f"{fmt}, {count} records, num_workers={w}: one pass in {seconds:.1f} s"]
    for p in mem["processes"]:
        lines.append(f"  worker {p['pid']}: Private_Dirty {mb(p['private_dirty_mb'])} MB "
                     f"({signed(p.get('private_dirty_growth_mb'))}), USS {mb(p['uss_mb'])} MB "
                     f"({signed(p.get('uss_growth_mb'))}), PSS {mb(p['pss_mb'])} MB")
    print("\n".join(lines), flush=True)
    return result
