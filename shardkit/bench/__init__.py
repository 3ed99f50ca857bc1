"""Throughput benchmark: ImageFolder+PIL against ShardDataset, through a real DataLoader.

``shardkit bench`` and ``benchmarks/throughput.py`` run :func:`main`. It packs an image folder
(or a generated photo-like sample) into LMDB and HDF5 stores with ``jpeg`` and ``raw`` records,
then reads every system through ``torch.utils.data.DataLoader``, each producing the same thing:
uint8 3x224x224 centre crops in batches of 64.

Systems (``--systems``):

- ``imagefolder``: what users run today, ImageFolder + PIL (open, RGB, resize shorter side to 256,
  centre crop 224, to tensor); torchvision's own classes when torchvision is installed.
- ``<format>-<encoding>`` (``lmdb-jpeg``, ``hdf5-jpeg``, ``lmdb-raw``, ``hdf5-raw``): ShardDataset
  with ``crop=224``, ``shardkit.collate`` and ``worker_init_fn``, swept over ``num_workers``.
- ``<format>-<encoding>/threads``: ShardDataset with ``threads=N`` and ``num_workers=0``,
  swept over N.
- the training recipe, ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``, over
  ``--recipe-workers`` (default 2) on the LMDB jpeg store: ``recipe-imagefolder`` (ImageFolder,
  PIL, the recipe as pytorch/examples runs it), ``recipe-transform`` (ShardDataset with the recipe
  as a per-sample v2 transform on uint8 tensors), ``recipe-decode`` (``crop_mode="random_resized",
  flip=0.5``); torchvision's transforms when it is importable, else shardkit.read.augment's, which
  give the same pixels. Beside them ``random-crop`` (``crop_mode="random"``, the plain fast path) and
  ``random-crop/default-collate`` (the same without ``collate_fn``).

and the decode ceiling: one process decoding the same stored bytes to the same crops in a tight
loop (no Dataset, no DataLoader), times the number of cores.

Each setting runs a warm-up epoch (which also fingerprints every image it delivers, so that the
systems can be checked to deliver the same pixels) and then ``--epochs`` timed epochs; the median
is reported. ``--step-ms`` adds a simulated training step after each batch and reports the share
of wall time spent waiting for data. Worker memory (Private_Dirty, USS, PSS) is read after the
warm-up and after the last epoch. ``--memory-records N`` instead measures worker memory over a
full pass of an N-record store of tiny records.

Modules: ``systems`` (what is measured), ``stores`` (packing the stores it reads), ``read`` (the
timed DataLoader loop), ``ceiling`` (decode ceilings), ``report`` (checks, ratios, table, plot),
``recommend`` (``--recommend``), ``memory`` (``--memory-records``), ``pack`` (pack-speed figures),
``sample`` (the generated photo-like sample), ``machine`` (machine facts, /proc readings). This
package (``main``) is the command line: argument parsing and the order of the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Any, Callable, Sequence

import numpy as np

from ..codec import ENCODINGS
from ..read.store import disk_bytes
from ..packing.workers import default_workers
from . import recommend
from .ceiling import decode_ceiling
from .machine import log, machine_info
from .memory import memory_main
from .read import Run, make_loader, make_step, measure, shutdown
from .report import command_line, consistency, format_table, plot, summarize
from .stores import pack_speed, pack_stores
from .systems import (BATCH, CROP, DEFAULT_SYSTEMS, RECIPE_SYSTEMS, SIZE, STORE_SYSTEMS,
                      baseline_dataset, recipe_baseline, recipe_transform, store_of, store_path,
                      torchvision_version)


def _parse_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0: {text!r}")
    return values


def _parse_systems(text: str) -> list[str]:
    systems = [s.strip() for s in text.split(",") if s.strip()]
    known = {"imagefolder", *STORE_SYSTEMS, *(f"{s}/threads" for s in STORE_SYSTEMS),
             *RECIPE_SYSTEMS}
    bad = [s for s in systems if s not in known]
    if bad or not systems:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(bad) or '(none)'}; choose from {', '.join(sorted(known))}")
    return systems


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardkit bench",
        description="DataLoader throughput: ImageFolder+PIL against ShardDataset stores "
                    "(LMDB/HDF5 x jpeg/raw), with the decode ceiling and pack speed, and the "
                    "training recipe (RandomResizedCrop + flip) three ways.")
    p.add_argument("input", nargs="?", help="image folder (ImageFolder layout)")
    p.add_argument("--sample", type=int, metavar="N",
                   help="generate N photo-like images instead of giving a folder")
    p.add_argument("--classes", type=int, default=10, help="classes of a --sample [10]")
    p.add_argument("--systems", type=_parse_systems, default=list(DEFAULT_SYSTEMS),
                   help="comma-separated systems [%(default)s]".replace("%(default)s",
                                                                       ",".join(DEFAULT_SYSTEMS)))
    p.add_argument("--workers-list", type=_parse_list, default=None,
                   help="num_workers values to sweep [0,1,...,2x cores]")
    p.add_argument("--threads-list", type=_parse_list, default=None,
                   help="threads values for the /threads systems [1,...,2x cores]")
    p.add_argument("--recipe-workers", type=_parse_list, default=[2],
                   help="num_workers values for the training-recipe and random-crop systems [2]")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs after the warm-up [3]")
    p.add_argument("--min-seconds", type=float, default=2.0,
                   help="run more timed epochs (up to 50) until they add up to this [2.0]")
    p.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor [2]")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step after each batch, in ms (a sleep)")
    p.add_argument("--step-cpu", action="store_true",
                   help="make the --step-ms step busy CPU compute instead of a sleep")
    p.add_argument("--exact-decode", action="store_true",
                   help="exact JPEG decode (default: libjpeg-turbo fast DCT/upsampling, the "
                        "fast_decode=True setting, in ShardDataset and the ceiling alike)")
    p.add_argument("--pack-workers", type=int, default=None,
                   help="processes for packing the stores (default: the CPUs this process may use)")
    p.add_argument("--pack-sample", type=int, default=0,
                   help="sources timed for the one-process pack figures (0: all) [0]")
    p.add_argument("--no-pack-figures", action="store_true",
                   help="skip the pack-speed figures (one-process and naive-loop timing)")
    p.add_argument("--simd-python", metavar="PYTHON",
                   help="also measure pack speed under this interpreter (a pillow-simd "
                        "environment, e.g. .venv-simd/bin/python from scripts/pillow_simd_venv.sh)")
    p.add_argument("--no-check", action="store_true",
                   help="skip fingerprinting the warm-up epoch (same-pixels check)")
    p.add_argument("--recommend", action="store_true",
                   help="print the fastest DataLoader settings with the fewest workers as code")
    p.add_argument("--out-dir", default="bench-results",
                   help="where the JSON, table and plot go [bench-results]")
    p.add_argument("--work-dir", help="where the sample and stores go (default: a temporary "
                   "folder, removed afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--reuse", action="store_true",
                   help="reuse stores already in --work-dir (their packing is not timed again)")
    p.add_argument("--memory-records", type=int, metavar="N",
                   help="instead: pack N tiny records and measure worker memory over a pass")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "shardkit bench") -> int:
    """Run the benchmark; returns the exit status (non-zero if systems disagree on pixels).

    It reports measurements and ratios only (``throughput.json``, ``throughput.txt``); ``prog``
    is the command recorded with them (benchmarks/throughput.py passes its own, and judges the
    project's targets from the JSON).
    """
    parser = build_parser()
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser.parse_args(argv)
    args.argv, args.prog = argv, prog
    if args.memory_records is not None:
        from ..errors import ShardkitError

        try:
            return memory_main(args)
        except ShardkitError as exc:
            print(f"shardkit bench: error: {exc}", file=sys.stderr)
            return 1
    if (args.input is None) == (args.sample is None):
        parser.error("give an image folder or --sample N (one of them)")
    if args.epochs < 1:
        parser.error("--epochs must be >= 1")
    if args.sample is not None and args.sample < 1:
        parser.error("--sample must be >= 1")
    work = args.work_dir or tempfile.mkdtemp(prefix="shardkit-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        return _bench(args, work)
    finally:
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        elif args.keep or args.work_dir:
            log(f"stores kept in {work}")


def _bench(args: argparse.Namespace, work: str) -> int:
    from ..errors import ShardkitError

    n_cores = default_workers()
    workers_list = args.workers_list or list(range(0, 2 * n_cores + 1))
    threads_list = args.threads_list or list(range(1, 2 * n_cores + 1))
    fast = not args.exact_decode
    report: dict[str, Any] = {
        "command": command_line(args), "argv": args.argv,
        "machine": machine_info(),
        "settings": {"batch_size": BATCH, "resize": SIZE, "crop": CROP, "epochs": args.epochs,
                     "min_seconds": args.min_seconds,
                     "workers_list": workers_list, "threads_list": threads_list,
                     "recipe_workers": args.recipe_workers,
                     "prefetch_factor": args.prefetch, "step_ms": args.step_ms,
                     "step_cpu": args.step_cpu, "fast_decode": fast, "shuffle": True,
                     "persistent_workers": True, "systems": args.systems},
    }
    t_start = time.perf_counter()
    src = args.input
    if args.sample is not None:
        from .sample import make_sample

        src = os.path.join(work, "sample")
        if not os.path.isdir(src):
            t0 = time.perf_counter()
            make_sample(src, args.sample, max(1, min(args.classes, args.sample)), args.seed)
            log(f"made {args.sample} sample images in {time.perf_counter() - t0:.1f} s")
    if not os.path.isdir(src):
        print(f"shardkit bench: error: not a folder: {src}", file=sys.stderr)
        return 1
    pack_workers = n_cores if args.pack_workers is None else args.pack_workers
    try:
        report["input"] = _describe_source(src)
        packs = pack_stores(src, work, args.systems, pack_workers, args.reuse)
    except ShardkitError as exc:
        print(f"shardkit bench: error: {exc}", file=sys.stderr)
        return 1
    report["pack"] = {"stores": [asdict(p) for p in packs], "workers": pack_workers}
    if not args.no_pack_figures:
        report["pack"]["figures"] = pack_speed(src, work, args, pack_workers)
    ceilings: dict[str, dict] = {}
    for enc in ENCODINGS:
        store = next((store_path(work, s) for s in args.systems
                      if (store_of(s) or "").endswith(enc)), None)
        if store:
            ceilings[enc] = decode_ceiling(store, fast, args.epochs, not args.no_check,
                                           args.min_seconds)
            log(f"decode ceiling ({enc}): {ceilings[enc]['single_core_images_per_s']:.0f} "
                f"images/s on one core, x{n_cores} = {ceilings[enc]['images_per_s']:.0f}")
    report["ceilings"] = ceilings
    step = make_step(args.step_ms, args.step_cpu)
    runs: list[Run] = []
    for system in args.systems:
        runs += sweep(system, src, work, workers_list, threads_list, args, step, fast,
                      report["input"]["mean_bytes"])
    report["runs"] = [asdict(r) | {"setting": r.setting} for r in runs]
    report["checks"] = consistency(runs, ceilings)
    report["summary"] = summarize(runs, ceilings, report["pack"], args.systems, args.step_ms)
    report["elapsed_s"] = time.perf_counter() - t_start
    report["machine"]["load_average_end"] = (list(os.getloadavg())
                                             if hasattr(os, "getloadavg") else None)
    table = format_table(runs, ceilings, report)
    print(table)
    if args.recommend:
        print(recommend.recommend(runs, args, work))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "throughput.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(args.out_dir, "throughput.txt"), "w") as f:
        f.write(table + "\n")
    note = plot(runs, ceilings, os.path.join(args.out_dir, "throughput.png"), args.step_ms,
                args.step_cpu)
    log(f"wrote {args.out_dir}/throughput.json, throughput.txt" + (f"; {note}" if note else
                                                                   ", throughput.png"))
    return 0 if report["checks"]["ok"] else 1


def _describe_source(src: str) -> dict[str, Any]:
    from PIL import Image

    from ..packing.discovery import discover

    found = discover(src)
    sizes = [os.path.getsize(p) for p, _ in found.samples]
    dims = []
    for p, _ in found.samples[:: max(1, len(found.samples) // 200)]:
        with Image.open(p) as im:
            dims.append(im.size)
    return {"path": src, "images": len(found.samples), "classes": len(found.classes),
            "mean_bytes": sum(sizes) / max(1, len(sizes)),
            "mean_width": float(np.mean([d[0] for d in dims])) if dims else None,
            "mean_height": float(np.mean([d[1] for d in dims])) if dims else None}


def sweep(system: str, src: str, work: str, workers_list: list[int], threads_list: list[int],
          args: argparse.Namespace, step: Callable | None, fast: bool,
          source_bytes: float) -> list[Run]:
    from .. import ShardDataset, collate, worker_init_fn

    runs = []
    check = not args.no_check
    label: str | None = None
    if system in ("imagefolder", "recipe-imagefolder"):
        if system == "imagefolder":
            dataset, label = baseline_dataset(src)
            settings = [("workers", w, 0) for w in workers_list]
        else:
            dataset, label = recipe_baseline(src, torchvision_version() is not None)
            settings = [("workers", w, 0) for w in args.recipe_workers]
        make = lambda mode, w, t: make_loader(  # noqa: E731
            dataset, w, args.prefetch, None, None, args.seed)
        bytes_per_image = source_bytes
    elif system in RECIPE_SYSTEMS:
        path = store_path(work, system)
        settings = [("workers", w, 0) for w in args.recipe_workers]
        collate_fn = None if system == "random-crop/default-collate" else collate
        kwargs: dict[str, Any]
        if system == "recipe-transform":
            transform, name = recipe_transform(torchvision_version() is not None)
            kwargs = {"transform": transform}
            label = f"ShardDataset(transform=...), shardkit.collate; transform: {name}"
        else:
            kwargs = ({"crop": CROP, "crop_mode": "random_resized", "flip": 0.5}
                      if system == "recipe-decode" else {"crop": CROP, "crop_mode": "random"})
            label = (f"ShardDataset({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}), "
                     + ("shardkit.collate" if collate_fn else
                        "no collate_fn (the default collate)"))

        def make(mode: str, w: int, t: int) -> Any:
            ds = ShardDataset(path, fast_decode=fast, **kwargs)
            return make_loader(ds, w, args.prefetch, collate_fn, worker_init_fn, args.seed)
        bytes_per_image = disk_bytes(path) / max(1, len(ShardDataset(path)))
    else:
        path = store_path(work, system)
        threaded = system.endswith("/threads")
        settings = ([("threads", 0, t) for t in threads_list] if threaded
                    else [("workers", w, 0) for w in workers_list])
        store_bytes = disk_bytes(path)

        def make(mode: str, w: int, t: int) -> Any:
            ds = ShardDataset(path, crop=CROP, threads=t, fast_decode=fast)
            return make_loader(ds, w, args.prefetch, collate, worker_init_fn, args.seed)
        bytes_per_image = store_bytes / max(1, len(ShardDataset(path)))
    if label:
        log(f"{system}: {label}")
    for mode, w, t in settings:
        loader = make(mode, w, t)
        try:
            run = measure(system, loader, mode=mode, num_workers=w, threads=t,
                          prefetch=args.prefetch if w > 0 else None, epochs=args.epochs,
                          min_seconds=args.min_seconds,
                          step=step, bytes_per_image=bytes_per_image, check=check,
                          seed=args.seed)
        finally:
            shutdown(loader)
        run.implementation = label
        wait = "" if run.data_wait_share is None else f", data wait {run.data_wait_share:.0%}"
        log(f"{system:18s} {run.setting:10s} {run.images_per_s:8.0f} images/s{wait}")
        runs.append(run)
    return runs
