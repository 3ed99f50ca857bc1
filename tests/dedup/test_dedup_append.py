"""Duplicates at append time: a folder store packed with ``dedup`` keeps its records' hashes,
and an append with the same ``dedup`` compares the new images with them."""

from __future__ import annotations

import io
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit.bench.sample import photo_like
from shardkit.errors import PackOptionError


def _jpeg(path, pixels, quality=90) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(pixels).save(path, "JPEG", quality=quality)


@pytest.mark.parametrize("mode", ["near", "exact"])
def test_an_append_drops_new_images_that_duplicate_the_stores(tmp_path, mode):
    src, out = tmp_path / "src", tmp_path / "out"
    images = [photo_like(np.random.default_rng([3, i]), 200, 150) for i in range(10)]
    for i in range(6):
        _jpeg(src / "a" / f"img{i}.jpg", images[i])
    shardkit.pack(src, out, shard_size=40_000, dedup=mode, workers=1, progress=False)
    assert json.loads((out / "manifest.json").read_bytes())["dedup"]["mode"] == mode
    # New arrivals: two distinct images and a copy of img2 (byte for byte: both modes catch
    # it) under another name; near mode also gets img4 re-encoded at quality 50.
    for i in (6, 7):
        _jpeg(src / "b" / f"new{i}.jpg", images[i])
    shutil.copy(src / "a" / "img2.jpg", src / "b" / "copy2.jpg")
    if mode == "near":
        decoded = np.asarray(Image.open(src / "a" / "img4.jpg").convert("RGB"))
        _jpeg(src / "b" / "again4.jpg", decoded, quality=50)
    done = shardkit.pack(src, out, append=True, dedup=mode, workers=1, progress=False)
    dropped = {os.path.basename(s["path"]): s["reason"] for s in done.skipped}
    want = {"copy2.jpg": "duplicate of a/img2.jpg"}
    if mode == "near":
        want["again4.jpg"] = "duplicate of a/img4.jpg"
    assert dropped == want
    ds = shardkit.ShardDataset(out)
    assert sorted(ds.key(i) for i in range(len(ds))) == sorted(
        [f"a/img{i}.jpg" for i in range(6)] + ["b/new6.jpg", "b/new7.jpg"])
    report = json.loads(open(f"{out}.dedup.json", "rb").read())
    assert sorted(p["dropped"] for p in report["pairs"]) == sorted(f"b/{n}" for n in want)
    # The new version keeps every record's hash: a second append compares with the new ones.
    shutil.copy(src / "b" / "new7.jpg", src / "b" / "copy7.jpg")
    _jpeg(src / "b" / "new8.jpg", images[8])
    again = shardkit.pack(src, out, append=True, dedup=mode, workers=1, progress=False)
    assert again.count == 1 and [s["reason"] for s in again.skipped] == [
        "duplicate of b/new7.jpg"]


def test_an_append_with_dedup_needs_the_stores_hashes(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    for i in range(3):
        _jpeg(src / "a" / f"img{i}.jpg", photo_like(np.random.default_rng([5, i]), 120, 90))
    shardkit.pack(src, out, shard_size=40_000, workers=1, progress=False)
    _jpeg(src / "a" / "img9.jpg", photo_like(np.random.default_rng([5, 9]), 120, 90))
    with pytest.raises(PackOptionError, match="holds no near hashes of its records"):
        shardkit.pack(src, out, append=True, dedup="near", workers=1, progress=False)


def test_a_stores_hashes_are_its_records_phash_across_hash_batches(tmp_path):
    """Workers hash near mode's records a batch at a time (HASH_BATCH): over more records than
    one batch, with unusable files among them, each record's kept hash is the pHash of its
    packed pixels (stored raw, so read back exactly)."""
    from shardkit.dedup import phash, phash_many, thumbnail
    from shardkit.packing.dedup_run import HASH_BATCH

    src, out = tmp_path / "src", tmp_path / "out"
    count = HASH_BATCH + 9
    for i in range(count):
        _jpeg(src / "ab"[i % 2] / f"img{i:02d}.jpg",
              photo_like(np.random.default_rng([4, i]), 64 + i, 48))
        if i in (5, HASH_BATCH - 1):
            (src / "ab"[i % 2] / f"img{i:02d}-broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    done = shardkit.pack(src, out, size=40, encoding="raw", shard_size=100_000, dedup="near",
                         workers=1, progress=False)
    assert done.count == count and len(done.skipped) == 2
    entry = json.loads((out / "manifest.json").read_bytes())["dedup"]
    hashes = np.load(out / entry["file"])
    ds = shardkit.ShardDataset(out, output="numpy")
    pixels = [ds[i][0] for i in range(len(ds))]
    assert hashes.tolist() == [phash(p) for p in pixels]
    assert len(set(hashes.tolist())) == count  # distinct images: no two hashes alike
    assert phash_many(np.stack([thumbnail(p) for p in pixels])) == hashes.tolist()
