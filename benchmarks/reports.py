"""What the benchmark scripts share: the tail (print the report, and write it to ``--out`` as
well), the sample images and their store packed at 256 (:func:`sample_store`), and timing
datasets' epochs in rounds (:func:`time_rounds`).

Imported by the scripts beside it (``python benchmarks/<script>.py`` puts this folder first on
``sys.path``). The files written are the ones benchmarks/results/ holds and the docs link to.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def positive_ints(text: str) -> list[int]:
    """An argparse type: a comma-separated list of integers >= 1 (``--threads 4,8,16``)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1: {text!r}")
    return values


def command_line() -> str:
    """``python benchmarks/<script>.py <arguments>``: how this run was started, for a report's
    first line."""
    return f"python benchmarks/{os.path.basename(sys.argv[0])} {' '.join(sys.argv[1:])}"


def emit(lines: list[str], out: str | None, command: str | None = None) -> None:
    """Print ``lines`` as the report; when ``out`` is set, write the report there too, after a
    ``$ <command>`` line when ``command`` is given (the file alone then says how to rerun it)."""
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if out:
        with open(out, "w") as f:
            f.write((f"$ {command}\n" if command else "") + report)


def sample_store(work: str, count: int) -> tuple[str, str]:
    """(image folder, store): ``count`` sample photos in 10 classes under ``work``/sample and
    their store packed at 256 (the default) in ``work``/s256.lmdb, each made only where it is not
    there yet (a kept ``--work-dir`` reuses them)."""
    import shardkit
    from shardkit.bench.sample import make_sample

    src, store = os.path.join(work, "sample"), os.path.join(work, "s256.lmdb")
    if not os.path.isdir(src):
        make_sample(src, count, 10, seed=0, workers=1)
    if not os.path.exists(store):
        shardkit.pack(src, store, size=256, workers=1, progress=False)
    return src, store


def epoch(ds: Any, seed: int, batch: int) -> tuple[float, float, Any]:
    """Every record of the ``ShardDataset`` ``ds`` once, in batches of ``batch``, torch seeded
    with ``seed``: (wall seconds, CPU seconds, the images of the last batch)."""
    import torch

    from shardkit import collate

    torch.manual_seed(seed)
    n = len(ds)
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, n, batch):
        images, _ = collate(ds.__getitems__(list(range(start, min(n, start + batch)))))
    return time.perf_counter() - t0, time.process_time() - c0, images


def time_rounds(configs: dict[str, Any], rounds: int, batch: int,
                check: Callable[[Any], None] | None = None
                ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each dataset of ``configs`` read once to warm up (page cache, scratch buffers, imports),
    then ``rounds`` times, in turn (round ``r``: :func:`epoch` seeded ``r``): per config, the
    records per second and the CPU milliseconds per record of each round. ``check`` is given
    each timed epoch's last batch of images."""
    for ds in configs.values():
        epoch(ds, 0, batch)
    wall: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(rounds):
        for name, ds in configs.items():
            seconds, cpu_seconds, images = epoch(ds, r, batch)
            if check is not None:
                check(images)
            wall[name].append(len(ds) / seconds)
            cpu[name].append(cpu_seconds / len(ds) * 1e3)
    return wall, cpu


def make_video(path: str, seed: int, seconds: float, fps: int, width: int, height: int,
               gop: int) -> None:
    """An H.264 video at ``path`` made with PyAV: moving gradients with noise, so the encoder
    works as on camera footage; a keyframe every ``gop`` frames."""
    import av

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    tint = rng.uniform(60, 200, 3)
    c = av.open(path, "w")
    s = c.add_stream("libx264", rate=fps, options={"g": str(gop), "preset": "veryfast"})
    s.width, s.height, s.pix_fmt = width, height, "yuv420p"
    for i in range(int(seconds * fps)):
        shift = i * 3
        base = np.stack([(x + shift) % width / width, y / height,
                         ((x + y + 2 * shift) % (width + height)) / (width + height)], -1)
        pixels = base * tint + rng.normal(0, 6, (height, width, 3))
        frame = av.VideoFrame.from_ndarray(np.clip(pixels, 0, 255).astype(np.uint8),
                                           format="rgb24")
        for p in s.encode(frame):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
