#!/usr/bin/env python
"""ResNet-50 at AMP on one GPU, fed three ways: shardkit's thread engine, its process engine and
torchvision's ImageFolder (issue 26.5). For a lent GPU node (16 cores, one H200); ``--dry-run``
runs the same code on the CPU in seconds (a tiny model, each system once), which the tests do.

    python benchmarks/gpu_node.py                 # on the node: ~10,000 images, 9 settings
    python benchmarks/gpu_node.py --dry-run       # anywhere: CPU, tiny model, 3 settings
    benchmarks/gpu_node.sh                        # the node's python3, carried wheels, $OUT

What it does, with nothing fetched (the node reaches nothing outside it):

1. writes ``--images`` photo-like JPEGs (:mod:`shardkit.bench.sample`, the other benchmarks'
   generator; ImageNet-like sizes) in ``--classes`` class folders, and packs them at 256 into
   one LMDB store (JPEG records) on every core;
2. for each setting (``--threads`` x the thread engine, ``--workers`` x the process engine and
   x ImageFolder), trains ``torchvision.models.resnet50(weights=None)`` (channels-last, bf16
   autocast, SGD with momentum, batch ``--batch``) for ``--warmup`` steps, then ``--steps``
   timed steps, and reports: images/s (the timed steps, synchronised at both ends); GPU
   utilisation (``torch.cuda.utilization()`` through pynvml, else ``nvidia-smi``, sampled every
   0.2 s); data wait (share of the timed wall time the loop spent in ``next()``); peak PSS of
   the process tree (this process and its children, sampled every 0.5 s); CPU cores busy (CPU
   seconds of the tree over the wall time).
   The recipe is the same everywhere: ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``
   (shardkit at decode from the 256 store, ``crop_mode="random_resized", flip=0.5``;
   ImageFolder: torchvision's v1 transforms on PIL images of the original files, as
   pytorch/examples), uint8 batches normalised on the GPU, ``pin_memory=True``;
3. prints a markdown table and writes it (``gpu_node.md``) and every figure (``gpu_node.json``)
   to ``--out-dir`` (default: ``$OUT`` when set, else ``benchmarks/results``).

``--time-limit`` (seconds, default 420) skips the settings left once it has passed (the table
says which), so a run fits the device budget. The settings run in the order threads,
processes, ImageFolder, each with its own loader (the process engine's workers stop after it).
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
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(HERE, ".."))
    import shardkit

import numpy as np
import torch

sys.path.insert(0, HERE)
from reports import positive_ints  # noqa: E402  (beside this script)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SYSTEMS = ("threads", "processes", "imagefolder")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=10000, help="photo-like images [10000]")
    p.add_argument("--classes", type=int, default=100, help="class folders [100]")
    p.add_argument("--batch", type=int, default=256, help="batch size [256]")
    p.add_argument("--warmup", type=int, default=15, help="untimed steps per setting [15]")
    p.add_argument("--steps", type=int, default=60, help="timed steps per setting [60]")
    p.add_argument("--threads", type=positive_ints, default=[4, 8, 16],
                   help="thread engine [4,8,16]")
    p.add_argument("--workers", type=positive_ints, default=[4, 8, 16],
                   help="process engine and ImageFolder num_workers [4,8,16]")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(SYSTEMS)} [all]")
    p.add_argument("--time-limit", type=float, default=420.0,
                   help="seconds; settings left after it are skipped [420]")
    p.add_argument("--work-dir", help="keep the images and the store here (reused)")
    p.add_argument("--out-dir", default=os.environ.get("OUT") or os.path.join(HERE, "results"),
                   help="where gpu_node.md/.json go [$OUT, else benchmarks/results]")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, a tiny model, 32 small images, each system at 2 threads/workers, "
                        "a few steps (what the tests run)")
    p.add_argument("--seed", type=int, default=0)
    return p


# -- measurements ------------------------------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc (no psutil needed)."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(ppid, []).append(int(name))
    return tree


def process_tree(pid: int | None = None) -> list[int]:
    root = os.getpid() if pid is None else pid
    tree, found, todo = _children(), [], [root]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(tree.get(p, []))
    return found


def tree_pss_mb(pids: list[int]) -> float:
    """PSS of these processes, MB (``/proc/PID/smaps_rollup``; gone processes count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total / 1024


def tree_cpu_s(pids: list[int]) -> float:
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
    return total


class Sampler:
    """A daemon thread calling ``read()`` every ``period`` s, keeping (time, value) pairs."""

    def __init__(self, read: Callable[[], float | None], period: float) -> None:
        self.read, self.period = read, period
        self.values: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                value = self.read()
            except Exception:  # noqa: BLE001 - a failed reading is a missing one
                value = None
            if value is not None:
                self.values.append((time.perf_counter(), value))

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> list[float]:
        return [v for t, v in self.values if t0 <= t <= t1]


def gpu_utilisation_reader(device: torch.device) -> Callable[[], float | None] | None:
    """``torch.cuda.utilization()`` (pynvml), else one ``nvidia-smi`` query per reading."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.utilization(device)
        return lambda: float(torch.cuda.utilization(device))
    except Exception:  # noqa: BLE001 - pynvml missing: ask nvidia-smi
        pass
    index = device.index or 0

    def smi() -> float | None:
        out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=5)
        return float(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
    try:
        return smi if smi() is not None else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


# -- data --------------------------------------------------------------------------------------------

def write_images(src: str, count: int, classes: int, seed: int, small: bool) -> None:
    """Photo-like JPEGs: the sample generator's ImageNet-like sizes, or (``small``, the dry run)
    160x120 ones, which take a few ms each."""
    if not small:
        from shardkit.bench.sample import make_sample

        make_sample(src, count, classes, seed=seed)
        return
    from PIL import Image

    from shardkit.bench.sample import photo_like

    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = os.path.join(src, f"class_{i % classes:03d}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(photo_like(rng, 160, 120)).save(os.path.join(folder, f"{i:05d}.jpg"),
                                                        quality=90)


def make_loader(system: str, n: int, store: str, src: str, batch: int, seed: int,
                pin: bool) -> Any:
    generator = torch.Generator().manual_seed(seed)
    common = dict(shuffle=True, pin_memory=pin, drop_last=True, generator=generator)
    if system == "imagefolder":
        from torch.utils.data import DataLoader

        from shardkit.bench.systems import recipe_baseline, torchvision_version

        dataset, _ = recipe_baseline(src, torchvision_version() is not None)
        return DataLoader(dataset, batch_size=batch, num_workers=n, persistent_workers=True,
                          prefetch_factor=2, **common)
    ds = shardkit.ShardDataset(store, crop=224, crop_mode="random_resized", flip=0.5)
    if system == "threads":
        return ds.loader(batch, engine="threads", num_threads=n, **common)
    return ds.loader(batch, num_workers=n, **common)


def batches(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def close(loader: Any) -> None:
    import gc

    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    gc.collect()


# -- training ----------------------------------------------------------------------------------------

def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 7, stride=8), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 1000))


def make_model(device: torch.device, dry: bool) -> torch.nn.Module:
    if dry:
        model = tiny_model()
    else:
        import torchvision

        model = torchvision.models.resnet50(weights=None)
    return model.to(device, memory_format=torch.channels_last)


@dataclass
class Result:
    system: str
    setting: str
    images_per_s: float | None = None
    gpu_util: float | None = None
    data_wait: float | None = None
    peak_pss_mb: float | None = None
    cpu_cores: float | None = None
    seconds: float | None = None
    note: str = ""


def train(system: str, n: int, model: torch.nn.Module, device: torch.device, args: Any,
          store: str, src: str, gpu: Sampler | None, memory: Sampler) -> Result:
    setting = ("num_threads" if system == "threads" else "num_workers") + f"={n}"
    result = Result(system, setting)
    loader = make_loader(system, n, store, src, args.batch, args.seed, device.type == "cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock, waited = time.perf_counter, 0.0
    feed = batches(loader)
    try:
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                sync()
                t0, waited = clock(), 0.0
                pids = process_tree()
                cpu0 = tree_cpu_s(pids)
            t = clock()
            images, labels = next(feed)
            waited += clock() - t
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            x = shardkit.normalize(images, MEAN, STD).contiguous(memory_format=torch.channels_last)
            # (the dry run on the CPU: float32, bf16 kernels there are slow and beside the point)
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=device.type == "cuda"):
                loss = criterion(model(x), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        sync()
        t1 = clock()
        pids = process_tree()
        cpu1 = tree_cpu_s(pids)
        # One reading at the end too: a short run (the dry run on a loaded machine) may see no
        # sample of the 0.5 s sampler between t0 and t1.
        end_pss = tree_pss_mb(pids)
    finally:
        feed.close()
        close(loader)
    seconds = t1 - t0
    result.seconds = seconds
    result.images_per_s = args.steps * args.batch / seconds
    result.data_wait = waited / seconds
    result.cpu_cores = (cpu1 - cpu0) / seconds
    if gpu is not None and (util := gpu.between(t0, t1)):
        result.gpu_util = statistics.mean(util) / 100
    result.peak_pss_mb = max([*memory.between(t0, t1), end_pss])
    if not float(loss.float().item()) == float(loss.float().item()):  # NaN: something is wrong
        result.note = "loss is NaN"
    return result


def table(results: list[Result], header: list[str]) -> str:
    def pct(v: float | None) -> str:
        return "–" if v is None else f"{v:.0%}"

    def num(v: float | None, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    rows = header + ["",
                     "| loader | setting | images/s | GPU util | data wait | peak PSS, tree (MB) "
                     "| CPU cores busy | note |", "|---|---|---:|---:|---:|---:|---:|---|"]
    names = {"threads": "shardkit thread engine", "processes": "shardkit process engine",
             "imagefolder": "torchvision ImageFolder + DataLoader"}
    for r in results:
        rows.append(f"| {names[r.system]} | {r.setting} | {num(r.images_per_s, ',.0f')} | "
                    f"{pct(r.gpu_util)} | {pct(r.data_wait)} | {num(r.peak_pss_mb, ',.0f')} | "
                    f"{num(r.cpu_cores, '.1f')} | {r.note} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or any(s not in SYSTEMS for s in systems):
        parser.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    if args.dry_run:
        args.images, args.classes, args.batch = min(args.images, 32), min(args.classes, 4), 8
        args.warmup, args.steps = 1, 3
        plan = [("threads", 2), ("processes", 2), ("imagefolder", 2)]
        device = torch.device("cpu")
    else:
        plan = ([("threads", n) for n in args.threads if "threads" in systems]
                + [(s, w) for s in ("processes", "imagefolder") if s in systems
                   for w in args.workers])
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        src, store = os.path.join(work, "images"), os.path.join(work, "train-256.lmdb")
        if not os.path.isdir(src):
            write_images(src, args.images, args.classes, args.seed, args.dry_run)
        if not os.path.exists(store):
            shardkit.pack(src, store, size=256, progress=False,
                          workers=1 if args.dry_run else None)
        prepared = time.perf_counter() - started
        print(f"[gpu_node] {args.images} images written and packed in {prepared:.0f} s",
              file=sys.stderr, flush=True)
        model = make_model(device, args.dry_run)
        read = gpu_utilisation_reader(device)
        gpu = Sampler(read, 0.2).start() if read is not None else None
        memory = Sampler(lambda: tree_pss_mb(process_tree()), 0.5).start()
        results = []
        try:
            for system, n in plan:
                if time.perf_counter() - started > args.time_limit:
                    results.append(Result(system, f"{n}", note="skipped: --time-limit reached"))
                    continue
                r = train(system, n, model, device, args, store, src, gpu, memory)
                print(f"[gpu_node] {system} {r.setting}: {r.images_per_s:,.0f} images/s, "
                      f"data wait {r.data_wait:.0%}", file=sys.stderr, flush=True)
                results.append(r)
        finally:
            memory.stop()
            if gpu is not None:
                gpu.stop()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    command = " ".join(["python benchmarks/gpu_node.py", *(sys.argv[1:] if argv is None else argv)])
    header = [f"`{command}`",
              "",
              f"{name}; {os.cpu_count()} CPUs; torch {torch.__version__}; Python "
              f"{platform.python_version()}; shardkit {shardkit.__version__}. "
              f"{args.images} photo-like JPEGs ({args.classes} classes), the store packed at 256; "
              f"{'tiny model' if args.dry_run else 'ResNet-50'}, channels-last, bf16 autocast, "
              f"batch {args.batch}, {args.warmup} warm-up + {args.steps} timed steps per setting; "
              f"RandomResizedCrop(224) + flip; {time.perf_counter() - started:.0f} s in all."]
    text = table(results, header)
    print(text)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "gpu_node.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out_dir, "gpu_node.json"), "w") as f:
        json.dump({"argv": sys.argv[1:] if argv is None else argv, "device": name,
                   "results": [asdict(r) for r in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
