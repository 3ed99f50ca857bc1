"""Many readers at once, and stores replaced while they are read.

* 8 processes, each with a DataLoader of 4 workers, read the same LMDB store and the same HDF5
  store for several epochs, at the same time: no error (no reader-slot exhaustion: LMDB is opened
  without a lock table), every index read once per epoch, and the same bytes for the same index
  in every process and epoch.
* ``pack --overwrite`` onto a store that is being read: new opens see the new store; a dataset
  that has opened the store keeps reading the old contents (single file: the file it opened;
  folder: the old shard files stay until no reader holds the old manifest), never a mix of old
  and new -- checked with a reader process that opens and reads the store again and again while
  it is replaced six times, with lazily opened shards and DataLoader workers started after
  the replacement, and with readers of two generations across two overwrites. The reader in
  another process is stepped over a pipe, so each replacement lands at a known point of its
  reads (no sleeps). A dataset holds only metadata until its first use: replaced before that, it
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
    """Packs of one source that differ in every record (A: size 24, B: size 16, C: 20)."""
    base = tmp_path_factory.mktemp("versions")
    src = str(base / "src")
    image_tree(src, classes=4, per_class=8, seed=2, pngs=8)
    return {"src": src, "A": {"size": 24}, "B": {"size": 16}, "C": {"size": 20}}


def _pack(versions, version: str, out: str, fmt: str, shards, overwrite=True) -> None:
    shardkit.pack(versions["src"], out, format=fmt, workers=1, num_shards=shards,
                  overwrite=overwrite, progress=False, **versions[version])


def _reference(versions, tmp_path, fmt, shards, names=("A", "B")) -> dict[str, dict]:
    refs = {}
    for v in names:
        path = str(tmp_path / f"ref-{v}")
        _pack(versions, v, path, fmt, shards)
        refs[v] = _digests(path)
    for v, w in itertools.combinations(names, 2):  # every record differs between versions
        assert all(refs[v][i][0] != refs[w][i][0] for i in refs[v])
    return refs


def _first_batch_refused(loader) -> str:
    """The StoreError message the loader's first batch raises. Its traceback is dropped: it holds
    the iterator in a reference cycle, whose collection later stops the workers only after
    torch's 5 s status-check timeout; released here, they stop at once."""
    it = iter(loader)
    try:
        next(it)
    except StoreError as exc:
        exc.__traceback__ = None
        return str(exc)
    finally:
        del it
    raise AssertionError("the first batch was read, not refused")


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
    assert "was replaced" in _first_batch_refused(spawn)
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
        assert _store_files(out) == _live_files(out)
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
    assert "was replaced" in _first_batch_refused(loader)
    with pytest.raises(StoreError, match=f"^{out} was replaced"):
        ds[0]
    if shards:
        with pytest.raises(StoreError, match="was replaced"):
            ds.targets  # labels.npy is read under the manifest's lock, so refused too
    after = _digests(out)  # a new dataset reads the new store
    assert sorted(after) == sorted(before) and all(after[i][0] != before[i][0] for i in after)


class _SteppedReader:
    """``helpers.programs.stepped_reader`` on ``path``: each call sends one command and returns
    its answer, sent once the step is done (so the test knows where the reader stands)."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([*program_cmd("stepped_reader"), path], env=program_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def __call__(self, *command) -> dict:
        self.proc.stdin.write(" ".join(map(str, command)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise AssertionError(f"reader exited ({self.proc.returncode}) at {command}: "
                                 f"{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def records(self, start: int, stop: int) -> list[list]:
        got = self(f"read {start} {stop}")
        assert "error" not in got, got
        return [[h, label] for h, label in zip(got["sha256"], got["labels"])]

    def finish(self) -> None:
        assert self("exit") == {"ok": True}
        _, stderr = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, stderr


@pytest.mark.parametrize("fmt,shards", list(zip(FORMATS, itertools.cycle([None, 3]))))
def test_reader_never_sees_a_mix_while_the_store_is_replaced(versions, tmp_path, fmt, shards):
    """A reader in another process, stepped over a pipe, while OUT is replaced six times: each
    replacement lands at a known point of its reads. Replaced after the reader opened the store
    and read half of it: the other half (other shards, opened lazily) is still the old version.
    Replaced between creating a dataset and its first use: refused as replaced. Then a new
    dataset reads the new version, whole."""
    refs = _reference(versions, tmp_path, fmt, shards)
    out = str(tmp_path / "out")
    _pack(versions, "A", out, fmt, shards, overwrite=False)
    n = len(refs["A"])
    half = n // 2
    expect = {v: [refs[v][i] for i in range(n)] for v in refs}
    reader = _SteppedReader(out)
    current = "A"
    for _ in range(3):
        new = "B" if current == "A" else "A"
        assert reader("create") == {"ok": True, "len": n}
        assert reader("open") == {"ok": True}
        assert reader.records(0, half) == expect[current][:half]
        _pack(versions, new, out, fmt, shards)  # the reader holds the store, half read
        assert reader.records(half, n) == expect[current][half:]
        assert reader("create") == {"ok": True, "len": n}  # closes the old dataset
        assert reader("open") == {"ok": True}
        assert reader.records(0, n) == expect[new]
        current = "B" if new == "A" else "A"
        assert reader("create") == {"ok": True, "len": n}
        _pack(versions, current, out, fmt, shards)  # created, not yet used
        refused = reader("open")
        assert "was replaced" in refused.get("refused", ""), refused
        assert reader("create") == {"ok": True, "len": n}
        assert reader("open") == {"ok": True}
        assert reader.records(0, n) == expect[current]
    assert reader("close") == {"ok": True}
    reader.finish()
    if shards:  # the reader is gone: no old generation is left behind after the next install
        _pack(versions, "A", out, fmt, shards)
        assert _store_files(out) == _live_files(out)
    shutil.rmtree(out) if os.path.isdir(out) else os.unlink(out)


def _live_files(out: str) -> set[str]:
    """The files the folder store's current manifest names (its shards, and each side file
    such as ``labels``), and the manifest."""
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    sides = {v["file"] for v in manifest.values() if isinstance(v, dict) and "file" in v}
    return {e["file"] for e in manifest["shards"]} | sides | {"manifest.json"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_readers_across_two_overwrites_of_a_folder_store(versions, tmp_path, fmt):
    """Readers of two generations at once: one opened A, one opened B after the first overwrite;
    the second overwrite (C) must keep both generations' files (each reader holds its own
    retired manifest), and both read their whole store afterwards, in the process and in
    DataLoader workers forked then. Once both are closed, the next install leaves only C."""
    from torch.utils.data import DataLoader

    refs = _reference(versions, tmp_path, fmt, 3, ("A", "B", "C"))
    out = str(tmp_path / "out")
    _pack(versions, "A", out, fmt, 3, overwrite=False)
    ds_a = ShardDataset(out, output="bytes")
    assert _record(ds_a, 0) == refs["A"][0]  # pins A's manifest; shard 0 open, the others not
    _pack(versions, "B", out, fmt, 3)  # first overwrite
    ds_b = ShardDataset(out, output="bytes")
    assert _record(ds_b, 0) == refs["B"][0]
    _pack(versions, "C", out, fmt, 3)  # second overwrite: A's and B's files are both in use
    assert _digests(out) == refs["C"]
    n = len(refs["A"])
    for ds, v in ((ds_a, "A"), (ds_b, "B")):
        assert [_record(ds, i) for i in reversed(range(n))] == \
            [refs[v][i] for i in reversed(range(n))], v
        loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork",
                            worker_init_fn=shardkit.worker_init_fn, collate_fn=lambda b: b)
        got = [hashlib.sha256(data).hexdigest() for batch in loader for data, _ in batch]
        assert got == [refs[v][i][0] for i in range(n)], v
        del loader
    ds_a.close()
    ds_b.close()
    del ds_a, ds_b
    import gc

    gc.collect()
    _pack(versions, "C", out, fmt, 3)  # no reader left: the old generations go
    assert _store_files(out) == _live_files(out)
    assert _digests(out) == refs["C"]


def _record(ds: ShardDataset, i: int) -> list:
    data, label = ds[i]
    return [hashlib.sha256(data).hexdigest(), int(label)]
