"""Multi-shard stores: packing (--num-shards / --shard-size, both formats), the manifest, reading a
folder exactly like a single file, lazy per-shard opening, info/verify, and --file-list."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import shardkit
from shardkit.cli import main as cli_main
from shardkit.errors import StoreError
from shardkit.read.inspect import info, verify
from shardkit.read.store import Store

from helpers import flip_byte_in_file, image_tree, jpeg_bytes, random_photo, write_bytes

from helpers.scaleout import manifest, partial_of, sha256, store_files

FORMATS = ["lmdb", "hdf5"]
SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5"}
N = 42  # 3 classes x 14 images


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("src"))
    image_tree(root, classes=3, per_class=14, seed=1, pngs=1)
    return root


def _pack(src: str, out: str, *args: str) -> None:
    assert cli_main(["pack", src, out, "--size", "32", "-q", *args]) == 0


@pytest.fixture(scope="module")
def packed(src, tmp_path_factory):
    """fmt -> (4-shard folder store, single-file store) of the same source. The folder keeps the
    source order in its shards (``--order source``): these tests look at what each shard holds
    (the default mixed layout is tests/read/test_layout.py's)."""
    base = tmp_path_factory.mktemp("packed")
    stores = {}
    for fmt in FORMATS:
        folder, single = str(base / f"{fmt}-4"), str(base / f"single{SUFFIX[fmt]}")
        _pack(src, folder, "--num-shards", "4", "--format", fmt, "--workers", "2", "--order",
              "source")
        _pack(src, single, "--workers", "2")
        stores[fmt] = folder, single
    return stores


def _open_paths() -> str:
    """Every file this process has open or memory-mapped (fds and maps), one per line."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    with open("/proc/self/maps") as f:
        names += [line.split(None, 5)[-1].strip() for line in f if "/" in line]
    return "\n".join(names)


@pytest.mark.parametrize("fmt", FORMATS)
def test_num_shards_layout_and_manifest(packed, src, fmt):
    folder, _ = packed[fmt]
    assert not os.path.exists(partial_of(folder))
    m = manifest(folder)
    files = [f"shard-{k:05d}{SUFFIX[fmt]}" for k in range(4)]
    # Only the shards, the labels and the manifest: no plan, progress entries or temp files left.
    assert sorted(os.listdir(folder)) == sorted(files + ["labels.npy", "manifest.json"])
    assert m["format"] == "shardkit" and m["kind"] == "sharded" and m["format_version"] == 1
    assert m["count"] == N and m["classes"] == ["c0", "c1", "c2"] and m["skipped"] == []
    assert m["settings"]["size"] == 32 and m["settings"]["format"] == fmt
    assert m["source_root"] == os.path.abspath(src)
    counts = [round((k + 1) * N / 4) - round(k * N / 4) for k in range(4)]
    starts = list(np.cumsum([0] + counts[:-1]))
    for k, entry in enumerate(m["shards"]):
        path = os.path.join(folder, entry["file"])
        assert entry["file"] == files[k] and entry["format"] == fmt
        assert (entry["count"], entry["start"]) == (counts[k], starts[k])
        assert entry["bytes"] == os.path.getsize(path)
        assert entry["sha256"] == sha256(path)
    assert m["labels"]["sha256"] == sha256(os.path.join(folder, "labels.npy"))
    labels = np.load(os.path.join(folder, "labels.npy"))
    assert labels.dtype == np.int64 and labels.tolist() == [c for c in range(3) for _ in range(14)]
    # info understands the folder.
    summary = info(folder)
    assert (summary["kind"], summary["shards"], summary["count"], summary["format"]) == \
        ("sharded", 4, N, fmt)
    assert summary["bytes_on_disk"] == sum(os.path.getsize(os.path.join(folder, f))
                                           for f in os.listdir(folder))


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_records_as_single_file(packed, fmt):
    folder, single = packed[fmt]
    a = shardkit.ShardDataset(folder, output="bytes")
    b = shardkit.ShardDataset(single, output="bytes")
    assert len(a) == len(b) == N and len(a.store.shards) == 4 and len(b.store.shards) == 1
    assert (a.classes, a.class_to_idx) == (b.classes, b.class_to_idx)
    assert np.array_equal(a.targets, b.targets)
    for i in range(N):
        assert a[i] == b[i]
        assert a.source_path(i) == b.source_path(i)
    # Batches that cross shard boundaries, decoded and cropped, equal the single file's too.
    order = [41, 0, 10, 11, 12, 21, 22, 30, 31, 32, 5]
    ta, tb = (shardkit.ShardDataset(p, crop=24) for p in (folder, single))
    ia, la = shardkit.collate(ta.__getitems__(order))
    ib, lb = shardkit.collate(tb.__getitems__(order))
    assert torch.equal(ia, ib) and torch.equal(la, lb)
    assert la.tolist() == [int(a.targets[i]) for i in order]
    assert torch.equal(ta[33][0], tb[33][0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_targets_without_opening_and_shards_open_lazily(packed, fmt, tmp_path):
    folder = str(tmp_path / "copy")  # a path no earlier test has opened in this process
    shutil.copytree(packed[fmt][0], folder)
    ds = shardkit.ShardDataset(folder)
    shard_files = [os.path.join(os.path.realpath(folder), e["file"])
                   for e in manifest(folder)["shards"]]
    assert ds.targets.tolist() == [c for c in range(3) for _ in range(14)]
    assert ds.store.open_shards == []
    assert not any(p in _open_paths() for p in shard_files)
    ds.open()  # what worker_init_fn does: a multi-shard store stays lazy
    assert ds.store.open_shards == []
    k2 = int(ds.store.starts[2])
    ds[k2 + 1]
    assert ds.store.open_shards == [2]
    opened = _open_paths()
    assert shard_files[2] in opened
    assert not any(p in opened for k, p in enumerate(shard_files) if k != 2)
    ds.close()


class _OpenedShards(Dataset):
    """Reads a record, then reports which shards this process has open."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        self.dataset[i]
        return os.getpid(), sorted(self.dataset.store.open_shards)


def test_workers_open_only_the_shards_they_read(packed):
    folder, _ = packed["lmdb"]
    ds = shardkit.ShardDataset(folder)
    starts = ds.store.starts
    shard1 = list(range(int(starts[1]), int(starts[2])))
    loader = DataLoader(_OpenedShards(ds), batch_size=None, sampler=shard1, num_workers=2,
                        worker_init_fn=shardkit.worker_init_fn)
    seen = list(loader)
    assert len({pid for pid, _ in seen}) == 2  # both workers read
    assert all(opened == [1] for _, opened in seen)
    assert ds.store.open_shards == []  # the parent opened nothing


def test_verify_folder_and_changed_shard_bytes(src, tmp_path):
    out = str(tmp_path / "store")
    _pack(src, out, "--num-shards", "3", "--format", "hdf5", "--workers", "1")
    report = verify(out)
    assert report.ok and report.records == N
    assert cli_main(["verify", out, "-q"]) == 0
    shard = os.path.join(out, manifest(out)["shards"][1]["file"])
    size = os.path.getsize(shard)
    with open(shard, "r+b") as f:  # change one byte of record data; the size stays the same
        data = bytearray(f.read())
        pos = data.index(b"\xff\xd8\xff") + 40  # inside the first JPEG record
        data[pos] ^= 0x55
        f.seek(0)
        f.write(data)
    assert os.path.getsize(shard) == size
    report = verify(out)
    assert not report.ok
    assert len(report.faults) == 1 and "shard 1" in report.faults[0] \
        and "checksum" in report.faults[0]
    assert cli_main(["verify", out, "-q"]) == 1


def test_verify_rejects_a_missing_shard(src, tmp_path):
    out = str(tmp_path / "store")
    _pack(src, out, "--num-shards", "3", "--workers", "1")
    os.unlink(os.path.join(out, "shard-00002.lmdb"))
    report = verify(out)
    assert not report.ok and any("shard-00002.lmdb" in f for f in report.faults)
    with pytest.raises(StoreError):
        shardkit.ShardDataset(out)[N - 1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_locate_many_finds_each_record(packed, fmt):
    """``Store.locate_many`` maps a batch of global indices (negative ones too, repeats, across
    shard boundaries) to shard and place: the record there is the single-file store's record."""
    folder, single = packed[fmt]
    store, whole = Store(folder), shardkit.ShardDataset(single, output="bytes")
    indices = [41, 0, -1, 13, -42, 20, 20, 31, 11, 10]
    shards, local = store.locate_many(indices)
    assert len(set(shards.tolist())) == 4
    for i, k, j in zip(indices, shards.tolist(), local.tolist()):
        assert store.locate(i) == (k, j)
        shard = store.shard(k)
        with shard.reader.records() as get:
            assert bytes(get(j)) == whole[i][0]
    assert [len(a) for a in store.locate_many([])] == [0, 0]
    for bad in (N, -N - 1):
        with pytest.raises(IndexError, match=f"^index {bad} out of range for a store of {N} "):
            store.locate_many([3, bad, 0])
    store.close()


def test_every_read_path_and_verify_name_a_damaged_record_alike(packed, tmp_path):
    """One record's bytes damaged: ``verify``, an item, a cropped batch and raw bytes all report
    it with the same message, naming store, shard and record."""
    store = str(tmp_path / "one.lmdb")
    shutil.copyfile(packed["lmdb"][1], store)
    record = shardkit.ShardDataset(store, output="bytes")[7][0]
    flip_byte_in_file(store, record, len(record) // 2)
    faults = verify(store).faults
    assert len(faults) == 1
    assert faults[0].startswith(f"{store}: shard 0 ({store}), record 7: checksum mismatch")
    reads = [lambda: shardkit.ShardDataset(store, verify=True)[7],
             lambda: shardkit.ShardDataset(store, verify=True, crop=16).__getitems__([6, 7]),
             lambda: shardkit.ShardDataset(store, verify=True, output="bytes")[7]]
    for read in reads:
        with pytest.raises(StoreError) as caught:
            read()
        assert str(caught.value) == faults[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_size_is_deterministic_across_workers(src, tmp_path, fmt):
    single = str(tmp_path / f"one{SUFFIX[fmt]}")
    _pack(src, single, "--workers", "1")
    record_bytes = sum(len(r) for r, _ in shardkit.ShardDataset(single, output="bytes"))
    target = record_bytes // 5  # about five shards
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _pack(src, a, "--shard-size", str(target), "--format", fmt, "--workers", "1")
    _pack(src, b, "--shard-size", f"{target / 1000}KB", "--format", fmt, "--workers", "2")
    assert store_files(a) == store_files(b)  # same bounds, same bytes, whatever the workers
    m = manifest(a)
    counts = [e["count"] for e in m["shards"]]
    assert 4 <= len(counts) <= 7 and sum(counts) == N
    assert len(set(counts[:-1])) == 1 and counts[-1] <= counts[0]  # bounds fixed by count
    ds = shardkit.ShardDataset(a, output="bytes")
    for k, entry in enumerate(m["shards"][:-1]):
        payload = sum(len(ds[i][0]) for i in range(entry["start"], entry["start"] + entry["count"]))
        assert 0.5 * target <= payload <= 1.5 * target, (k, payload, target)


def test_sharded_pack_refuses_both_size_options(src, tmp_path, capsys):
    code = cli_main(["pack", src, str(tmp_path / "x"), "--num-shards", "2", "--shard-size", "1MB"])
    assert code == 1 and "not both" in capsys.readouterr().err


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """Images in one folder (labels not from folders), plus the (relpath, class name) rows."""
    root = str(tmp_path_factory.mktemp("flat"))
    rng = np.random.default_rng(7)
    names = ["zebra", "ant", "moth"]
    rows = []
    for i in range(18):
        rel = f"val/ILSVRC_val_{i:05d}.JPEG"
        write_bytes(os.path.join(root, rel), jpeg_bytes(random_photo(rng)))
        rows.append((rel, names[(i * 7) % 3]))
    rows.reverse()  # list order, not name order, decides record order
    return root, rows


@pytest.mark.parametrize("fmt,sep,labels", [("lmdb", ",", "int"), ("hdf5", "\t", "names")])
def test_file_list(flat, tmp_path, fmt, sep, labels):
    root, rows = flat
    classes = sorted({name for _, name in rows})
    values = [str(classes.index(n)) if labels == "int" else n for _, n in rows]
    listing = tmp_path / ("val.csv" if sep == "," else "val.tsv")
    listing.write_text(f"path{sep}label\n" + "".join(f"{p}{sep}{v}\n" for (p, _), v in
                                                      zip(rows, values)))
    out = str(tmp_path / "val")
    _pack(root, out, "--file-list", str(listing), "--num-shards", "3", "--format", fmt,
          "--workers", "1")
    ds = shardkit.ShardDataset(out)
    assert len(ds) == len(rows) and len(ds.store.shards) == 3
    assert ds.classes == (["0", "1", "2"] if labels == "int" else classes)
    assert ds.targets.tolist() == [classes.index(n) for _, n in rows]
    assert [ds.source_path(i) for i in range(len(ds))] == [p for p, _ in rows]
    assert [int(ds[i][1]) for i in range(len(ds))] == ds.targets.tolist()
    assert verify(out).ok
    assert json.loads(json.dumps(info(out)))["count"] == len(rows)
