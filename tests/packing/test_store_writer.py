"""shardkit.StoreWriter: the public way to write a store, and the packer's own shard builder."""

from __future__ import annotations

import os

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from helpers import all_records, sources_of
from shardkit import PackError, ShardDataset, StoreWriter, pack
from shardkit.formats import FORMATS, SUFFIXES


def _images(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (int(rng.integers(5, 40)), int(rng.integers(5, 40)), 3),
                         dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_written_store_reads_back(tmp_path, fmt):
    """Pixels (raw: exact) and already-encoded records come back with their labels, sizes and
    source paths; the metadata names the classes."""
    out = str(tmp_path / f"store{SUFFIXES[fmt]}")
    images = _images(1, 7)
    jpeg = simplejpeg.encode_jpeg(images[0], quality=90, colorspace="RGB")
    with StoreWriter(out, ["cat", "dog"], encoding="raw", size=0, source_root="/data") as w:
        for i, img in enumerate(images):
            w.add(img, i % 2, f"/data/{'cat' if i % 2 == 0 else 'dog'}/{i}.png")
        w.skip("/data/dog/broken.png", "cannot identify image file")
    assert w.entry is not None and w.entry["count"] == 7
    assert w.entry["skipped"] == [{"path": "/data/dog/broken.png",
                                   "reason": "cannot identify image file"}]
    records = all_records(out)
    assert len(records) == 7
    for i, (img, label) in enumerate(records):
        assert label == i % 2
        np.testing.assert_array_equal(img, images[i])
    assert sources_of(out) == [f"{'cat' if i % 2 == 0 else 'dog'}/{i}.png" for i in range(7)]
    ds = ShardDataset(out, output="numpy")
    try:
        assert ds.classes == ["cat", "dog"]
    finally:
        ds.close()
    assert os.listdir(tmp_path) == [os.path.basename(out)]

    jpeg_out = str(tmp_path / f"jpeg{SUFFIXES[fmt]}")
    with StoreWriter(jpeg_out, ["cat"], size=0) as w:
        w.add_encoded(jpeg, 0, *images[0].shape[:2])
    [(img, label)] = all_records(jpeg_out)
    np.testing.assert_array_equal(img, simplejpeg.decode_jpeg(jpeg, colorspace="RGB"))
    assert label == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_exception_in_block_leaves_no_file(tmp_path, fmt):
    """An exception inside the block deletes what was written (side files too) and leaves a
    store it would have replaced as it was."""
    out = tmp_path / f"store{SUFFIXES[fmt]}"
    with pytest.raises(RuntimeError, match="boom"):
        with StoreWriter(out, ["a"], encoding="raw", size=0) as w:
            for img in _images(2, 20):
                w.add(img, 0)
            assert os.listdir(tmp_path)  # it was writing
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []

    with StoreWriter(out, ["a"], encoding="raw", size=0) as w:
        w.add(_images(3, 1)[0], 0)
    before = out.read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        with StoreWriter(out, ["a"], encoding="raw", size=0, overwrite=True) as w:
            w.add(_images(4, 1)[0], 0)
            raise RuntimeError("boom")
    assert out.read_bytes() == before
    assert os.listdir(tmp_path) == [out.name]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_same_file_as_pack_for_the_same_pixels(tmp_path, fmt, encoding):
    """Given the pixels pack() decodes (lossless PNG sources kept at their size), StoreWriter
    writes the very file pack() writes: every record, array and metadata byte."""
    src = tmp_path / "src"
    samples = []
    for c, name in enumerate(["alpha", "beta"]):
        (src / name).mkdir(parents=True)
        for i, img in enumerate(_images(10 + c, 4)):
            path = str(src / name / f"{i}.png")
            Image.fromarray(img).save(path)
            samples.append((path, c, img))
    packed = str(tmp_path / f"packed{SUFFIXES[fmt]}")
    pack(str(src), packed, size=0, encoding=encoding, format=fmt, workers=1, progress=False)
    written = str(tmp_path / f"written{SUFFIXES[fmt]}")
    with StoreWriter(written, ["alpha", "beta"], format=fmt, encoding=encoding, size=0,
                     source_root=str(src)) as w:
        for path, label, img in samples:
            w.add(img, label, path)
    with open(packed, "rb") as a, open(written, "rb") as b:
        assert a.read() == b.read()


def test_refuses_bad_input(tmp_path):
    out = tmp_path / "store.lmdb"
    with pytest.raises(PackError, match="`image`"):
        with StoreWriter(out, ["a"]) as w:
            w.add(b"\xff\xd8 not pixels", 0)
    assert not out.exists()
    with pytest.raises(PackError, match="`quality`"):
        StoreWriter(out, ["a"], quality=0)
    out.write_bytes(b"keep")
    with pytest.raises(PackError, match="already exists"):
        StoreWriter(out, ["a"])
    assert out.read_bytes() == b"keep"
