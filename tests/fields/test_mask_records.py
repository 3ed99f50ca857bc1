"""Masks as lossless side records beside the image record (issue 19, "On disk"): real LMDB and
HDF5 stores, written by StoreWriter and by ``pack --coco``, read back unchanged; every read of a
mask record checks its length and CRC32 (a flipped byte, a missing record: StoreError and a
failing ``verify`` naming the record); the packer streams masks to the file (bounded memory);
``shard_size`` counts their bytes."""

from __future__ import annotations

import json
import os
import tracemalloc

import numpy as np
import pytest
from helpers import run_cli
from PIL import Image

import shardkit
from shardkit import fields as F
from shardkit.codec import encode
from shardkit.errors import StoreError
from shardkit.formats import FORMATS, SUFFIXES, open_reader
from shardkit.formats.lmdb.writer import TXN_BYTES
from shardkit.read.store import Store

H, W = 48, 80
N = 8


def schema() -> F.Schema:
    return F.Schema([F.Boxes("boxes"), F.PerBox("labels"), F.Masks("masks"),
                     F.SemanticMask("seg", "int32"), F.Text("caption")])


def record(i: int) -> dict:
    """Record ``i``'s fields: ``i % 4`` noisy (incompressible, so unique) masks with boxes."""
    rng = np.random.default_rng(100 + i)
    n = i % 4
    masks = rng.integers(0, 2, (n, H, W), dtype=np.uint8)
    seg = rng.integers(-3, 1 << 20, (H, W), dtype=np.int32)
    boxes = [[j, j, W - j, H - 2 * j] for j in range(n)]
    return {"boxes": boxes, "labels": list(range(7, 7 + n)), "masks": masks, "seg": seg,
            "caption": f"image {i}"}


def write(path: str, n: int = N) -> None:
    with shardkit.StoreWriter(path, ["a"], schema=schema()) as w:
        for i in range(n):
            w.add(np.full((H, W, 3), 20 * i, np.uint8), 0, **record(i))


def stored_record(path: str, stream: str, i: int) -> bytes:
    """Record ``i``'s bytes in side stream ``stream``, as the backend serves them."""
    reader = open_reader(path)
    try:
        with reader.side_records(stream) as get:
            return bytes(get(i))
    finally:
        reader.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_masks_are_side_records_and_round_trip(tmp_path, fmt):
    path = str(tmp_path / f"s{SUFFIXES[fmt]}")
    write(path)
    store = Store(path)
    arrays = store.meta["arrays"]
    # Masks are not index columns: two small per-record columns (length, CRC32) instead.
    assert {n for n in arrays if n.startswith("f.masks") or n.startswith("f.seg")} == {
        "f.masks.nbytes", "f.masks.crc32", "f.seg.nbytes", "f.seg.crc32"}
    assert arrays["f.masks.nbytes"] == arrays["f.masks.nbytes"] | {"dtype": "<i8", "shape": [N]}
    assert arrays["f.masks.crc32"]["dtype"] == "<u4"
    assert "f.caption.values" in arrays and "f.boxes.values" in arrays  # still columns
    shard = store.shard(0)
    masks_f = schema()["masks"]
    for i in range(N):
        want = record(i)
        raw = stored_record(path, "f.masks", i)
        assert raw == masks_f.encode(want["masks"], {"height": H, "width": W,
                                                     "values": {"boxes": want["boxes"]}})
        assert int(shard.fields.cols["f.masks.nbytes"][i]) == len(raw)
        got = shard.fields.value("masks", i)
        assert got.dtype == np.uint8 and np.array_equal(got, want["masks"])
        assert np.array_equal(shard.fields.value("seg", i), want["seg"])
    store.close()
    for workers in (0, 2):  # the dataset's items, in this process and in workers
        ds = shardkit.ShardDataset(path, fields=["boxes", "masks", "seg", "caption"],
                                   tv_tensors=False)
        loader = ds.loader(batch_size=3, num_workers=workers, shuffle=False)
        seen = 0
        for _, targets in loader:
            for j, mask in enumerate(targets["masks"]):
                want = record(seen + j)
                assert np.array_equal(mask.numpy(), want["masks"])
                assert np.array_equal(targets["seg"][j].numpy(), want["seg"])
                assert targets["caption"][j] == want["caption"]
            seen += len(targets["masks"])
        assert seen == N
    assert shardkit.verify(path).ok
    info = json.loads(run_cli("info", path, "--json").stdout)
    assert [(f["name"], f["kind"]) for f in info["fields"]] == [
        (f.name, f.kind) for f in schema()]


def _flip_in_file(path: str, raw: bytes) -> None:
    """Flip one byte in the middle of ``raw`` where the file holds it (every copy)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.find(raw)
    assert at >= 0, "the stored record is not in the file as is"
    while at >= 0:
        data[at + len(raw) // 2] ^= 0x5A
        at = data.find(raw, at + 1)
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("field", ["masks", "seg"])
def test_flipped_byte_in_a_mask_record(tmp_path, fmt, field):
    path = str(tmp_path / f"f{SUFFIXES[fmt]}")
    write(path)
    _flip_in_file(path, stored_record(path, f"f.{field}", 5))
    store = Store(path)
    fields = store.shard(0).fields  # opening does not read the masks: it succeeds
    for i in (0, 1, 2, 3, 4, 6, 7):
        fields.value(field, i)  # the other records read unchanged
    with pytest.raises(StoreError, match=rf"record 5, field '{field}': side record is "
                                         r"damaged \(checksum mismatch\)"):
        fields.value(field, 5)
    store.close()
    ds = shardkit.ShardDataset(path, fields=["boxes", field])
    with pytest.raises(StoreError, match="record 5"):
        ds[5]
    report = shardkit.verify(path)
    assert not report.ok
    assert len(report.faults) == 1 and f"record 5, field '{field}'" in report.faults[0]
    done = run_cli("verify", path)
    assert done.returncode != 0 and "record 5" in done.stdout + done.stderr


def _remove_side_record(path: str, fmt: str, stream: str, i: int) -> None:
    if fmt == "lmdb":
        import lmdb

        from shardkit.formats.lmdb.validate import side_key

        env = lmdb.open(path, subdir=False, lock=False)
        with env.begin(write=True) as txn:
            assert txn.delete(side_key(i, stream))
        env.close()
    else:  # HDF5 has one stream dataset: take the whole stream away
        import h5py

        with h5py.File(path, "r+") as f:
            del f[f"side/{stream}"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_side_record(tmp_path, fmt):
    path = str(tmp_path / f"m{SUFFIXES[fmt]}")
    write(path)
    _remove_side_record(path, fmt, "f.masks", 2)
    fields = Store(path).shard(0).fields
    with pytest.raises(StoreError, match=r"record 2, field 'masks': record 2's side record in "
                                         r"stream 'f\.masks' is missing"):
        fields.value("masks", 2)
    assert np.array_equal(fields.value("seg", 2), record(2)["seg"])
    report = shardkit.verify(path)
    missing = [f for f in report.faults if "field 'masks'" in f and "is missing" in f]
    assert missing == report.faults and any("record 2, field 'masks'" in f for f in missing)
    assert len(missing) == (1 if fmt == "lmdb" else N)  # HDF5: the stream is gone, all of it


def test_side_streams_are_checked_by_the_writer(tmp_path):
    """Every record carries the same streams: a record without one is refused at once."""
    from shardkit.formats import open_writer

    for fmt in FORMATS:
        writer = open_writer(str(tmp_path / f"w{SUFFIXES[fmt]}"), fmt)
        try:
            with pytest.raises(ValueError, match="before any record"):
                writer.append_side("f.masks", b"x")
            writer.append(b"a")
            writer.append_side("f.masks", b"m0")
            writer.append_side("f.seg", b"s0")
            with pytest.raises(ValueError, match="already has"):
                writer.append_side("f.seg", b"again")
            writer.append(b"b")
            writer.append_side("f.seg", b"s1")
            with pytest.raises(ValueError, match="record 1 lacks its side record in stream "
                                                 "'f.masks'"):
                writer.append(b"c")
            with pytest.raises(ValueError, match="side stream name"):
                writer.append_side("f/../x", b"")
        finally:
            writer.discard()


@pytest.mark.parametrize("fmt", FORMATS)
def test_packing_streams_masks_to_the_file(tmp_path, fmt):
    """A store whose masks total ~32 MiB is written with a fraction of that in Python memory:
    each record's masks go to the shard file as it is added (the LMDB writer commits every
    ~8 MiB; HDF5 spools to a side file), not held until the shard finishes."""
    h, w, n = 128, 256, 16  # 64 KiB of incompressible bit planes per record
    records = 520
    rng = np.random.default_rng(0)
    jpeg = encode(np.full((h, w, 3), 90, np.uint8), "jpeg", 90)
    boxes = [[0, 0, w, h]] * n
    path = str(tmp_path / f"big{SUFFIXES[fmt]}")
    total = 0
    tracemalloc.start()
    try:
        with shardkit.StoreWriter(path, ["a"], schema=[F.Boxes("boxes"), F.Masks("masks")]) as wr:
            for i in range(records):
                masks = rng.integers(0, 2, (n, h, w), dtype=np.uint8)
                wr.add_encoded(jpeg, 0, h, w, boxes=boxes, masks=masks)
                total += n * h * w // 8
                if i == 0:
                    tracemalloc.reset_peak()  # from here on: what writing holds, not set-up
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 32 << 20
    # What may be held: the LMDB writer's uncommitted transaction, a few records' arrays.
    bound = (TXN_BYTES if fmt == "lmdb" else 0) + (4 << 20)
    assert peak < bound, f"writing held {peak / 2**20:.1f} MiB for {total / 2**20:.0f} MiB " \
                            "of masks"
    ds = shardkit.ShardDataset(path, fields=["masks"], tv_tensors=False)
    last = np.random.default_rng(0)
    for i in range(records):
        want = last.integers(0, 2, (n, h, w), dtype=np.uint8)
        if i in (0, 257, records - 1):
            assert np.array_equal(ds[i][1]["masks"].numpy(), want)


def test_shard_size_counts_mask_bytes(tmp_path):
    """``pack --coco --shard-size``: masks (noise: incompressible) are most of each record's
    bytes; the shards come out near the target, not several times it."""
    from pycocotools import mask as coco_mask

    images_dir = tmp_path / "images"
    images_dir.mkdir()
    rng = np.random.default_rng(3)
    side, per_image, count = 128, 10, 16
    images, anns = [], []
    for k in range(count):
        name = f"img_{k:02d}.jpg"
        Image.fromarray(np.full((side, side, 3), 40 + k, np.uint8)).save(images_dir / name)
        images.append({"id": k + 1, "file_name": name, "width": side, "height": side})
        for j in range(per_image):
            mask = rng.integers(0, 2, (side, side), dtype=np.uint8)
            rle = coco_mask.encode(np.asfortranarray(mask))
            anns.append({"id": 100 * k + j, "image_id": k + 1, "category_id": 1, "iscrowd": 0,
                         "bbox": [0.0, 0.0, float(side), float(side)], "area": 1.0,
                         "segmentation": {"size": [side, side],
                                          "counts": rle["counts"].decode("ascii")}})
    coco = tmp_path / "instances.json"
    coco.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": 1, "name": "noise"}]}))
    target = 100_000  # ~23 KB a record, masks ~20 KB of it: about 4 records a shard
    for fmt in FORMATS:
        out = str(tmp_path / f"out-{fmt}")
        shardkit.pack(str(images_dir), out, coco=str(coco), shard_size=target, format=fmt,
                      workers=1, progress=False, order="source")
        with open(os.path.join(out, "manifest.json")) as f:
            shards = json.load(f)["shards"]
        sizes = [s["bytes"] for s in shards]
        assert len(shards) >= 3, sizes
        assert max(sizes[:-1]) <= 1.3 * target and min(sizes[:-1]) >= 0.6 * target, sizes
        ds = shardkit.ShardDataset(out, fields=["masks"], tv_tensors=False)
        assert ds[count - 1][1]["masks"].shape == (per_image, side, side)
        assert shardkit.verify(out).ok


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_carries_the_masks(tmp_path, fmt):
    """WebDataset members (``.npy``) and parquet columns hold the masks read from the side
    records, value for value."""
    import io

    import pyarrow.parquet as pq
    import webdataset as wds

    from shardkit.export import export

    path = str(tmp_path / f"e{SUFFIXES[fmt]}")
    write(path)
    export(path, str(tmp_path / "t-%06d.tar"), progress=False)
    got = list(wds.WebDataset(str(tmp_path / "t-000000.tar"), shardshuffle=False))
    assert len(got) == N
    for i, sample in enumerate(got):
        assert np.array_equal(np.load(io.BytesIO(sample["masks.npy"])), record(i)["masks"])
        assert np.array_equal(np.load(io.BytesIO(sample["seg.npy"])), record(i)["seg"])
    files = export(path, str(tmp_path / "p-%02d.parquet"), to="parquet",
                   progress=False).files
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert len(rows) == N
    for i, row in enumerate(rows):
        assert np.array_equal(np.array(row["seg"], np.int32), record(i)["seg"])
        want = record(i)["masks"]
        assert np.array_equal(np.array(row["masks"], np.uint8).reshape(want.shape), want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_longest_field_names_are_side_streams_too(tmp_path, fmt):
    """A field name may have 64 characters; its stream ("f." + name) must be accepted as well."""
    name = "m" * 64
    path = str(tmp_path / f"long{SUFFIXES[fmt]}")
    seg = np.arange(H * W, dtype=np.int32).reshape(H, W) % 7
    with shardkit.StoreWriter(path, ["a"], schema=[F.SemanticMask(name, "int32")]) as w:
        w.add(np.zeros((H, W, 3), np.uint8), 0, **{name: seg})
    _, target = shardkit.ShardDataset(path, fields=[name], output="numpy")[0]
    assert np.array_equal(np.asarray(target[name]), seg)


def test_a_mask_record_too_short_for_its_header_is_a_field_error():
    with pytest.raises(F.FieldError, match="has no header"):
        F.Masks("masks").decode(b"\x01", {"height": 2, "width": 2})
