"""A forged store whose checksums were recomputed: ``verify`` re-derives the row index and the
bucket list from the records themselves, and ``verify=True`` reads check a record's row index
against its own restart markers before a partial decode trusts it. Real LMDB stores written
here, forged with the lmdb package as an outside tool would."""

from __future__ import annotations

import json
import os

import lmdb
import numpy as np
import pytest
from helpers import noise, rewrite_metadata
from helpers.buckets import bucketed_store

import shardkit
from shardkit import BucketSampler, ShardDataset
from shardkit.errors import StoreError
from shardkit.fileutil import sha256_file
from shardkit.metadata import MANIFEST_NAME, array_crc32, seal
from shardkit.packing import StoreWriter

# 400 rows: 25 MCU rows of 16, so a 32-pixel centre crop decodes MCU rows 11..13 only
HEIGHT, WIDTH, CROP, RECORDS = 400, 48, 32, 4


def _rows_store(path: str) -> str:
    rng = np.random.default_rng(37)
    with StoreWriter(path, ["a"], size=0) as w:
        for _ in range(RECORDS):
            w.add(noise(rng, HEIGHT, WIDTH), 0)
    return path


def _forge_row_starts(path: str) -> None:
    """Point rows 1..16 of every record at the markers eight rows further on (the same RSTn
    numbers, in increasing order: a window inside them decodes without an error), the index's
    checksum and the metadata's seal recomputed."""
    env = lmdb.open(path, subdir=False, lock=False, map_size=os.path.getsize(path) + (16 << 20))
    try:
        with env.begin(write=True) as txn:
            meta = json.loads(bytes(txn.get(b"__meta__")))
            offsets = np.frombuffer(txn.get(b"__array__/row_offsets"), "<i8")
            starts = np.frombuffer(txn.get(b"__array__/row_starts"), "<u4").copy()
            for a in offsets[:-1].tolist():
                starts[a + 1:a + 17] = starts[a + 9:a + 25].copy()
            txn.put(b"__array__/row_starts", starts.tobytes())
            meta["arrays"]["row_starts"]["crc32"] = array_crc32(starts)
            txn.put(b"__meta__", json.dumps(seal(meta)).encode())
    finally:
        env.close()


def test_a_forged_row_index_is_found_by_verify_and_by_verified_reads(tmp_path):
    path = _rows_store(str(tmp_path / "rows.lmdb"))
    assert shardkit.verify(path).ok
    whole = ShardDataset(path, output="numpy")
    top, left = (HEIGHT - CROP) // 2, (WIDTH - CROP) // 2
    expect = [whole[i][0][top:top + CROP, left:left + CROP].copy() for i in range(RECORDS)]
    whole.close()
    _forge_row_starts(path)

    # What the forgery does to a plain read: other rows of the image, no error.
    plain = ShardDataset(path, crop=CROP, output="numpy")
    assert all(not np.array_equal(plain[i][0], expect[i]) for i in range(RECORDS))
    plain.close()

    report = shardkit.verify(path)
    assert len(report.faults) == RECORDS and report.records == RECORDS
    for i, msg in enumerate(report.faults):
        assert f"record {i}: row index does not match the record's restart markers" in msg
    checked = ShardDataset(path, crop=CROP, verify=True)
    with pytest.raises(StoreError, match="shard 0 .*, record 2: row index does not match"):
        checked[2]
    with pytest.raises(StoreError, match="row index does not match"):
        checked.__getitems__([0, 1])
    checked.close()


def test_a_forged_row_marker_count_is_a_verify_fault(tmp_path):
    path = _rows_store(str(tmp_path / "rows.lmdb"))
    rewrite_metadata(path, lambda m: m.update(row_markers=RECORDS - 1))
    assert shardkit.info(path)["row_markers"] == RECORDS - 1  # the store opens
    (msg,) = shardkit.verify(path).faults
    assert f"counts {RECORDS - 1} records with row markers, its row index {RECORDS}" in msg


@pytest.fixture(scope="module")
def buckets_store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("forged-buckets")
    return bucketed_store(str(base / "src"), str(base / "b"), num_shards=2)


def _copy(store: str, folder: str) -> str:
    import shutil

    shutil.copytree(store, folder)
    return folder


def _edit_manifest(folder: str, edit) -> None:
    with open(os.path.join(folder, MANIFEST_NAME)) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(os.path.join(folder, MANIFEST_NAME), "w") as f:
        json.dump(seal(manifest), f)


def test_forged_bucket_metadata_is_a_verify_fault(buckets_store, tmp_path):
    assert shardkit.verify(buckets_store).ok
    with open(os.path.join(buckets_store, MANIFEST_NAME)) as f:
        sizes = json.load(f)["buckets"]["sizes"]
    assert sizes[0] == [24, 64]

    # The manifest names a bucket no record has (sorted, within the area: it opens).
    renamed = _copy(buckets_store, str(tmp_path / "renamed"))
    _edit_manifest(renamed, lambda m: m["buckets"]["sizes"][0].__setitem__(1, 56))
    ds = ShardDataset(renamed)
    with pytest.raises(StoreError, match="24x64, which is no bucket"):
        BucketSampler(ds, 4, num_replicas=1, rank=0)
    ds.close()
    (msg,) = shardkit.verify(renamed).faults
    assert "the manifest's buckets differ from the records' sizes: bucket 24x56 holds 0 " \
           "records, the metadata says 11" in msg

    # Counts moved between two buckets (the sum kept).
    moved = _copy(buckets_store, str(tmp_path / "moved"))

    def move(m):
        m["buckets"]["counts"][0] += 1
        m["buckets"]["counts"][1] -= 1

    _edit_manifest(moved, move)
    (msg,) = shardkit.verify(moved).faults
    assert "bucket 24x64 holds 11 records, the metadata says 12" in msg

    # One shard's own metadata, the shard's checksum in the manifest recomputed.
    shard_forged = _copy(buckets_store, str(tmp_path / "shard"))
    shard_file = os.path.join(shard_forged, "shard-00001.lmdb")
    rewrite_metadata(shard_file, lambda m: m["buckets"].update(counts=m["buckets"]["counts"][::-1]))
    _edit_manifest(shard_forged, lambda m: m["shards"][1].update(
        sha256=sha256_file(shard_file), bytes=os.path.getsize(shard_file)))
    (msg,) = shardkit.verify(shard_forged).faults
    assert msg.startswith("shard 1 (") and "its metadata's buckets differ from its records' " \
        "sizes: bucket 24x64 holds 6 records, the metadata says 9" in msg
