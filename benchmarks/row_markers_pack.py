#!/usr/bin/env python
"""What restart markers cost the pack: CPU per image of the pack's per-image work with row
markers (``codec.encode``, as ``shardkit pack`` encodes: one libjpeg-turbo pass where
``shardkit.libjpeg`` finds the library) against the same work without them
(``codec.encode(..., row_markers=False)``), and, for the encode alone, the rows encoded one by one
(``jpegrows.encode_each_row``, the fallback) and Pillow's one-pass ``restart_marker_rows=1``
(accurate DCT) with its pixels compared.

One process pinned to one CPU (``os.sched_setaffinity``), one torch thread; the configurations
alternate within each round and the figures are this process's CPU seconds (``time.process_time``),
so load on other CPUs barely moves them. Sources: ImageNet-like photo JPEGs
(``shardkit.bench.sample``: mean area about 500x375, quality 75-95); the per-image work is what
``shardkit.packing.encoding.encode_data`` does: ``load_rgb`` (decode, orient, resize the shorter
side to 256) then the encode at quality 90, 4:2:0. Reading the file and writing the store come on
top in a real pack, so the cost relative to a whole pack is a little lower than printed here.

    python benchmarks/row_markers_pack.py > benchmarks/results/row_markers_pack.txt
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time

import numpy as np
import simplejpeg
import torch
from PIL import Image

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit
from shardkit import codec, jpegrows, libjpeg
from shardkit.bench.sample import image_size, photo_like
from shardkit.packing.imaging import load_rgb

QUALITY = 90


def sources(count: int, seed: int) -> list[bytes]:
    """Photo-like JPEG files as the sample tree writes them (progressive and 4:4:4 aside)."""
    out = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        width, height = image_size(rng)
        buf = io.BytesIO()
        Image.fromarray(photo_like(rng, width, height), "RGB").save(
            buf, "JPEG", quality=int(rng.integers(75, 96)))
        out.append(buf.getvalue())
    return out


def pillow_one_pass(pixels: np.ndarray, markers: bool) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=QUALITY, subsampling="4:2:0",
                                 restart_marker_rows=1 if markers else 0)
    return buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200, help="source images")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    files = sources(args.count, args.seed)
    pixels = [load_rgb(data, args.size) for data in files]

    def pack(markers: bool) -> None:
        for data in files:
            codec.encode(load_rgb(data, args.size), "jpeg", QUALITY, row_markers=markers)

    def encode_only(fn) -> None:
        for image in pixels:
            fn(image)

    configs = {
        "pack, row markers (shardkit pack)": lambda: pack(True),
        "pack, no markers": lambda: pack(False),
        "encode, row markers (codec.encode)":
            lambda: encode_only(lambda p: codec.encode(p, "jpeg", QUALITY)),
        "encode, row markers row by row (encode_each_row)":
            lambda: encode_only(lambda p: jpegrows.encode_each_row(p, QUALITY)),
        "encode, no markers (simplejpeg)":
            lambda: encode_only(lambda p: codec.encode(p, "jpeg", QUALITY, row_markers=False)),
        "encode, Pillow one pass, restart_marker_rows=1":
            lambda: encode_only(lambda p: pillow_one_pass(p, True)),
        "encode, Pillow, no markers": lambda: encode_only(lambda p: pillow_one_pass(p, False)),
    }
    for fn in configs.values():  # warm up: imports, torch kernels, allocator
        fn()
    cpu_s = {name: [] for name in configs}
    names = list(configs)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.process_time()
            configs[name]()
            cpu_s[name].append(time.process_time() - start)

    # Pixels: the marked records against the unmarked encode (must be equal), and what Pillow's
    # one-pass records would store instead.
    marked_same = pillow_same = same_bytes = 0
    pillow_diff = []
    row_index_ok = 0
    for image in pixels:
        marked = codec.encode(image, "jpeg", QUALITY)
        plain = simplejpeg.decode_jpeg(codec.encode(image, "jpeg", QUALITY, row_markers=False))
        marked_same += np.array_equal(simplejpeg.decode_jpeg(marked), plain)
        same_bytes += marked == jpegrows.encode_each_row(image, QUALITY)
        starts = jpegrows.row_starts(marked)
        row_index_ok += starts is not None and len(starts) == -(-image.shape[0] // 16) + 1
        one_pass = simplejpeg.decode_jpeg(pillow_one_pass(image, True))
        pillow_same += np.array_equal(one_pass, plain)
        pillow_diff.append(np.abs(one_pass.astype(np.int16) - plain).astype(np.float64))

    n = len(files)
    load = os.getloadavg()
    print(f"# python benchmarks/row_markers_pack.py --count {args.count} --rounds {args.rounds}")
    print(f"# shardkit {shardkit.__version__}, simplejpeg {simplejpeg.__version__}, "
          f"Pillow {Image.__version__}, torch {torch.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, pinned to CPU {cpu}; load average "
          f"{load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} at the end")
    one_pass = libjpeg.one_pass_encoder(jpegrows.encode_each_row)
    print(f"# row markers written {'in one libjpeg-turbo pass' if one_pass else 'row by row'}")
    print(f"# {n} photo-like sources, shorter side {args.size}, quality {QUALITY}, 4:2:0; "
          f"{args.rounds} alternating rounds, CPU seconds of this process")
    print(f"{'configuration':50s} {'us/img (min)':>12s} {'us/img (sum)':>12s}")
    per = {}
    for name in names:
        per[name] = sum(cpu_s[name]) / (n * args.rounds) * 1e6
        print(f"{name:50s} {min(cpu_s[name]) / n * 1e6:12.1f} {per[name]:12.1f}")

    def ratio(a: str, b: str) -> float:
        return sum(cpu_s[a]) / sum(cpu_s[b])

    print(f"pack CPU with row markers / without: {ratio(names[0], names[1]):.3f} "
          f"(+{(per[names[0]] - per[names[1]]) / per[names[1]] * 100:.1f} %; the encode's extra "
          f"{per[names[2]] - per[names[4]]:.0f} us over a {per[names[1]]:.0f} us pack image)")
    print(f"encode CPU, row markers / no markers: {ratio(names[2], names[4]):.3f}; "
          f"row by row / no markers: {ratio(names[3], names[4]):.3f}; "
          f"Pillow one pass with markers / simplejpeg without: {ratio(names[5], names[4]):.3f}; "
          f"Pillow with markers / Pillow without: {ratio(names[5], names[6]):.3f}")
    diff = np.concatenate([d.ravel() for d in pillow_diff])
    print(f"pixels: records with row markers equal the unmarked encode in {marked_same}/{n} "
          f"images, the same bytes as row by row in {same_bytes}/{n}, "
          f"row index found in {row_index_ok}/{n}; Pillow's one-pass records in "
          f"{pillow_same}/{n} (mean |diff| {diff.mean():.3f}, max {diff.max():.0f}, "
          f"{(diff > 0).mean() * 100:.1f} % of samples differ)")


if __name__ == "__main__":
    main()
