#!/usr/bin/env python
"""Make a sample ImageFolder tree of photo-like JPEGs (ImageNet-like sizes and encodings).

Content is multi-octave noise with a 1/f spectrum plus soft shapes, so JPEG sizes and decode cost
resemble real photos rather than flat colours. Sizes: most sides 300-800 px, mean about 500x375;
quality 75-95; about 1 in 8 progressive and 1 in 8 with 4:4:4 chroma; a few large (2000+ px).
Deterministic for a given --seed.

    python scripts/make_sample.py OUT_DIR --count 2000 --classes 10
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys

import numpy as np
from PIL import Image


def _smooth_noise(rng: np.random.Generator, width: int, height: int, cells: int,
                  channels: int) -> np.ndarray:
    """Random field with features about 1/cells of the image: small noise, bicubic upscale."""
    gh = max(2, cells * height // max(width, height) + 1)
    gw = max(2, cells * width // max(width, height) + 1)
    small = rng.integers(0, 256, size=(gh, gw, channels), dtype=np.uint8)
    mode = "RGB" if channels == 3 else "L"
    layer = Image.fromarray(small if channels == 3 else small[..., 0], mode)
    out = np.asarray(layer.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32)
    return (out if channels == 3 else out[..., None]) - 128.0


def photo_like(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """HxWx3 uint8 with natural-image-like statistics: 1/f colour structure, textured regions."""
    img = np.full((height, width, 3), rng.uniform(70, 180), dtype=np.float32)
    amplitude = 0.9
    for octave in range(1, 8):
        img += _smooth_noise(rng, width, height, 2 ** octave, 3) * amplitude
        amplitude *= 0.72
    # Texture (foliage, fabric, fur) in some regions, smooth sky-like areas in others.
    texture = np.clip(_smooth_noise(rng, width, height, 3, 1) / 64.0 + 0.5, 0, 1)
    grain = rng.standard_normal((height, width, 1), dtype=np.float32)
    img += grain * (texture * float(rng.uniform(20, 40)))
    return img.clip(0, 255).astype(np.uint8)


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    if rng.random() < 0.03:
        long = int(rng.integers(2000, 3200))
    else:
        long = int(np.clip(rng.normal(445, 80), 300, 800))
    short = int(long * rng.choice([0.75, 0.75, 0.75, 0.667, 0.8, 1.0, 0.5625]))
    return (long, max(short, 200)) if rng.random() < 0.8 else (max(short, 200), long)


def _write_one(job: tuple[str, int, int]) -> None:
    path, seed, i = job
    rng = np.random.default_rng([seed, i])
    width, height = image_size(rng)
    pixels = photo_like(rng, width, height)
    kwargs = {"quality": int(rng.integers(75, 96))}
    if rng.random() < 0.125:
        kwargs["progressive"] = True
    if rng.random() < 0.125:
        kwargs["subsampling"] = 0  # 4:4:4
    Image.fromarray(pixels, "RGB").save(path, "JPEG", **kwargs)


def make_sample(out: str, count: int, classes: int, seed: int = 0,
                workers: int | None = None) -> None:
    """Write ``count`` images round-robin into ``classes`` class folders under ``out``."""
    names = [f"class_{i:03d}" for i in range(classes)]
    for name in names:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    jobs = [(os.path.join(out, names[i % classes], f"img_{i:06d}.JPEG"), seed, i)
            for i in range(count)]
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        for job in jobs:
            _write_one(job)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_write_one, jobs, chunksize=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to create (OUT/<class>/<image>.JPEG)")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make_sample(args.out, args.count, args.classes, args.seed)
    print(f"wrote {args.count} images in {args.classes} classes to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
