"""Tiny real image trees and store-folder readers: multi-shard, resume, Dask, sampler tests."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from PIL import Image


def image_array(rng: np.random.Generator) -> np.ndarray:
    """A small image of random size: a gradient plus noise (compresses like a photo)."""
    h, w = int(rng.integers(20, 56)), int(rng.integers(20, 56))
    base = np.linspace(0, 200, w, dtype=np.float32)[None, :, None] + rng.uniform(0, 55, 3)
    return (base + rng.normal(0, 20, (h, w, 3))).clip(0, 255).astype(np.uint8)


def write_image(path: str, rng: np.random.Generator, fmt: str = "JPEG") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(image_array(rng)).save(path, fmt, **({"quality": 85} if fmt == "JPEG" else {}))


def make_tree(root: str, classes: int = 3, per_class: int = 14, seed: int = 0,
              fifo: str | None = None) -> list[str]:
    """ImageFolder tree ``root/c<k>/img<i>.jpg`` (one PNG per class); returns relpaths in order.

    ``fifo``: a relpath created as a named pipe instead of an image (a pack blocks on it).
    """
    rng = np.random.default_rng(seed)
    rels = []
    for c in range(classes):
        for i in range(per_class):
            ext, fmt = (".png", "PNG") if i == per_class - 1 else (".jpg", "JPEG")
            rel = f"c{c}/img{i:03d}{ext}"
            path = os.path.join(root, rel)
            if rel == fifo:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.mkfifo(path)
                image_array(rng)  # keep the other images the same as without a fifo
            else:
                write_image(path, rng, fmt)
            rels.append(rel)
    return rels


def manifest(store: str) -> dict:
    with open(os.path.join(store, "manifest.json"), "rb") as f:
        return json.loads(f.read())


def shard_digests(store: str) -> list[tuple[str, int, str]]:
    """(file, count, sha256) of every shard, from the manifest."""
    return [(e["file"], e["count"], e["sha256"]) for e in manifest(store)["shards"]]


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def store_files(store: str) -> dict[str, str]:
    """Every file of a store folder -> its sha256."""
    return {name: sha256(os.path.join(store, name)) for name in sorted(os.listdir(store))}


def partial_of(out: str) -> str:
    head, tail = os.path.split(os.path.abspath(out))
    return os.path.join(head, f".{tail}.partial")
