"""shardkit.fileutil: the one copy of each file helper, on real files, FIFOs and stores."""

from __future__ import annotations

import json
import os

import pytest
from helpers import image_tree

import shardkit
from shardkit import fileutil, metadata
from shardkit.read.store import disk_bytes
from shardkit.errors import PackError, StoreError


def manifest_files(folder: str) -> list[str]:
    with open(os.path.join(folder, "manifest.json")) as f:
        m = json.load(f)
    layout = [m["layout"]["file"]] if "layout" in m else []  # the mixed record layout
    return ["manifest.json", m["labels"]["file"], *layout, *(e["file"] for e in m["shards"])]


def test_bytes_on_disk_counts_the_store_not_files_kept_for_old_readers(tmp_path):
    """After ``pack --overwrite`` under a reader, the old shards stay beside the new ones until
    that reader closes; ``info`` reports the store's own files, as it does for a fresh pack."""
    src_a, src_b = str(tmp_path / "a"), str(tmp_path / "b")
    image_tree(src_a, classes=2, per_class=6, seed=1)
    image_tree(src_b, classes=2, per_class=10, seed=2)
    out = str(tmp_path / "store")
    shardkit.pack(src_a, out, num_shards=2, workers=1, progress=False)
    old = shardkit.ShardDataset(out)
    old[0]  # holds the old manifest: its shards must stay
    try:
        shardkit.pack(src_b, out, num_shards=3, workers=1, progress=False, overwrite=True)
        present = set(os.listdir(out))
        ours = manifest_files(out)
        assert set(ours) < present  # leftovers are really there
        expected = sum(os.path.getsize(os.path.join(out, n)) for n in ours)
        assert disk_bytes(out) == expected
        assert shardkit.info(out)["bytes_on_disk"] == expected
        # The new store reads whole, its record layout included (an overwrite under a reader
        # left the old layout.npy in place of the new one: every read failed its checksum).
        new, fresh = shardkit.ShardDataset(out, output="bytes"), str(tmp_path / "fresh")
        shardkit.pack(src_b, fresh, num_shards=3, workers=1, progress=False)
        want = shardkit.ShardDataset(fresh, output="bytes")
        assert [new[i] for i in range(len(new))] == [want[i] for i in range(len(want))]
        assert len(old) == 12 and old[len(old) - 1] is not None  # the old reader still reads
    finally:
        old.close()


def test_disk_bytes_of_a_single_file_store(tmp_path):
    src = str(tmp_path / "src")
    image_tree(src, classes=2, per_class=3, seed=3)
    out = str(tmp_path / "one.store")
    shardkit.pack(src, out, workers=1, progress=False)
    assert disk_bytes(out) == os.path.getsize(out) == shardkit.info(out)["bytes_on_disk"]


def test_fifos_are_refused_before_any_read(tmp_path):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)  # reading it would block forever: every helper must refuse it first
    with pytest.raises(fileutil.NotRegularFile, match="not a regular file"):
        fileutil.open_regular(fifo)
    for call in (fileutil.file_size, fileutil.sha256_file):
        with pytest.raises(StoreError, match="not a regular file"):
            call(fifo)
    assert not fileutil.has_size(fifo, None) and not fileutil.has_size(fifo, 0)
    with pytest.raises(StoreError, match="not found"):
        fileutil.file_size(str(tmp_path / "missing"))


def test_replace_atomic_replaces_whole_and_leaves_nothing_behind(tmp_path):
    path = str(tmp_path / "plan.json")
    fileutil.replace_atomic(path, metadata.dumps({"b": 1, "a": [1, 2]}))
    fileutil.replace_atomic(path, metadata.dumps({"z": "é", "a": 2}))
    with open(path, "rb") as f:
        assert f.read() == b'{"a": 2, "z": "\\u00e9"}'  # canonical: sorted keys, ASCII
    assert os.listdir(tmp_path) == ["plan.json"]


def test_read_bounded_names_the_file_and_the_bound(tmp_path):
    path = str(tmp_path / "meta.jsonl")
    with open(path, "wb") as f:
        f.write(b"x" * 11)
    assert fileutil.read_bounded(path, 11, "metadata") == b"x" * 11
    with pytest.raises(PackError) as info:
        fileutil.read_bounded(path, 10, "metadata")
    assert str(info.value) == f"{path}: metadata file of 11 bytes is larger than the 10-byte limit"
    with pytest.raises(StoreError, match=r"^store file not found: .*missing$"):
        fileutil.read_bounded(str(tmp_path / "missing"), 10, "store", error=StoreError)


def test_metadata_and_coco_readers_keep_their_messages(tmp_path):
    """Both packing readers share ``read_bounded``; each still names its own kind of file."""
    src = str(tmp_path / "src")
    image_tree(src, classes=2, per_class=2, seed=4)
    folder, missing = str(tmp_path), str(tmp_path / "gone.json")
    cases = [({"metadata_file": missing}, f"metadata file not found: {missing}"),
             ({"metadata_file": folder}, f"{folder}: the metadata must be a file, not a folder"),
             ({"coco": missing}, f"COCO file not found: {missing}"),
             ({"coco": folder},
              f"{folder}: the COCO annotations must be a JSON file, not a folder")]
    for n, (option, message) in enumerate(cases):
        with pytest.raises(PackError) as info:
            shardkit.pack(src, str(tmp_path / f"out{n}.lmdb"), workers=1, progress=False,
                          **option)
        assert str(info.value) == message
