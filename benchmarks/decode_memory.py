#!/usr/bin/env python
"""Peak address space of shardkit's per-image pack path, in bytes a source pixel, by format.

    python benchmarks/decode_memory.py                    # 3000x3000 images
    python benchmarks/decode_memory.py --side 2000 --out benchmarks/results/decode_memory.txt

An encoding worker bounds its address space (``RLIMIT_AS``) to what it uses once started plus
``DECODE_BYTES_PER_PIXEL`` (shardkit/packing/workers.py) a ``--max-pixels`` pixel plus a fixed
overhead; the bound must leave room for the hungriest image within the limit. For each kind of
source this writes one noisy image of ``--side`` x ``--side`` pixels, then in a fresh interpreter
packs a 512-px image of the same kind (codec libraries and the resize kernel loaded, as in a
worker that has started),
reads the address space in use (``VmSize``), runs the path a worker runs on the big file
(``encode_file``: read, decode, convert to RGB, resize to 256, JPEG encode) and reads the peak
(``VmPeak``). Growth over pixels, file bytes included, is the figure docs/packing.md quotes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image
from reports import command_line, emit  # beside this script

# name -> (file suffix, function of (rng, side) -> PIL image, save options)
KINDS = {
    "RGBA WebP": (".webp", lambda rng, s: _rgb(rng, s, 4), {"quality": 90}),
    "RGBA WebP lossless": (".webp", lambda rng, s: _rgb(rng, s, 4), {"lossless": True,
                                                                     "method": 0}),
    "32-bit TIFF": (".tif", lambda rng, s: Image.fromarray(
        rng.integers(0, 1 << 20, (s, s), dtype=np.int32)), {}),  # mode I
    "16-bit PNG": (".png", lambda rng, s: Image.fromarray(
        rng.integers(0, 1 << 16, (s, s), dtype=np.uint16)), {"compress_level": 1}),  # I;16
    "RGBA PNG": (".png", lambda rng, s: _rgb(rng, s, 4), {"compress_level": 1}),
    "RGB PNG": (".png", lambda rng, s: _rgb(rng, s, 3), {"compress_level": 1}),
    "JPEG": (".jpg", lambda rng, s: _rgb(rng, s, 3), {"quality": 90}),
}

# Run in a fresh interpreter: argv = small file, big file, pixels.
PROBE = r"""
import sys
from shardkit.packing import resize
from shardkit.packing.settings import PackSettings
from shardkit.packing.workers import encode_file

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

resize.single_thread()  # as worker_init does
settings = PackSettings()
assert encode_file(sys.argv[1], settings).reason is None
base, peak_before = status("VmSize"), status("VmPeak")
result = encode_file(sys.argv[2], settings)
assert result.reason is None, result.reason
print(status("VmPeak") - base, peak_before - base)
"""


def _rgb(rng: np.random.Generator, side: int, channels: int) -> Image.Image:
    """Noise in RGB (3 channels) or RGBA (4)."""
    return Image.fromarray(rng.integers(0, 256, (side, side, channels), dtype=np.uint8))


def measure(folder: str, name: str, side: int) -> tuple[float, float, int]:
    """(peak growth in bytes a pixel, file bytes a pixel, growth before the big file) of one
    kind."""
    suffix, make, options = KINDS[name]
    rng = np.random.default_rng(0)
    stem = os.path.join(folder, name.replace(" ", "-"))
    make(rng, 512).save(stem + "-small" + suffix, **options)  # resized too: the kernel loads
    make(rng, side).save(stem + suffix, **options)
    out = subprocess.run([sys.executable, "-c", PROBE, stem + "-small" + suffix, stem + suffix],
                         capture_output=True, text=True, check=True).stdout.split()
    growth, before = int(out[0]), int(out[1])
    pixels = side * side
    return growth / pixels, os.path.getsize(stem + suffix) / pixels, before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=3000, help="image side in pixels [3000]")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    if not os.path.exists("/proc/self/status"):
        parser.error("needs Linux (/proc/self/status)")
    from shardkit.packing.workers import DECODE_BYTES_PER_PIXEL

    lines = [f"peak address space growth of encode_file, {args.side}x{args.side} noise images, "
             f"packed at 256 (bound: {DECODE_BYTES_PER_PIXEL} B a pixel + overhead):"]
    with tempfile.TemporaryDirectory(prefix="decode-memory-") as folder:
        for name in KINDS:
            per_pixel, file_per_pixel, before = measure(folder, name, args.side)
            lines.append(f"  {name:18s}: {per_pixel:5.1f} B a pixel "
                         f"(the file: {file_per_pixel:4.1f} B a pixel; "
                         f"peak before the big file: +{before >> 20} MiB)")
    emit(lines, args.out, command=command_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
