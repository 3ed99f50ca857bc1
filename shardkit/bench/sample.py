"""Photo-like sample ImageFolder trees, for benchmarks and tests (``scripts/make_sample.py``).

Content is smooth colour fields, 1/f luminance structure, soft-edged objects, fine texture and
grain, so JPEG decode cost resembles real photos rather than flat colours (256-px re-encodes decode
at a median 0.47 of a flat image's speed; a real photo, grace_hopper.jpg, at 0.32:
benchmarks/decode_realism.py). Sizes: long side 300-800 px, mean about
500x375; quality 75-95; about 1 in 8 progressive and 1 in 8 with 4:4:4 chroma; 1 in 100 large
(1200-2600 px). Files are smaller than ImageNet's (about 25-40 KB against 110 KB: less pixel-level
noise), so a PIL baseline decodes them slightly faster than real photos, if anything.
Deterministic for a given seed.
"""

from __future__ import annotations

import multiprocessing
import os
import zlib

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

WORK_SCALE = 0.5      # content is synthesised at half size and upscaled (photos are soft at 1 px)
WORK_LONG_MAX = 450   # ... and at most this long side (large images cost no more to make)


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


def _shapes(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
    """``base`` with a few soft-edged objects (ellipses, polygons) painted over it."""
    h, w = base.shape[:2]
    canvas = Image.fromarray(base, "RGB")
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(3, 12))):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        rx, ry = rng.uniform(0.03, 0.3) * w, rng.uniform(0.03, 0.3) * h
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=colour)
        else:
            angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 7))))
            draw.polygon([(cx + rx * np.cos(a), cy + ry * np.sin(a)) for a in angles], fill=colour)
    canvas = canvas.filter(ImageFilter.GaussianBlur(0.5))
    return np.asarray(canvas, dtype=np.float32)


def photo_like(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """HxWx3 uint8 with natural-image-like statistics.

    Smooth colour fields, 1/f luminance structure, soft-edged objects, a little fine texture and
    sensor grain. 256-px q90 re-encodes decode at about half the speed of a flat image of the
    same size with libjpeg-turbo (real photos are slower still: benchmarks/decode_realism.py).
    """
    scale = min(WORK_SCALE, WORK_LONG_MAX / max(width, height))
    w, h = max(16, round(width * scale)), max(16, round(height * scale))
    img = np.empty((h, w, 3), dtype=np.float32)
    img[...] = rng.uniform(60, 190, 3)
    img += _smooth_noise(rng, w, h, 3, 3) * 0.35           # colour: low frequency only
    img += _smooth_noise(rng, w, h, 6, 3) * 0.175
    amplitude = 0.9
    for octave in range(1, 6):                              # luminance: amplitude ~ 1/f
        img += _smooth_noise(rng, w, h, 2 ** octave, 1) * amplitude
        amplitude *= 0.5
    objects = _shapes(rng, img.clip(0, 255).astype(np.uint8))
    mix = np.clip(_smooth_noise(rng, w, h, 4, 1) / 40.0 + 0.5, 0, 1) * 0.8
    img += (objects - img) * mix
    texture = np.clip(_smooth_noise(rng, w, h, 3, 1) / 50.0 + 0.2, 0, 1)
    img += _smooth_noise(rng, w, h, int(max(w, h) / (6 * scale)), 1) * texture * 0.05
    out = Image.fromarray(img.clip(0, 255).astype(np.uint8), "RGB")
    if out.size != (width, height):
        out = out.resize((width, height), Image.Resampling.BICUBIC)
    # Luminance grain: one random tile repeated (cheap for large images).
    th, tw = min(height, 512), min(width, 512)
    grain = rng.normal(0, 3, size=(th, tw, 1)).astype(np.float32)
    grain = np.tile(grain, (-(-height // th), -(-width // tw), 1))[:height, :width]
    return (np.asarray(out, dtype=np.float32) + grain).clip(0, 255).astype(np.uint8)


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height): long side ~N(480, 70) in 300..800, 1 in 100 large (1200-2600 px);
    the mean area is about 500 x 375 (the large ones included), as in ImageNet."""
    if rng.random() < 0.01:
        long = int(rng.integers(1200, 2600))
    else:
        long = int(np.clip(rng.normal(480, 70), 300, 800))
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


def path_seed(out: str) -> int:
    """A seed from the absolute, normalised path of ``out``: two folders get different images
    (a val set is not a copy of train), while remaking one folder gives the same images."""
    return zlib.crc32(os.path.abspath(out).encode("utf-8", "surrogateescape"))


def make_sample(out: str, count: int, classes: int, seed: int = 0,
                workers: int | None = None) -> None:
    """Write ``count`` images round-robin into ``classes`` class folders under ``out``."""
    names = [f"class_{i:03d}" for i in range(classes)]
    for name in names:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    jobs = [(os.path.join(out, names[i % classes], f"img_{i:06d}.JPEG"), seed, i)
            for i in range(count)]
    workers = min(workers or os.cpu_count() or 1, max(1, count // 16))
    if workers == 1:
        for job in jobs:
            _write_one(job)
        return
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_write_one, jobs, chunksize=8)
