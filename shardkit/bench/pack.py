"""Pack-speed figures for ``shardkit bench``: the packer against its own one-process rate and a naive
PIL loop, with the installed Pillow and, through a second interpreter, with pillow-simd.

The one-process figures time every source (or ``count`` of them, evenly spread) through each
per-image path in one process with one thread: a few large sources can dominate the cost, so a
small sample would not represent the folder.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

QUALITY = 90
SIZE = 256


def pil_description() -> dict[str, Any]:
    """Which PIL is imported: Pillow or pillow-simd, and its JPEG library."""
    from importlib import metadata

    import PIL
    from PIL import features

    simd = False
    try:
        metadata.distribution("pillow-simd")
        simd = True
    except metadata.PackageNotFoundError:
        simd = ".post" in PIL.__version__  # pillow-simd versions look like 9.0.0.post1
    return {"version": PIL.__version__, "simd": simd,
            "name": "pillow-simd" if simd else "Pillow",
            "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
            "jpeg_version": features.version("jpg")}


def naive_pil(path: str) -> bytes:
    """What a hand-written converter does: PIL open, full decode, RGB, bicubic resize of the
    shorter side to 256, PIL JPEG encode at quality 90."""
    from PIL import Image

    from ..packing.resize import target_size

    with Image.open(path) as im:
        im = im.convert("RGB")
        size = target_size(im.width, im.height, SIZE)
        if size != im.size:
            im = im.resize(size, Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=QUALITY)
        return buf.getvalue()


def one_process_rates(src: str, count: int = 0, naive: bool = True) -> dict[str, Any]:
    """images/s and CPU per image of shardkit's per-image path (and, if ``naive``, of the naive
    loop) in this process with one thread.

    ``count`` > 0 times that many sources spread evenly over the folder; 0 times all of them.
    """
    import torch

    from ..packing.discovery import discover
    from ..packing.settings import PackSettings
    from ..packing.workers import encode_file

    paths = [p for p, _ in discover(src).samples]
    if count > 0 and count < len(paths):
        paths = [paths[i * len(paths) // count] for i in range(count)]
    settings = PackSettings(size=SIZE, quality=QUALITY)
    paths_to_time = [("shardkit_path", lambda p: encode_file(p, settings))]
    if naive:
        paths_to_time.append(("naive_pil", naive_pil))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a pack worker's setting: one core each
    try:
        figures = {}
        for name, fn in paths_to_time:
            fn(paths[0])
            t0, c0 = time.perf_counter(), time.process_time()
            for path in paths:
                fn(path)
            seconds = time.perf_counter() - t0
            figures[name] = {"images": len(paths), "seconds": seconds,
                             "images_per_s": len(paths) / seconds,
                             "cpu_us_per_image": (time.process_time() - c0) / len(paths) * 1e6}
    finally:
        torch.set_num_threads(threads)
    return figures


def _timed_path_into(src: str, count: int, queue: Any) -> None:
    start = time.monotonic()  # system-wide clock: comparable between processes
    images = one_process_rates(src, count, naive=False)["shardkit_path"]["images"]
    queue.put((start, time.monotonic(), images))


def parallel_rate(src: str, count: int, processes: int) -> float:
    """images/s of shardkit's per-image path run in ``processes`` processes at once, from the
    first start to the last finish: what the cores give together, which on shared or SMT cores
    is less than cores x one process alone."""
    import multiprocessing as mp

    from ..packing.workers import start_method

    ctx = mp.get_context(start_method())
    queue = ctx.Queue()
    procs = [ctx.Process(target=_timed_path_into, args=(src, count, queue))
             for _ in range(processes)]
    for proc in procs:
        proc.start()
    try:
        runs = [queue.get(timeout=3600) for _ in procs]
    finally:
        for proc in procs:
            proc.join(60)
            if proc.exitcode is None:
                proc.kill()
    return sum(r[2] for r in runs) / (max(r[1] for r in runs) - min(r[0] for r in runs))


def _cpu_seconds() -> float:
    """CPU time of this process and its finished (waited-for) children."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pack_figures(src: str, work: str, count: int, workers: int, packs: int = 3) -> dict[str, Any]:
    """``packs`` timed packs of ``src`` to LMDB/jpeg with ``workers`` processes (the median
    counts), between two timings of the one-process rate (the machine's speed drifts: the ratio
    uses their mean), then the per-image path in ``workers`` processes at once."""
    import statistics

    from .. import pack

    before = one_process_rates(src, count)
    out = os.path.join(work, "pack-figure.lmdb")
    timed = []
    for _ in range(packs):
        cpu0 = _cpu_seconds()
        result = pack(src, out, size=SIZE, quality=QUALITY, workers=workers, overwrite=True,
                      progress=False)
        timed.append((result.images_per_second, result.packing_seconds,
                      (_cpu_seconds() - cpu0) / max(1, result.count) * 1e6))
        os.remove(out)
    rate, seconds, cpu_us = sorted(timed)[len(timed) // 2]
    together = parallel_rate(src, count, workers) if workers > 1 else None
    after = one_process_rates(src, count, naive=False)
    runs = [before["shardkit_path"], after["shardkit_path"]]
    path = {"images": before["shardkit_path"]["images"],
            "images_per_s": statistics.mean(r["images_per_s"] for r in runs),
            "images_per_s_runs": [r["images_per_s"] for r in runs],
            "cpu_us_per_image": statistics.mean(r["cpu_us_per_image"] for r in runs)}
    return {"pil": pil_description(), "workers": workers,
            "pack": {"images": result.count, "seconds": seconds, "images_per_s": rate,
                     "images_per_s_runs": [t[0] for t in timed], "cpu_us_per_image": cpu_us},
            "one_process": {"shardkit_path": path, "naive_pil": before["naive_pil"]},
            "processes_at_once": {"processes": workers, "images_per_s": together}}


_CHILD = ("import json, sys; from shardkit.bench.pack import pack_figures; "
          "print(json.dumps(pack_figures(sys.argv[1], sys.argv[2], int(sys.argv[3]), "
          "int(sys.argv[4]))))")


def pack_figures_in(python: str, src: str, count: int, workers: int) -> dict[str, Any]:
    """:func:`pack_figures` run by another interpreter (e.g. a pillow-simd environment)."""
    with tempfile.TemporaryDirectory(prefix="shardkit-packbench-") as work:
        proc = subprocess.run([python, "-c", _CHILD, src, work, str(count), str(workers)],
                              capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(figures: dict[str, Any], cores: int) -> dict[str, Any]:
    """The pack ratios for one interpreter's figures (against its one-process rate, and the
    naive PIL loop)."""
    one = figures["one_process"]
    path = one["shardkit_path"]["images_per_s"]
    naive = one["naive_pil"]["images_per_s"]
    pack = figures["pack"]["images_per_s"]
    together = figures["processes_at_once"]["images_per_s"]  # None with one worker
    return {"pil": figures["pil"]["name"], "pil_version": figures["pil"]["version"],
            "pack_images_per_s": pack, "one_process_images_per_s": path,
            "naive_pil_images_per_s": naive, "cores": cores,
            "packs": len(figures["pack"]["images_per_s_runs"]),
            "pack_vs_ceiling": pack / (path * cores), "path_vs_naive": path / naive,
            "pack_vs_naive_cores": pack / (naive * cores),
            "cpu_efficiency": (one["shardkit_path"]["cpu_us_per_image"]
                               / figures["pack"]["cpu_us_per_image"]),
            "pack_vs_processes_at_once": pack / together if together else None}


def lines(summaries: list[dict[str, Any]]) -> list[str]:
    """Table lines: the figures and ratios per interpreter."""
    out = []
    for s in summaries:
        out.append(f"pack with {s['pil']} {s['pil_version']}: shardkit pack "
                   f"{s['pack_images_per_s']:.0f} images/s on {s['cores']} cores (median of "
                   f"{s['packs']} packs, start-up excluded); one process: "
                   f"shardkit path {s['one_process_images_per_s']:.0f}, naive PIL loop "
                   f"{s['naive_pil_images_per_s']:.0f} images/s")
        out.append(f"shardkit pack = {s['pack_vs_ceiling']:.2f} x cores x one-process "
                   f"per-image rate; CPU per image: one process / pack = "
                   f"{s['cpu_efficiency']:.2f}")
        if s["pack_vs_processes_at_once"]:
            out.append(f"        against the per-image path run in every core at once (what the "
                       f"cores gave together): {s['pack_vs_processes_at_once']:.2f}")
        out.append(f"per core, shardkit path = {s['path_vs_naive']:.2f} x the naive PIL loop; "
                   f"shardkit pack = {s['pack_vs_naive_cores']:.2f} x naive loop x cores")
    return out


if __name__ == "__main__":  # pragma: no cover - convenience for one-off runs
    print(json.dumps(one_process_rates(sys.argv[1]), indent=2))
