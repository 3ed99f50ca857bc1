"""A DataLoader worker's private memory stays flat over a full pass of a 100,000-record store.

``Private_Dirty`` (from /proc/PID/smaps_rollup) counts the pages a worker has written, including
the copy-on-write copies of the parent's objects it touches; pages of a memory-mapped store read
from the page cache are clean and do not count. A per-record Python index (ImageFolder's list of
tuples) grows it by tens of MB over such a pass; shardkit's numpy/mmap index must not.

What is measured is that growth: memory that grows with the records read. Each worker's
Private_Dirty is read after a warm-up tenth of the pass, at its middle and at its end; a
per-record cost grows both halves alike, while a one-off allocation (an allocator arena, a cache
resizing, a loaded machine's timing) lands in one half. So the smaller half's growth is the
figure: flat for shardkit, megabytes for the per-record Python list of the control.
"""

from __future__ import annotations

import pickle
import sys
import time

import pytest
from torch.utils.data import DataLoader

import shardkit
from helpers import build_store_fast, private_dirty_kb
from shardkit import ShardDataset

N = 100_000
HALF_KB = 1536  # allowed growth per worker over the flatter half of the pass

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """``big_store(fmt)``: a real store of N tiny records in that format, built once."""
    cache: dict[str, str] = {}

    def get(fmt: str) -> str:
        if fmt not in cache:
            name = "big.lmdb" if fmt == "lmdb" else "big.h5"
            cache[fmt] = str(tmp_path_factory.mktemp("big") / name)
            build_store_fast(cache[fmt], N, fmt, classes=10)
        return cache[fmt]

    return get


class ListIndexDataset(ShardDataset):
    """A control: the same dataset plus an ImageFolder-style per-record Python list it touches."""

    def __init__(self, path: str, **kw) -> None:
        super().__init__(path, **kw)
        self.samples = [(f"/data/train/c{i % 10}/{i:07d}.JPEG", i % 10) for i in range(len(self))]

    def __getitems__(self, indices):
        for i in indices:
            path, label = self.samples[i]  # what ImageFolder does per item
        return super().__getitems__(indices)


def _pass_growth(ds: ShardDataset) -> tuple[dict[int, tuple[int, int]], int, float]:
    """One full pass with 2 fork workers; per worker, Private_Dirty growth (kB) over the two
    halves of the pass after a warm-up tenth."""
    batch_size = 500
    batches = -(-len(ds) // batch_size)
    marks = (batches // 10, (batches // 10 + batches) // 2)  # after these many batches
    loader = DataLoader(ds, batch_size=batch_size, num_workers=2, persistent_workers=True,
                        multiprocessing_context="fork", worker_init_fn=shardkit.worker_init_fn,
                        collate_fn=shardkit.collate)
    t0 = time.perf_counter()
    it = iter(loader)
    pids: list[int] = []
    seen: list[dict[int, int]] = []
    count = label_sum = 0
    for k, (images, labels) in enumerate(it, 1):
        count += len(labels)
        label_sum += int(labels.sum())
        if k in marks:
            pids = pids or [w.pid for w in it._workers]
            seen.append({pid: private_dirty_kb(pid) for pid in pids})
    end = {pid: private_dirty_kb(pid) for pid in pids}
    growth = {pid: (seen[1][pid] - seen[0][pid], end[pid] - seen[1][pid]) for pid in pids}
    seconds = time.perf_counter() - t0
    del it, loader
    assert count == len(ds)
    assert label_sum == int(ds.targets.sum())
    return growth, count, seconds


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_store_is_real_and_complete(big_store, fmt):
    ds = ShardDataset(big_store(fmt), output="numpy")
    assert len(ds) == N
    assert ds[N - 1][0].shape == (8, 8, 3) and ds[N - 1][1] == (N - 1) % 10
    assert len(pickle.dumps(ds)) < 16_000  # pickling does not carry the index
    assert ds.targets.nbytes == 8 * N


@pytest.mark.parametrize("fmt,crop", [("lmdb", None), ("hdf5", 8)])
def test_worker_private_memory_is_flat(big_store, fmt, crop):
    """Per-item path (crop=None) and batched shared-memory path (crop), one format each."""
    ds = ShardDataset(big_store(fmt), crop=crop)
    assert len(ds.targets) == N and ds[0][0].shape == (3, 8, 8)  # used in the parent first
    growth, count, seconds = _pass_growth(ds)
    print(f"\n{fmt} crop={crop}: {count} records in {seconds:.1f} s, "
          f"Private_Dirty growth per worker over each half (kB): {sorted(growth.values())}")
    assert max(min(halves) for halves in growth.values()) < HALF_KB, growth


def test_control_python_list_index_grows(big_store):
    """The measurement can fail: a per-record Python list touched by workers shows up."""
    growth, _, _ = _pass_growth(ListIndexDataset(big_store("lmdb"), crop=8))
    print(f"\ncontrol (list index): Private_Dirty growth per worker over each half (kB): "
          f"{sorted(growth.values())}")
    assert min(min(halves) for halves in growth.values()) > 1.5 * HALF_KB, growth
