"""The stores ``shardkit bench`` reads, packed through the public API; the pack-speed figures."""

from __future__ import annotations

import argparse
import os
import subprocess
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from .. import pack
from ..read.store import disk_bytes
from . import pack as packfigures
from .machine import log
from .systems import SIZE, STORE_SYSTEMS, store_of, store_path


@dataclass
class PackFigure:
    system: str
    seconds: float  # packing, from the first image encoded; start-up excluded
    startup_s: float
    images: int
    images_per_s: float
    bytes: int


def pack_stores(src: str, work: str, systems: Iterable[str], workers: int,
                reuse: bool = False) -> list[PackFigure]:
    """Pack ``src`` once per (format, encoding) the systems need; returns pack timings."""
    figures = []
    for name in STORE_SYSTEMS:
        if not any(store_of(s) == name for s in systems):
            continue
        fmt, enc = name.split("-")
        out = store_path(work, name)
        if reuse and os.path.exists(out):
            log(f"reusing {out} (not packed, not timed)")
            continue
        result = pack(src, out, format=fmt, encoding=enc, size=SIZE, workers=workers,
                      overwrite=True, progress=False)
        figures.append(PackFigure(name, result.packing_seconds, result.startup_seconds,
                                  result.count, result.images_per_second, disk_bytes(out)))
        log(f"packed {name}: {result.count} images in {result.packing_seconds:.1f} s after "
            f"{result.startup_seconds:.1f} s start-up ({result.images_per_second:.0f} images/s)")
    return figures


def pack_speed(src: str, work: str, args: argparse.Namespace,
               workers: int) -> list[dict[str, Any]]:
    """Pack-speed figures with this interpreter's PIL and, with ``--simd-python``, with that
    interpreter's."""
    log("pack speed: one-process paths (shardkit, naive PIL), pack, shardkit path again")
    figures = [packfigures.pack_figures(src, work, args.pack_sample, workers)]
    if args.simd_python:
        log(f"pack speed under {args.simd_python}")
        try:
            figures.append(packfigures.pack_figures_in(args.simd_python, src,
                                                       args.pack_sample, workers))
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
            log(f"no pack figures from {args.simd_python}: {exc}")
    return figures


def pack_tiny(out: str, count: int, side: int, fmt: str) -> None:
    """A one-file store of ``count`` raw side x side records, written with ``StoreWriter``."""
    from .. import StoreWriter

    root = os.path.dirname(out)
    classes = [f"c{i}" for i in range(10)]
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (256, side, side, 3), dtype=np.uint8)
    records = [p.tobytes() for p in pixels]
    with StoreWriter(out, classes, format=fmt, encoding="raw", size=0,
                     source_root=root) as writer:
        for i in range(count):
            writer.add_encoded(records[i % 256], i % 10, side, side,
                               os.path.join(root, classes[i % 10], f"{i:08d}.raw"))
