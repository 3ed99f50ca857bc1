"""Many readers at once, and stores replaced while they are read.

* 8 processes, each with a DataLoader of 4 workers, read the same LMDB store and the same HDF5
  store for several epochs, at the same time: no error (no reader-slot exhaustion: LMDB is opened
  without a lock table), every index read once per epoch, and the same bytes for the same index
  in every process and epoch.
* ``pack --overwrite`` onto a store that is being read: new opens see the new store; a dataset
  that has opened the store keeps reading the old contents (single file: the file it opened;
  folder: the old shard files stay until no reader holds the old manifest), never a mix of old
  and new -- checked with a reader process that reopens and reads the store in a loop while it
  is replaced again and again, and with lazily opened shards and DataLoader workers started after
  the replacement. A dataset holds only metadata until its first use: replaced before that, it
  refuses to read (StoreError "... was replaced ...").
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import time

import pytest
from helpers import image_tree, program_cmd, program_env

import shardkit
from shardkit import ShardDataset
from shardkit.errors import StoreError
from shardkit.formats import FORMATS

PROCESSES, WORKERS, EPOCHS = 8, 4, 3


def _digests(path: str) -> dict[int, list]:
    ds = ShardDataset(path, output="bytes")
    try:
        return {i: [hashlib.sha256(ds[i][0]).hexdigest(), int(ds[i][1])] for i in range(len(ds))}
    finally:
        ds.close()


@pytest.mark.slow
def test_many_processes_and_workers_read_the_same_stores(tmp_path):
    src = str(tmp_path / "src")
    image_tree(src, classes=4, per_class=40, seed=1, pngs=40)
    stores = []
    for fmt, shards in zip(FORMATS, itertools.cycle([None, 2])):
        out = str(tmp_path / f"store-{fmt}")
        shardkit.pack(src, out, format=fmt, size=0, workers=1, num_shards=shards,
                      progress=False)
        stores.append(out)
    expected = {p: _digests(p) for p in stores}
    procs = []
    t0 = time.monotonic()
    for k in range(PROCESSES):
        out = str(tmp_path / f"result{k}.json")
        procs.append((out, subprocess.Popen(
            [*program_cmd("epochs_reader"), json.dumps(stores), str(EPOCHS), str(k), out],
            env=program_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    failures = []
    for out, proc in procs:
        try:
            _, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            failures.append(f"{out}: reader hung")
            continue
        if proc.returncode != 0:
            failures.append(f"{out}: exit {proc.returncode}: {err[-2000:]}")
            continue
        with open(out) as f:
            result = json.load(f)
        failures += result["problems"]
        for p in stores:
            got = {int(i): v for i, v in result["seen"][p].items()}
            if got != expected[p]:
                bad = [i for i in expected[p] if got.get(i) != expected[p][i]]
                failures.append(f"{out}: {p}: indices {bad[:10]} differ from the store")
    print(f"{PROCESSES} processes x {WORKERS} workers x {EPOCHS} epochs over "
          f"{[len(expected[p]) for p in stores]} records in {time.monotonic() - t0:.1f} s")
    assert not failures, "\n".join(failures)


# -- replacing a store that is being read --------------------------------------------------------

@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Two packs of one source that differ in every record (A: size 24, B: size 16)."""
    base = tmp_path_factory.mktemp("versions")
    src = str(base / "src")
    image_tree(src, classes=4, per_class=8, seed=2, pngs=8)
    return {"src": src, "A": {"size": 24}, "B": {"size": 16}}


def _pack(versions, version: str, out: str, fmt: str, shards, overwrite=True) -> None:
    shardkit.pack(versions["src"], out, format=fmt, workers=1, num_shards=shards,
                  overwrite=overwrite, progress=False, **versions[version])


def _reference(versions, tmp_path, fmt, shards) -> dict[str, dict]:
    refs = {}
    for v in ("A", "B"):
        path = str(tmp_path / f"ref-{v}")
        _pack(versions, v, path, fmt, shards)
        refs[v] = _digests(path)
    assert all(refs["A"][i][0] != refs["B"][i][0] for i in refs["A"])
    return refs


def _store_files(out: str) -> set[str]:
    return set(os.listdir(out)) if os.path.isdir(out) else {os.path.basename(out)}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shards", [None, 3], ids=["file", "folder"])
def test_overwrite_never_changes_an_open_dataset(versions, tmp_path, fmt, shards):
    from torch.utils.data import DataLoader

    refs = _reference(versions, tmp_path, fmt, shards)
    out = str(tmp_path / "out")
    _pack(versions, "A", out, fmt, shards, overwrite=False)
    old = ShardDataset(out, output="bytes")
    assert hashlib.sha256(old[0][0]).hexdigest() == refs["A"][0][0]  # shard 0 opened only

    _pack(versions, "B", out, fmt, shards)  # replaces OUT while `old` is open
    new = ShardDataset(out, output="bytes")
    assert _digests(out) == refs["B"]
    for i in reversed(range(len(old))):  # lazily opens the other shards now: still A's
        assert [hashlib.sha256(old[i][0]).hexdigest(), int(old[i][1])] == refs["A"][i], i
    # DataLoader workers started after the replacement (fork) read the dataset's own store.
    loader = DataLoader(old, batch_size=8, num_workers=2, multiprocessing_context="fork",
                        worker_init_fn=shardkit.worker_init_fn, collate_fn=lambda b: b)
    got = [hashlib.sha256(data).hexdigest() for batch in loader for data, _ in batch]
    assert got == [refs["A"][i][0] for i in range(len(old))]
    # Started by spawn they inherit nothing from the parent: a clear error, never B's records.
    spawn = DataLoader(old, batch_size=8, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(StoreError, match="was replaced"):
        next(iter(spawn))
    assert [hashlib.sha256(new[i][0]).hexdigest() for i in range(len(new))] == \
        [refs["B"][i][0] for i in range(len(new))]

    if shards:
        # Old shard files stay while `old` holds the old manifest, and go once it is released.
        assert len(_store_files(out)) > 2 + 3 + 1
        old.close()
        del old, loader
        import gc

        gc.collect()
        new.close()
        del new
        gc.collect()
        _pack(versions, "A", out, fmt, shards)  # the next install collects the garbage
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        live = {e["file"] for e in manifest["shards"]} | {manifest["labels"]["file"],
                                                          "manifest.json"}
        assert _store_files(out) == live
        assert _digests(out) == refs["A"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no partial, no .old


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shards", [None, 3], ids=["file", "folder"])
def test_store_replaced_before_first_use_is_refused(versions, tmp_path, fmt, shards):
    """Creating a dataset reads metadata and holds nothing; a store replaced before the first read
    is refused (the metadata is the old store's), in the process and in forked workers alike."""
    from torch.utils.data import DataLoader

    out = str(tmp_path / "out")
    _pack(versions, "A", out, fmt, shards, overwrite=False)
    before = _digests(out)
    ds = ShardDataset(out, output="bytes")
    _pack(versions, "B", out, fmt, shards)
    loader = DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context="fork",
                        worker_init_fn=shardkit.worker_init_fn, collate_fn=lambda b: b)
    with pytest.raises(StoreError, match="was replaced"):
        next(iter(loader))
    with pytest.raises(StoreError, match=f"^{out} was replaced"):
        ds[0]
    if shards:
        with pytest.raises(StoreError, match="was replaced"):
            ds.targets  # labels.npy is read under the manifest's lock, so refused too
    after = _digests(out)  # a new dataset reads the new store
    assert sorted(after) == sorted(before) and all(after[i][0] != before[i][0] for i in after)


@pytest.mark.parametrize("fmt,shards", list(zip(FORMATS, itertools.cycle([None, 3]))))
def test_reader_never_sees_a_mix_while_the_store_is_replaced(versions, tmp_path, fmt, shards):
    refs = _reference(versions, tmp_path, fmt, shards)
    hashes = {v: [refs[v][i][0] for i in range(len(refs[v]))] for v in refs}
    out = str(tmp_path / "out")
    _pack(versions, "A", out, fmt, shards, overwrite=False)
    stop = str(tmp_path / "stop")
    reader = subprocess.Popen([*program_cmd("loop_reader"), out, json.dumps(hashes), stop],
                              env=program_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(stop + ".ready") and reader.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        for k in range(6):
            _pack(versions, "B" if k % 2 == 0 else "A", out, fmt, shards)
            time.sleep(0.15)
    finally:
        open(stop, "w").close()
    stdout, stderr = reader.communicate(timeout=120)
    assert reader.returncode == 0, stderr
    counts = json.loads(stdout.splitlines()[-1])
    print(f"{fmt} {'folder' if shards else 'file'}: complete reads {counts}")
    assert counts["mixed"] == 0 and not counts["errors"], counts
    assert counts["A"] >= 1 and counts["A"] + counts["B"] >= 4
    if shards:  # the reader is gone: no old generation is left behind after the next install
        _pack(versions, "A", out, fmt, shards)
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        live = {e["file"] for e in manifest["shards"]} | {manifest["labels"]["file"],
                                                          "manifest.json"}
        assert _store_files(out) == live
    shutil.rmtree(out) if os.path.isdir(out) else os.unlink(out)
