"""A dropped ``ds.loader`` frees its persistent workers at once, by reference count, as a plain
DataLoader does: no reference cycle keeps it (and its workers, open shards and batch memory)
alive until a cyclic garbage collection."""

from __future__ import annotations

import gc
import time
import weakref

import shardkit

from helpers import build_store_fast


def test_dropped_loader_frees_its_workers_without_gc(tmp_path):
    path = str(tmp_path / "store.lmdb")
    build_store_fast(path, 24, side=8)
    ds = shardkit.ShardDataset(path, crop=8)
    workers = []
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        # A loop that makes a validation loader per epoch: each is dropped after its pass.
        for _ in range(3):
            loader = ds.loader(batch_size=8, num_workers=2, multiprocessing_context="fork")
            assert sum(len(labels) for _, labels in loader) == 24
            procs = list(loader._iterator._workers)  # persistent: still running after the pass
            assert len(procs) == 2 and all(p.is_alive() for p in procs)
            workers += procs
            ref = weakref.ref(loader)
            del loader
            assert ref() is None  # freed by its reference count: nothing points back at it
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a timing claim
        while any(p.is_alive() for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p.pid for p in workers if p.is_alive()] == []
    finally:
        if was_enabled:
            gc.enable()
