"""Read throughput of the new ShardSampler over the default (mixed) layout, against the
ShardSampler of an earlier commit (before the elastic order) over the source-order layout of the
same images: the issue's target is "within 5 %".

One store of each layout is packed from the same photo-like sample (``shardkit.bench.sample``),
then each configuration runs whole epochs through a real DataLoader (2 workers, crop 224 at
decode, ``shardkit.collate``, batch 64), in rounds that alternate the configurations so that load
from other processes falls on all of them alike; the median round is reported.

    python benchmarks/sampling.py --images 3000 --shards 24 --rounds 5 \\
        --out benchmarks/results/sampling.txt

The earlier sampler is read from git (``--baseline-commit``, default the commit before the
elastic order) and imported in place of today's, so both run on today's ShardDataset.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader

import shardkit
from shardkit.bench.sample import make_sample
from reports import emit  # beside this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def baseline_sampler(commit: str):
    """``ShardSampler`` as it was at ``commit`` (its module text from git, imported as a sibling
    of today's sampler so its relative imports resolve)."""
    text = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:shardkit/read/sampler.py"],
                          check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "baseline_sampler.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("shardkit.read.baseline_sampler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ShardSampler


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (the DataLoader's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def epoch_rate(ds, sampler, epoch: int) -> tuple[float, float]:
    """(images per second of wall time after the first batch, images per CPU-second over the
    whole epoch, workers' start included): the second hardly moves with other processes' load."""
    sampler.set_epoch(epoch)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=2,
                        collate_fn=shardkit.collate, worker_init_fn=shardkit.worker_init_fn,
                        multiprocessing_context="fork")
    c0 = _cpu()
    it = iter(loader)
    first = len(next(it)[0])  # workers started and warm: time the rest of the epoch
    t0, n = time.perf_counter(), 0
    for images, _ in it:
        n += len(images)
    wall = n / (time.perf_counter() - t0)
    del it  # workers exit (and are reaped) at the end of the epoch
    return wall, (n + first) / (_cpu() - c0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--shards", type=int, default=24)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--baseline-commit", default="684f70a")
    p.add_argument("--work", default=None, help="folder for the sample and stores (temp)")
    p.add_argument("--out", default=None, help="also write the report here")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="shardkit-sampling-")
    src = os.path.join(work, "src")
    if not os.path.isdir(src):
        make_sample(src, args.images, classes=50, seed=1)
    stores = {}
    for order in ("source", "mixed"):
        stores[order] = os.path.join(work, order)
        if not os.path.isdir(stores[order]):
            shardkit.pack(src, stores[order], num_shards=args.shards, order=order,
                          progress=False)
    Old = baseline_sampler(args.baseline_commit)
    configs = {
        f"ShardSampler@{args.baseline_commit}, source layout":
            lambda: (shardkit.ShardDataset(stores["source"], crop=224), Old),
        "ShardSampler (today), source layout":
            lambda: (shardkit.ShardDataset(stores["source"], crop=224), shardkit.ShardSampler),
        "ShardSampler (today), mixed layout":
            lambda: (shardkit.ShardDataset(stores["mixed"], crop=224), shardkit.ShardSampler),
    }
    rates: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name, make in configs.items():
            ds, cls = make()
            wall, per_cpu = epoch_rate(ds, cls(ds, 1, 0, seed=0), r)
            rates[name].append(wall)
            cpu[name].append(per_cpu)
            ds.close()
    lines = [f"sampling benchmark: {args.images} images, {args.shards} shards, crop 224 at "
             f"decode, batch 64, 2 fork workers, {args.rounds} rounds (median); "
             f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
             f"{os.getloadavg()[0]:.1f}",
             f"command: python benchmarks/sampling.py --images {args.images} --shards "
             f"{args.shards} --rounds {args.rounds}"]
    first = next(iter(configs))
    base, base_cpu = statistics.median(rates[first]), statistics.median(cpu[first])
    for name, got in rates.items():
        med, med_cpu = statistics.median(got), statistics.median(cpu[name])
        lines.append(f"{name:45s} {med:7.0f} img/s wall ({med / base:.3f}x), {med_cpu:6.0f} "
                     f"img per CPU-second ({med_cpu / base_cpu:.3f}x); wall rounds: "
                     f"{', '.join(f'{x:.0f}' for x in got)}")
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
