"""Typed fields written by StoreWriter and read back from real LMDB/HDF5 stores: every kind
round-trips, old stores keep version 1 and read unchanged, damaged columns are refused."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import shardkit
from shardkit import fields as F
from shardkit.errors import StoreError
from shardkit.formats import FORMATS, SUFFIXES
from shardkit.read.store import Store

H, W = 20, 30


def schema() -> F.Schema:
    return F.Schema([
        F.Boxes("boxes", format="XYWH"), F.PerBox("labels"), F.PerBox("area", "float32"),
        F.Masks("masks"), F.SemanticMask("seg"), F.Text("caption"), F.Json("meta"),
        F.Int("n"), F.Float("score"), F.Bool("flag"), F.Array("emb", (3,), "float32"),
        F.Ragged("points", "int32", (2,)), F.MultiLabel("tags", 5), F.Bytes("blob"),
    ])


def record(i: int) -> dict:
    masks = np.zeros((i, H, W), np.uint8)
    for j in range(i):
        masks[j, j:j + 3, 2 * j:2 * j + 5] = 1
    seg = (np.arange(H * W).reshape(H, W) % (i + 2)).astype(np.uint8)
    return {"boxes": [[1.5, 2, 3, 4 + j] for j in range(i)], "labels": list(range(10, 10 + i)),
            "area": [float(j) for j in range(i)], "masks": masks, "seg": seg,
            "caption": f"caption {i} \u00e9\u4e2d", "meta": {"i": i, "list": [1, None, "x"]},
            "n": i - 1, "score": 0.25 * i, "flag": i % 2 == 0, "emb": [i, i + 0.5, -i],
            "points": np.arange(2 * i, dtype=np.int32).reshape(i, 2), "tags": list(range(i)),
            "blob": bytes(range(i))}


def write(path: str, n: int = 4) -> None:
    with shardkit.StoreWriter(path, ["a", "b"], schema=schema()) as w:
        for i in range(n):
            w.add(np.full((H, W, 3), 10 * i, np.uint8), i % 2, **record(i))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_kind_round_trips(tmp_path, fmt):
    path = str(tmp_path / f"s{SUFFIXES[fmt]}")
    write(path)
    store = Store(path)
    assert store.meta["format_version"] == 2
    assert [f["kind"] for f in store.meta["fields"]] == [f.kind for f in schema()]
    fields = store.shard(0).fields
    for i in range(4):
        want = record(i)
        got = {name: fields.value(name, i) for name in schema().names}
        boxes = np.array(want["boxes"], np.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # XYWH -> XYXY
        assert np.array_equal(got["boxes"], boxes) and got["boxes"].dtype == np.float32
        assert got["labels"].tolist() == want["labels"] and got["labels"].dtype == np.int64
        assert np.array_equal(got["masks"], want["masks"]) and got["masks"].shape == (i, H, W)
        assert np.array_equal(got["seg"], want["seg"])
        assert got["caption"] == want["caption"] and isinstance(got["caption"], str)
        assert got["meta"] == want["meta"]
        assert (got["n"], got["score"], got["flag"]) == (i - 1, 0.25 * i, i % 2 == 0)
        assert got["emb"].tolist() == [i, i + 0.5, -i]
        assert np.array_equal(got["points"], want["points"])
        assert got["tags"].tolist() == want["tags"] and got["blob"] == want["blob"]
    report = shardkit.verify(path)
    assert report.ok, report.faults


def test_store_without_fields_is_version_1_and_unchanged(tmp_path):
    path = str(tmp_path / "plain.lmdb")
    with shardkit.StoreWriter(path, ["a"]) as w:
        w.add(np.zeros((H, W, 3), np.uint8), 0)
    store = Store(path)
    assert store.meta["format_version"] == 1 and "fields" not in store.meta
    assert not any(name.startswith("f.") for name in store.meta["arrays"])
    assert store.shard(0).fields is None


def test_schema_file_and_inference(tmp_path):
    spec = tmp_path / "schema.json"
    spec.write_text(json.dumps(schema().as_json()))
    assert F.Schema.load(str(spec)) == schema()
    inferred = F.Schema.infer([{"caption": "a", "n": 1, "x": 0.5, "emb": [1.0, 2.0],
                                "meta": {"k": 1}}])
    assert [(f.name, f.kind) for f in inferred] == [
        ("caption", "text"), ("n", "int"), ("x", "float"), ("emb", "array"), ("meta", "json")]
    path = str(tmp_path / "inferred.lmdb")
    with shardkit.StoreWriter(path, ["a"]) as w:  # no schema: inferred from the first record
        w.add(np.zeros((H, W, 3), np.uint8), 0, caption="hello", n=3)
        w.add(np.zeros((H, W, 3), np.uint8), 0, caption="again", n=4)
    store = Store(path)  # kept: the columns are views of its memory map
    fields = store.shard(0).fields
    assert (fields.value("caption", 1), fields.value("n", 1)) == ("again", 4)


@pytest.mark.parametrize("bad, message", [
    ({"boxes": [[0, 0, float("nan"), 1]]}, "finite"),
    ({"boxes": [[0, 0, -1, 1]]}, "x1 > x2"),
    ({"boxes": [[25, 0, 10, 1]]}, "outside"),
    ({"labels": [1, 2, 3]}, "values for"),
    ({"masks": np.zeros((1, H + 1, W), np.uint8)}, "stored image's size"),
    ({"caption": b"\xff\xfe"}, "UTF-8"),
    ({"meta": "{not json"}, "not valid JSON"),
    ({"meta": float("nan")}, "JSON"),
    ({"n": 1.5}, "non-integer"),
    ({"emb": [1, 2]}, "shape"),
    ({"tags": [7]}, "class index"),
])
def test_bad_values_refused_with_one_line_naming_the_field(tmp_path, bad, message):
    path = str(tmp_path / "bad.lmdb")
    w = shardkit.StoreWriter(path, ["a"], schema=schema())
    rec = record(2) | bad
    with pytest.raises(F.FieldError) as info:
        w.add(np.zeros((H, W, 3), np.uint8), 0, **rec)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert w.count == 0  # nothing was appended
    w.abort()


def test_huge_string_refused_before_copy(tmp_path):
    field = F.Text("caption", max_bytes=1000)
    with pytest.raises(F.FieldError, match="max_bytes"):
        field.check("x" * 5000, {})


def test_unknown_and_missing_fields(tmp_path):
    w = shardkit.StoreWriter(str(tmp_path / "u.lmdb"), ["a"], schema=[F.Text("caption")])
    img = np.zeros((H, W, 3), np.uint8)
    with pytest.raises(F.FieldError, match="not in the schema"):
        w.add(img, 0, caption="x", other=1)
    with pytest.raises(F.FieldError, match="missing"):
        w.add(img, 0)
    w.abort()


def _damage_column(path: str, column: str) -> None:
    """Flip a byte of a field column's stored bytes (found by their content in the file)."""
    store = Store(path)
    arr = np.array(store.shard(0).arrays[column])
    store.close()
    raw = arr.tobytes()
    with open(path, "rb") as f:
        data = bytearray(f.read())
    at = data.find(raw)
    assert at >= 0
    while at >= 0:  # LMDB may hold a stale copy of the page too: damage every copy
        data[at + len(raw) // 2] ^= 0xFF
        at = data.find(raw, at + 1)
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_column_is_refused(tmp_path, fmt):
    path = str(tmp_path / f"d{SUFFIXES[fmt]}")
    write(path, 6)
    _damage_column(path, "f.caption.values")
    with pytest.raises(StoreError, match="checksum"):
        Store(path).shard(0)
    assert not shardkit.verify(path).ok


def test_metadata_with_foreign_dtype_is_refused(tmp_path):
    from shardkit.fields import check_meta

    path = str(tmp_path / "m.lmdb")
    write(path, 2)
    store = Store(path)
    raw = store.shard(0).reader.meta_json()
    meta = json.loads(raw)
    meta["arrays"]["f.n"]["dtype"] = "|O"
    with pytest.raises(StoreError, match="plain numeric dtype"):
        check_meta(meta, "x")
    meta = json.loads(raw)
    del meta["arrays"]["f.caption.offsets"]
    with pytest.raises(StoreError, match="missing"):
        check_meta(meta, "x")
    meta = json.loads(raw)
    meta["fields"][0]["kind"] = "pickle"
    with pytest.raises(StoreError, match="unknown kind"):
        check_meta(meta, "x")
    assert os.path.exists(path)


def _rewrite_column(path: str, column: str, values: np.ndarray) -> None:
    """Replace an LMDB store's field column with ``values`` and vouch for it: its CRC32 in the
    metadata updated and the metadata resealed, so only verify's checks beyond checksums (box
    ranges, per-box lengths) can catch it."""
    import lmdb

    from shardkit import metadata

    env = lmdb.open(path, subdir=False, lock=False)
    with env.begin(write=True) as txn:
        meta = json.loads(txn.get(b"__meta__"))
        meta["arrays"][column] |= {"crc32": metadata.array_crc32(values),
                                   "shape": list(values.shape)}
        txn.put(f"__array__/{column}".encode(), values.tobytes())
        txn.put(b"__meta__", metadata.dumps(metadata.seal(meta)))
    env.close()


def test_verify_catches_checksummed_nonsense(tmp_path):
    path = str(tmp_path / "v.lmdb")
    write(path, 4)
    store = Store(path)
    boxes = np.array(store.shard(0).arrays["f.boxes.values"])
    store.close()
    outside = boxes.copy()
    outside[-1, 2] = W + 50  # a box reaching past its image
    _rewrite_column(path, "f.boxes.values", outside)
    report = shardkit.verify(path)
    assert not report.ok and "outside the" in report.faults[0] and "record 3" in report.faults[0]
    path2 = str(tmp_path / "w.lmdb")
    write(path2, 4)
    store = Store(path2)
    labels = np.array(store.shard(0).arrays["f.labels.values"])
    offsets = np.array(store.shard(0).arrays["f.labels.offsets"])
    store.close()
    offsets[-1] -= 1  # the last record loses a label: per-box lengths disagree
    _rewrite_column(path2, "f.labels.offsets", offsets)
    _rewrite_column(path2, "f.labels.values", labels[:-1].copy())
    report = shardkit.verify(path2)
    assert not report.ok and "values for" in report.faults[0]
