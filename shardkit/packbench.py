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

PACK_TARGET = 0.8         # shardkit pack >= 0.8 x cores x its one-process per-image rate
NAIVE_TARGET = 2.0        # shardkit's per-image path >= 2 x the naive PIL loop, per core
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

    from .resize import target_size

    with Image.open(path) as im:
        im = im.convert("RGB")
        size = target_size(im.width, im.height, SIZE)
        if size != im.size:
            im = im.resize(size, Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=QUALITY)
        return buf.getvalue()


def one_process_rates(src: str, count: int = 0) -> dict[str, Any]:
    """images/s of shardkit's per-image path and of the naive loop, one process, one thread.

    ``count`` > 0 times that many sources spread evenly over the folder; 0 times all of them.
    """
    import torch

    from .discovery import discover
    from .packer import PackSettings, encode_file

    paths = [p for p, _ in discover(src).samples]
    if count > 0 and count < len(paths):
        paths = [paths[i * len(paths) // count] for i in range(count)]
    settings = PackSettings(size=SIZE, quality=QUALITY)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a pack worker's setting: one core each
    try:
        figures = {}
        for name, fn in (("shardkit_path", lambda p: encode_file(p, settings)),
                         ("naive_pil", naive_pil)):
            fn(paths[0])
            t0 = time.perf_counter()
            for path in paths:
                fn(path)
            seconds = time.perf_counter() - t0
            figures[name] = {"images": len(paths), "seconds": seconds,
                             "images_per_s": len(paths) / seconds}
    finally:
        torch.set_num_threads(threads)
    return figures


def pack_figures(src: str, work: str, count: int, workers: int) -> dict[str, Any]:
    """Pack ``src`` to LMDB/jpeg with ``workers`` processes, then the one-process rates."""
    from .packer import pack

    result = pack(src, os.path.join(work, "pack-figure.lmdb"), size=SIZE, quality=QUALITY,
                  workers=workers, overwrite=True, progress=False)
    return {"pil": pil_description(), "workers": workers,
            "pack": {"images": result.count, "seconds": result.seconds,
                     "images_per_s": result.images_per_second},
            "one_process": one_process_rates(src, count)}


_CHILD = ("import json, sys; from shardkit.packbench import pack_figures; "
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
    """The pack targets' ratios for one interpreter's figures."""
    one = figures["one_process"]
    path = one["shardkit_path"]["images_per_s"]
    naive = one["naive_pil"]["images_per_s"]
    pack = figures["pack"]["images_per_s"]
    return {"pil": figures["pil"]["name"], "pil_version": figures["pil"]["version"],
            "pack_images_per_s": pack, "one_process_images_per_s": path,
            "naive_pil_images_per_s": naive, "cores": cores,
            "pack_vs_ceiling": pack / (path * cores), "path_vs_naive": path / naive,
            "pack_vs_naive_cores": pack / (naive * cores)}


def lines(summaries: list[dict[str, Any]]) -> list[str]:
    """Table lines: the figures and the two pack targets, per interpreter."""
    out = []
    for s in summaries:
        def mark(ok: bool) -> str:
            return "met" if ok else "NOT met"

        out.append(f"pack with {s['pil']} {s['pil_version']}: shardkit pack "
                   f"{s['pack_images_per_s']:.0f} images/s on {s['cores']} cores; one process: "
                   f"shardkit path {s['one_process_images_per_s']:.0f}, naive PIL loop "
                   f"{s['naive_pil_images_per_s']:.0f} images/s")
        out.append(f"target: shardkit pack = {s['pack_vs_ceiling']:.2f} x cores x one-process "
                   f"per-image rate (>= {PACK_TARGET}: {mark(s['pack_vs_ceiling'] >= PACK_TARGET)})")
        out.append(f"target: per core, shardkit path = {s['path_vs_naive']:.2f} x the naive PIL "
                   f"loop (>= {NAIVE_TARGET:g}: {mark(s['path_vs_naive'] >= NAIVE_TARGET)}); "
                   f"shardkit pack = {s['pack_vs_naive_cores']:.2f} x naive loop x cores")
    return out


if __name__ == "__main__":  # pragma: no cover - convenience for one-off runs
    print(json.dumps(one_process_rates(sys.argv[1]), indent=2))
