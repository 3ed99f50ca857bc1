#!/usr/bin/env python
"""The thread engine against the process engine: images/s, data wait behind a step, memory of
the process tree, and how much of a batch's time holds the GIL (issue 26, points 4 and targets).

One run on one machine, the systems alternating round by round (drift in the machine's speed
hits all of them), medians and ratios reported:

(a) **images/s**: ``ds.loader(64, shuffle=True, engine="threads", num_threads=N)`` for each N
    of ``--threads`` against ``ds.loader(64, shuffle=True, num_workers=W)`` (the process engine,
    persistent workers) for each W of ``--workers``, on the random-crop path (``crop=224,
    crop_mode="random", flip=0.5``) and the recipe path (``crop_mode="random_resized",
    flip=0.5``); one warm-up epoch per loader, then ``--repeat`` rounds of one epoch each.
    Ratio: each engine's best setting (median images/s), thread / process.
(b) **data wait**: each engine at its best setting with a step that frees the CPU after every
    batch, ``time.sleep`` of ``--step-factor`` (1.3) x the data time of a batch (64 over the
    better engine's images/s): the share of the epoch the loop waited in ``next()``, with and
    without each epoch's first batch (which no loader prefetches).
(c) **memory**: each engine at its best setting in a fresh Python process (the training
    process: imports, loader, ``--memory-epochs`` epochs); PSS summed over that process and its
    children (psutil ``memory_full_info().pss``), sampled every 0.1 s during the epochs; peak.
(d) **the GIL** (:mod:`shardkit.bench.gil`): one epoch of the thread engine at 1 thread and at
    its best setting, measured two ways: the probe (a thread sleeping 0.1-0.5 ms, the share of
    its wakes that found the GIL held) and the CPU split (per thread, CPU time inside the
    GIL-releasing calls against the rest, Python). Reported: the share of wall time the GIL is
    held, Python µs per batch, the Python share of a batch's work ``s`` and what it implies:
    at most about ``1 / s`` threads are useful in one process, and one process cannot pass
    ``64 / (Python seconds per batch)`` images/s however many cores it has.

    python benchmarks/thread_engine.py --sample 3000 --repeat 5   # the README's figures
    python benchmarks/thread_engine.py --sample 500 --repeat 2    # a quick look

The store: ``--sample`` photo-like JPEGs (:mod:`shardkit.bench.sample`, as the other benchmarks
make them) packed at 256 (LMDB, JPEG records), in ``--work-dir`` (kept) or a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(HERE, ".."))
    import shardkit
sys.path.insert(0, HERE)
from reports import command_line, emit, positive_ints  # noqa: E402  (beside this script)

BATCH = 64
PATHS = {
    "random crop": {"crop": 224, "crop_mode": "random", "flip": 0.5},
    "recipe": {"crop": 224, "crop_mode": "random_resized", "flip": 0.5},
}


def build_parser() -> argparse.ArgumentParser:
    from shardkit.integrations.thread_engine import default_threads

    cores = default_threads()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=int, default=3000, help="photo-like images [3000]")
    p.add_argument("--repeat", type=int, default=5, help="timed rounds [5]")
    p.add_argument("--threads", type=positive_ints, default=[cores, 2 * cores],
                   help=f"num_threads values of the thread engine [{cores},{2 * cores}]")
    p.add_argument("--workers", type=positive_ints, default=[1, 2, 4],
                   help="num_workers values of the process engine [1,2,4]")
    p.add_argument("--paths", default=",".join(PATHS),
                   help=f"which read paths, of: {', '.join(PATHS)} [all]")
    p.add_argument("--step-factor", type=float, default=1.3,
                   help="the sleeping step, in data times of a batch [1.3]")
    p.add_argument("--memory-epochs", type=int, default=2, help="epochs of the memory runs [2]")
    p.add_argument("--fast-decode", action="store_true", help="fast_decode=True (default: exact)")
    p.add_argument("--work-dir", help="keep the sample and the store here")
    p.add_argument("--out", default=os.path.join(HERE, "results", "thread_engine.txt"),
                   help="the report, also printed [benchmarks/results/thread_engine.txt]; "
                        "'-': print only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-child", nargs=4, metavar=("STORE", "PATH", "ENGINE", "N"),
                   help=argparse.SUPPRESS)  # internal: one memory run, in a fresh process
    return p


# -- loaders and epochs -----------------------------------------------------------------------------

def make_loader(store: str, path: str, engine: str, n: int, seed: int, fast: bool) -> Any:
    import torch

    ds = shardkit.ShardDataset(store, fast_decode=fast, **PATHS[path])
    generator = torch.Generator().manual_seed(seed)
    if engine == "threads":
        return ds.loader(BATCH, shuffle=True, engine="threads", num_threads=n, generator=generator)
    return ds.loader(BATCH, shuffle=True, num_workers=n, generator=generator)


def close_loader(loader: Any) -> None:
    import gc

    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    gc.collect()


@dataclass
class Epoch:
    images: int
    seconds: float
    waits: list[float] = field(default_factory=list)  # seconds in next(), batch by batch

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds

    def wait_share(self, skip_first: bool = False) -> float:
        waits = self.waits[1:] if skip_first else self.waits
        return sum(waits) / self.seconds


def run_epoch(loader: Any, step: float = 0.0, each: Any = None) -> Epoch:
    """One epoch: wall time, images, and the time the loop waited in ``next()`` per batch
    (the first wait includes making the iterator, where a loader starts its epoch)."""
    clock = time.perf_counter
    t0 = clock()
    it = iter(loader)
    waits, images = [], 0
    while True:
        t = clock() if waits else t0
        try:
            batch, labels = next(it)
        except StopIteration:
            break
        waits.append(clock() - t)
        if batch.shape[1:] != (3, 224, 224):
            raise AssertionError(f"unexpected batch shape {tuple(batch.shape)}")
        images += len(labels)
        if step:
            time.sleep(step)
        if each is not None:
            each()
    return Epoch(images, clock() - t0, waits)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- (c) memory in a fresh process ------------------------------------------------------------------

def memory_child(store: str, path: str, engine: str, n: int, epochs: int, fast: bool) -> None:
    loader = make_loader(store, path, engine, n, 0, fast)
    print("epochs", flush=True)
    for _ in range(epochs):
        run_epoch(loader)
    print("done", flush=True)
    close_loader(loader)


def tree_pss(proc: Any) -> float | None:
    """PSS of ``proc`` and all its children, MB (processes that end meanwhile are skipped)."""
    import psutil

    total, seen = 0.0, False
    try:
        family = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return None
    for p in family:
        try:
            total += p.memory_full_info().pss
            seen = True
        except psutil.Error:
            pass
    return total / 2**20 if seen else None


def memory_run(store: str, path: str, engine: str, n: int, args: argparse.Namespace) -> dict:
    """Peak and median PSS of a fresh training process's tree during its epochs."""
    import psutil

    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", store, path, engine,
           str(n), "--memory-epochs", str(args.memory_epochs)] + (
        ["--fast-decode"] if args.fast_decode else [])
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    started, finished = threading.Event(), threading.Event()

    def read() -> None:
        for line in child.stdout:
            if line.strip() == "epochs":
                started.set()
            elif line.strip() == "done":
                finished.set()
        started.set()
        finished.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started.wait()
    proc, samples = psutil.Process(child.pid), []
    while not finished.wait(0.1):
        pss = tree_pss(proc)
        if pss is not None:
            samples.append(pss)
    if child.wait() != 0:
        raise RuntimeError(f"memory run failed: {' '.join(cmd)}")
    return {"peak_mb": max(samples, default=float("nan")), "median_mb": median(samples),
            "samples": len(samples)}


# -- (d) the GIL ------------------------------------------------------------------------------------

def gil_epoch(loader: Any, calibration: Any) -> dict:
    from shardkit.bench import gil

    with gil.measured(calibration) as (probe, split):
        epoch = run_epoch(loader, each=split.sample_threads)
    reading = probe.reading()
    batches = len(epoch.waits)
    held, released = split.held_seconds(), split.released_seconds()
    return {"images_per_s": epoch.images_per_s, "probe_held_share": reading.held_share,
            "probe_wait_share": reading.wait_share, "probe_wakes": reading.wakes,
            "split_held_share": split.held_share(),
            "python_us_per_batch": held / batches * 1e6,
            "released_us_per_batch": released / batches * 1e6,
            "python_share_of_work": held / (held + released) if held + released else 0.0}


# -- the run ----------------------------------------------------------------------------------------

def prepare_store(work: str, count: int, seed: int) -> str:
    from shardkit.bench.sample import make_sample
    from shardkit.integrations.thread_engine import default_threads

    src, store = os.path.join(work, "sample"), os.path.join(work, f"sample{count}-256.lmdb")
    if not os.path.isdir(src):
        make_sample(src, count, 10, seed=seed)
    if not os.path.exists(store):
        shardkit.pack(src, store, size=256, workers=default_threads(), progress=False)
    return store


def bench(args: argparse.Namespace, store: str, paths: list[str]) -> list[str]:
    import torch

    from shardkit.bench import gil

    settings = [("threads", n) for n in args.threads] + [("processes", w) for w in args.workers]
    name = {("threads", n): f"threads, num_threads={n}" for n in args.threads}
    name.update({("processes", w): f"processes, num_workers={w}" for w in args.workers})
    out = [f"$ {command_line()}",
           f"# shardkit {shardkit.__version__}, torch {torch.__version__}, Python "
           f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs "
           f"(affinity {len(os.sched_getaffinity(0))}); load average "
           f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the start",
           f"# store: {args.sample} photo-like JPEGs packed at 256 (LMDB), batch {BATCH}, "
           f"shuffled, {'fast' if args.fast_decode else 'exact'} decode; {args.repeat} rounds "
           "alternating the settings after one warm-up epoch each; medians"]
    report: dict[str, Any] = {}
    for path in paths:
        # (a) images/s, settings alternating round by round
        loaders = {s: make_loader(store, path, *s, args.seed, args.fast_decode) for s in settings}
        for loader in loaders.values():
            run_epoch(loader)
        rates: dict[tuple, list[float]] = {s: [] for s in settings}
        for _ in range(args.repeat):
            for s, loader in loaders.items():
                rates[s].append(run_epoch(loader).images_per_s)
        best = {engine: max((s for s in settings if s[0] == engine),
                            key=lambda s: median(rates[s])) for engine in ("threads", "processes")}
        out.append(f"\n## {path}: ShardDataset({', '.join(f'{k}={v!r}' for k, v in PATHS[path].items())})")
        out.append(f"{'setting':32s} {'images/s':>9s}   rounds")
        for s in settings:
            out.append(f"{name[s]:32s} {median(rates[s]):9.0f}   "
                       + " ".join(f"{r:.0f}" for r in rates[s]))
        t_best, p_best = median(rates[best["threads"]]), median(rates[best["processes"]])
        per_round = [t / p for t, p in zip(rates[best["threads"]], rates[best["processes"]])]
        out.append(f"thread engine / process engine, best settings ({name[best['threads']]} / "
                   f"{name[best['processes']]}): {t_best / p_best:.2f} (per round: "
                   f"{' '.join(f'{r:.2f}' for r in per_round)}; target >= 0.95)")
        # (b) data wait behind a sleeping step of 1.3 x the data time of a batch
        step = args.step_factor * BATCH / max(t_best, p_best)
        waits: dict[str, list[Epoch]] = {"threads": [], "processes": []}
        for _ in range(args.repeat):
            for engine in waits:
                waits[engine].append(run_epoch(loaders[best[engine]], step))
        out.append(f"data wait behind a {step * 1e3:.1f} ms sleeping step ({args.step_factor} x "
                   f"{BATCH / max(t_best, p_best) * 1e3:.1f} ms, a batch's data time), share of "
                   "the epoch in next() (target <= 2 %):")
        for engine, epochs in waits.items():
            whole = median([e.wait_share() for e in epochs])
            steady = median([e.wait_share(skip_first=True) for e in epochs])
            first = median([e.waits[0] * 1e3 for e in epochs])
            out.append(f"  {name[best[engine]]:32s} {whole:6.1%} of the epoch; {steady:6.1%} "
                       f"without its first batch (first batch {first:.0f} ms)")
        # (d) the GIL: thread engine at 1 thread and at its best setting
        for loader in loaders.values():
            close_loader(loader)
        loaders.clear()
        calibration = gil.calibrate()
        out.append(f"GIL (probe calibrated beside {calibration.load_threads} GIL-free busy "
                   f"threads: median lateness {calibration.median_us:.0f} µs, a wake later than "
                   f"{calibration.threshold_us:.0f} µs counts as held):")
        gil_rows = {}
        for n in sorted({1, best["threads"][1]}):
            loader = make_loader(store, path, "threads", n, args.seed, args.fast_decode)
            run_epoch(loader)
            gil_rows[n] = row = gil_epoch(loader, calibration)
            close_loader(loader)
            out.append(f"  num_threads={n:<3d} {row['images_per_s']:7.0f} images/s; GIL held "
                       f"{row['probe_held_share']:5.1%} of the time (probe; {row['probe_wakes']} "
                       f"wakes), {row['split_held_share']:5.1%} (CPU split); per batch "
                       f"{row['python_us_per_batch']:6.0f} µs Python, "
                       f"{row['released_us_per_batch']:6.0f} µs GIL released: Python "
                       f"{row['python_share_of_work']:5.1%} of the work")
        one = gil_rows[1]
        share = one["python_share_of_work"]
        limit = BATCH / (one["python_us_per_batch"] * 1e-6)
        out.append(f"  => the GIL bounds one process at about 1 / {share:.3f} = {1 / share:.1f} "
                   f"busy threads and {limit:,.0f} images/s (64 / {one['python_us_per_batch']:.0f} "
                   f"µs of Python per batch); a 16-core node: "
                   + (f"the cores bind first (16 < {1 / share:.1f})" if 1 / share >= 16 else
                      f"the GIL binds first, at about {1 / share:.0f} of its 16 cores"))
        report[path] = {"rates": {name[s]: rates[s] for s in settings},
                        "best": {e: name[s] for e, s in best.items()},
                        "ratio": t_best / p_best, "step_s": step,
                        "wait": {e: [{"share": ep.wait_share(), "steady": ep.wait_share(True)}
                                     for ep in eps] for e, eps in waits.items()},
                        "gil": gil_rows}
        # (c) memory, on the random-crop path (the recipe's loaders hold the same)
        if path == paths[0]:
            mem = {e: memory_run(store, path, *best[e], args) for e in ("threads", "processes")}
            report["memory"] = mem
            out.append(f"memory, a fresh process per engine, {args.memory_epochs} epochs, PSS of "
                       "the process tree sampled every 0.1 s (target: threads <= 0.6 x processes):")
            for e, m in mem.items():
                out.append(f"  {name[best[e]]:32s} peak {m['peak_mb']:7.0f} MB, median "
                           f"{m['median_mb']:7.0f} MB ({m['samples']} samples)")
            out.append(f"  threads / processes, peak: "
                       f"{mem['threads']['peak_mb'] / mem['processes']['peak_mb']:.2f}")
    out.append(f"# load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    if args.out != "-":
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"command": command_line(), "report": report}, f, indent=1, default=str)
    return out


def main() -> int:
    args = build_parser().parse_args()
    if args.memory_child:
        store, path, engine, n = args.memory_child
        memory_child(store, path, engine, int(n), args.memory_epochs, args.fast_decode)
        return 0
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        build_parser().error(f"--paths: unknown {unknown}; choose from {list(PATHS)}")
    if args.sample < BATCH or args.repeat < 1:
        build_parser().error("--sample must be >= 64 and --repeat >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        os.makedirs(work, exist_ok=True)
        store = prepare_store(work, args.sample, args.seed)
        lines = bench(args, store, paths)
    emit(lines, None if args.out == "-" else args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
