"""Duplicates: ``pack(dedup="exact" | "near")`` on real images with planted duplicates
(re-encoded, resized, cropped, copied), its report, and ``shardkit dedup A B`` between two real
stores."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit.bench.sample import photo_like
from shardkit.dedup import Deduper, cross_pairs, phash
from shardkit.errors import PackError, PackOptionError

ORIGINALS = 24


def _save(path: str, pixels: np.ndarray, fmt: str = "JPEG", **kw) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(pixels).save(path, fmt, **kw)


def _planted(pixels: np.ndarray) -> dict[str, bytes]:
    """Near-duplicates of one image: re-encoded at low quality, resized by 15 %, cropped 4 %."""
    im = Image.fromarray(pixels)
    w, h = im.size
    out = {}
    for name, variant, quality in (
            ("reencoded", im, 45),
            ("resized", im.resize((round(w * 0.85), round(h * 0.85)), Image.Resampling.BICUBIC),
             85),
            ("cropped", im.crop((8, 5, w - 5, h - 5)), 85)):
        buf = io.BytesIO()
        variant.save(buf, "JPEG", quality=quality)
        out[name] = buf.getvalue()
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``src``: 24 distinct photo-like images in two classes, then (named ``z*``, so after them
    in the sources' order) three near-duplicates of image 3 and a lossless PNG copy of image 7;
    ``val``: the three near-duplicates and 4 other distinct images."""
    root = tmp_path_factory.mktemp("dedup")
    src, val = str(root / "src"), str(root / "val")
    images = [photo_like(np.random.default_rng([7, i]), 240, 180) for i in range(ORIGINALS + 4)]
    for i, pixels in enumerate(images[:ORIGINALS]):
        _save(f"{src}/{'ab'[i % 2]}/img{i:02d}.jpg", pixels, quality=90)
    with open(f"{src}/b/img03.jpg", "rb") as f:  # img03 is in class b (odd)
        decoded = np.asarray(Image.open(f).convert("RGB"))
    planted = _planted(decoded)
    for name, data in planted.items():
        for folder in (f"{src}/b", f"{val}/b"):
            os.makedirs(folder, exist_ok=True)
            with open(f"{folder}/z_{name}.jpg", "wb") as f:
                f.write(data)
    with open(f"{src}/b/img07.jpg", "rb") as f:
        _save(f"{src}/b/z_copy07.png", np.asarray(Image.open(f).convert("RGB")), "PNG")
    for i, pixels in enumerate(images[ORIGINALS:]):
        _save(f"{val}/a/other{i}.jpg", pixels, quality=90)
    return {"root": str(root), "src": src, "val": val, "planted": sorted(planted)}


def test_near_dedup_keeps_the_first_and_reports_each_pair(corpus, tmp_path):
    out = str(tmp_path / "train.lmdb")
    result = shardkit.pack(corpus["src"], out, size=128, workers=2, progress=False,
                           dedup="near")
    assert result.count == ORIGINALS  # every distinct image kept, every copy dropped
    dropped = {f"b/z_{name}.jpg" for name in corpus["planted"]} | {"b/z_copy07.png"}
    skipped = {os.path.relpath(s["path"], corpus["src"]): s["reason"] for s in result.skipped}
    assert skipped == {p: "duplicate of " + ("b/img07.jpg" if "copy07" in p else "b/img03.jpg")
                       for p in dropped}
    ds = shardkit.ShardDataset(out)
    assert sorted(ds.source_path(i) for i in range(len(ds))) == sorted(
        f"{'ab'[i % 2]}/img{i:02d}.jpg" for i in range(ORIGINALS))
    with open(out + ".dedup.json", encoding="utf-8") as f:
        report = json.load(f)
    assert result.dedup == {k: v for k, v in report.items() if k != "pairs"} | {
        "report": out + ".dedup.json"}
    assert (report["mode"], report["threshold"], report["kept"], report["dropped"]) == (
        "near", 8, ORIGINALS, 4)
    pairs = {(p["kept"], p["dropped"]): p["distance"] for p in report["pairs"]}
    assert set(pairs) == {("b/img07.jpg" if "copy07" in p else "b/img03.jpg", p)
                          for p in dropped}
    assert pairs[("b/img07.jpg", "b/z_copy07.png")] == 0
    assert all(0 <= d <= 8 for d in pairs.values())


def test_exact_dedup_drops_only_identical_pixels(corpus, tmp_path):
    """A folder store; the PNG copy has the JPEG's decoded pixels, the near-duplicates do not."""
    out = str(tmp_path / "exact")
    result = shardkit.pack(corpus["src"], out, size=128, workers=1, progress=False,
                           dedup="exact", shard_size=1 << 20)
    assert result.count == ORIGINALS + 3
    assert [(os.path.relpath(s["path"], corpus["src"]), s["reason"]) for s in result.skipped] \
        == [("b/z_copy07.png", "duplicate of b/img07.jpg")]
    with open(out + ".dedup.json", encoding="utf-8") as f:
        report = json.load(f)
    assert report["pairs"] == [{"kept": "b/img07.jpg", "dropped": "b/z_copy07.png",
                                "distance": 0}]
    assert "threshold" not in report


def test_dedup_command_lists_cross_store_leaks(corpus, tmp_path, capsys):
    """``shardkit dedup`` (its ``main``, in this process: the stores are real, torch is loaded)."""
    from shardkit.cli import main

    train, val = str(tmp_path / "train.lmdb"), str(tmp_path / "val.lmdb")
    assert main(["pack", corpus["src"], train, "--size", "128", "--workers", "1", "-q",
                 "--dedup", "exact"]) == 0
    assert (f"dedup exact: 1 duplicate skipped (listed in the store's metadata), each pair in "
            f"{train}.dedup.json") in capsys.readouterr().err
    shardkit.pack(corpus["val"], val, size=128, workers=1, progress=False)
    capsys.readouterr()
    assert main(["dedup", train, val, "--json"]) == 0
    proc = capsys.readouterr()
    found = {(p["a"], p["b"]) for p in json.loads(proc.out)}
    # Each planted copy in val pairs with the original and with the copies train kept.
    kept_copies = {f"b/z_{name}.jpg" for name in corpus["planted"]}
    assert found == {(a, f"b/z_{name}.jpg") for name in corpus["planted"]
                     for a in {"b/img03.jpg"} | kept_copies}
    assert proc.err.strip().endswith(f"{len(found)} pairs within 8 bits")
    assert main(["dedup", train, val, "--threshold", "65"]) != 0
    assert "`threshold` must be an integer in 0..64" in capsys.readouterr().err


def test_dedup_refusals(corpus, tmp_path):
    out = str(tmp_path / "o.lmdb")
    for kwargs, message in (
            ({"dedup": "fuzzy"}, "`dedup` must be one of 'exact', 'near', not 'fuzzy'"),
            ({"dedup": "exact", "dedup_threshold": 4}, "`dedup_threshold` needs `dedup='near'`"),
            ({"dedup_threshold": 4}, "`dedup_threshold` needs `dedup='near'`"),
            ({"dedup": "near", "dedup_threshold": 65}, "`threshold` must be an integer"),
            ({"dedup": "near", "engine": "dask", "shard_size": 1 << 20},
             "`dedup` cannot be combined with `engine='dask'`"),
            ({"dedup": "near", "resume": True, "shard_size": 1 << 20},
             "`dedup` cannot be combined with `resume=True`")):
        with pytest.raises(PackOptionError, match=message.replace("(", r"\(").replace(
                ")", r"\)")):
            shardkit.pack(corpus["src"], out, progress=False, **kwargs)
    with open(out + ".dedup.json", "w") as f:
        f.write("someone else's")
    with pytest.raises(PackError, match="dedup.json already exists"):
        shardkit.pack(corpus["src"], out, progress=False, dedup="near")
    with open(out + ".dedup.json") as f:
        assert f.read() == "someone else's"
    assert not os.path.exists(out)


def test_phash_is_its_documented_definition():
    """The 32x32 antialiased bilinear resize, luma, the orthonormal DCT-II coefficient by
    coefficient, and bit ``8 * row + column`` (most significant first) set above the median."""
    import torch

    pixels = photo_like(np.random.default_rng(5), 341, 256)
    image = torch.from_numpy(pixels).permute(2, 0, 1)[None]
    small = torch.nn.functional.interpolate(image, size=(32, 32), mode="bilinear",
                                            antialias=True)[0].permute(1, 2, 0).numpy()
    grey = small.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    n = np.arange(32)

    def coefficient(u: int, v: int) -> float:
        cu = np.cos(np.pi * (2 * n + 1) * u / 64) * np.sqrt((1 if u else 0.5) / 16)
        cv = np.cos(np.pi * (2 * n + 1) * v / 64) * np.sqrt((1 if v else 0.5) / 16)
        return float(cu @ grey @ cv)

    low = [coefficient(u, v) for u in range(8) for v in range(8)]
    median = np.median(low)
    want = sum(1 << (63 - i) for i, c in enumerate(low) if c > median)
    assert phash(pixels) == want and 20 < bin(want).count("1") < 44


def test_search_is_exact():
    """cross_pairs against a pair-by-pair count, at the threshold's edges, over blocks."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**63, size=300, dtype=np.uint64)
    b = np.concatenate([a[:50] ^ np.uint64(0b1111111111), rng.integers(0, 2**63, size=250,
                                                                         dtype=np.uint64)])
    want = [(i, j, bin(int(x) ^ int(y)).count("1")) for i, x in enumerate(a)
            for j, y in enumerate(b) if bin(int(x) ^ int(y)).count("1") <= 10]
    assert len(want) >= 50 and cross_pairs(a, b, 10) == want
    assert [p for p in cross_pairs(a, b, 9) if p[2] == 10] == []
    d = Deduper("near", 3)
    d.keep("x", 0b1111)
    d.keep("y", 0b0111)
    assert d.duplicate_of("z", 0b0011) == "y"  # the nearest kept
    assert d.duplicate_of("w", 0b0111_0000) is None
    d.keep("w", 0b0111_0000)
    assert d.duplicate_of("v", 0b0111_0111) == "y"  # y and w both 3 bits away: the earlier
    assert d.duplicate_of("u", 0b1111_0000) == "w"


def test_records_kept_byte_for_byte_are_hashed_too(corpus, tmp_path):
    """A tar's JPEGs packed at their own size are stored as they are (no encode step): the hash
    comes from the stored record; one member repeated under another key is the only pair."""
    import tarfile

    tar = str(tmp_path / "shard-000.tar")
    names = [f"b/img{i:02d}.jpg" for i in (1, 3, 5)] + ["b/img03.jpg"]
    with tarfile.open(tar, "w") as t:
        for k, name in enumerate(names):
            t.add(os.path.join(corpus["src"], name), arcname=f"{k:04d}.jpg")
            label = tarfile.TarInfo(f"{k:04d}.cls")
            label.size = 1
            t.addfile(label, io.BytesIO(b"1"))
    out = str(tmp_path / "tar.lmdb")
    result = shardkit.pack(tar, out, size=0, workers=1, progress=False, dedup="exact")
    assert result.count == 3
    with open(out + ".dedup.json", encoding="utf-8") as f:
        pairs = json.load(f)["pairs"]
    assert [(p["kept"].split("#")[-1], p["dropped"].split("#")[-1], p["distance"])
            for p in pairs] == [("0001.jpg", "0003.jpg", 0)]
