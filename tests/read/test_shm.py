"""Every ``ds.loader`` path works with a 64 MB ``/dev/shm`` (Docker's default), where a plain
DataLoader with torch's default collate fails: shardkit's worker batches live in memfd memory
(:mod:`shardkit.read.shipping`, :mod:`shardkit.read.batchpool`), which that mount does not bound.

Every case runs in a mount namespace whose /dev/shm is a fresh 64 MB tmpfs (``unshare -m``, as
root), all of them in one process per start method (fork, spawn), each reported by name. Skipped where that is not possible, except under CI (env ``CI`` set), where it fails.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from helpers import build_store_fast
from helpers.programs import shm_loader
from helpers.small_shm import namespace_or_skip, run_in_small_shm

import shardkit
from shardkit import ShardDataset
from shardkit.read import shipping
from shardkit.read.batchpool import PooledBatch


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """512 records of 256 x 256 JPEGs (64 distinct ones), in 10 classes."""
    namespace_or_skip()
    path = str(tmp_path_factory.mktemp("shm") / "s.lmdb")
    build_store_fast(path, 512, side=256, variants=64, seed=3)
    return path


CASES = ["transform", "crop", "numpy", "target", "single"]
CONTROL = "plain-transform"


@pytest.fixture(scope="module")
def small_shm_runs(store):
    """Every case, then the control last, in one process per start method (read on demand)."""
    runs = {}

    def run(context: str) -> dict[str, dict]:
        if context not in runs:
            runs[context] = run_in_small_shm(store, context, [*CASES, CONTROL])
        return runs[context]
    return run


@functools.lru_cache
def expected(store: str, case: str) -> list:
    """The same batches read in this process (no workers, no shared memory); once per case."""
    ds, batch_size = shm_loader.setup(store, case)
    return shm_loader.describe(ds.loader(batch_size=batch_size, num_workers=0))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_plain_dataloader_fails_there(small_shm_runs, context):
    """The control: with the per-sample float transform a batch is 77 MB; torch's default collate
    stacks each worker batch into /dev/shm, where it does not fit."""
    got = small_shm_runs(context)[CONTROL]
    assert "error" in got, "a plain DataLoader read the whole store in a 64 MB /dev/shm"
    assert "shared memory" in got["error"] or "shm" in got["error"], got["error"][-2000:]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_every_loader_path_works_there(store, small_shm_runs, context):
    """Each path (per-sample transform, batched crop, numpy output, target_transform,
    batch_size=None) reads the same batches as without workers; a failure names its path."""
    runs = small_shm_runs(context)
    failures = []
    for case in CASES:
        got = runs[case]
        if "error" in got:
            failures.append(f"{case}: {got['error'][-3000:]}")
            continue
        if got["batches"] != expected(store, case):
            failures.append(f"{case}: batches differ from those read without workers")
        n = len(ShardDataset(store)) if case == "single" else 512 // shm_loader.BATCH
        if len(got["batches"]) != n:
            failures.append(f"{case}: {len(got['batches'])} batches, not {n}")
    assert not failures, "\n".join(failures)


# -- where a worker's batch lives, without a mount namespace ---------------------------------------

def _tensors(data) -> list:
    if isinstance(data, dict):
        return [t for v in data.values() for t in _tensors(v)]
    if isinstance(data, (list, tuple)):
        return [t for v in data for t in _tensors(v)]
    return [data] if hasattr(data, "untyped_storage") else []


def _places(data) -> list[str]:
    """What each tensor's shared memory is (``/proc/self/fd`` link): asking torch for its
    descriptor moves a tensor that is not shared yet into /dev/shm, as sending it would."""
    return [os.readlink(f"/proc/self/fd/{t.untyped_storage()._share_fd_cpu_()[0]}")
            for t in _tensors(data)]


def collate_and_tell(batch):
    out = shardkit.collate(batch)
    if isinstance(out, PooledBatch):  # its images travel as their reusable memfd buffer
        return out, _places(out[1]) + [os.readlink(f"/proc/self/fd/{out._slot.fd}")]
    return out, _places(out)


def numpy_float(img):
    """A per-sample transform on numpy samples (default_collate turns them into tensors)."""
    return img.astype(np.float32) / 255


def convert_and_tell(sample):
    out = shipping.convert(sample)
    return out, _places(out)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("places") / "s.lmdb")
    build_store_fast(path, 24, side=64, variants=8, seed=4)
    return path


@pytest.mark.parametrize("kwargs, batch_size, collate_fn", [
    ({"transform": shm_loader.to_float}, 4, collate_and_tell),
    ({"output": "numpy", "transform": numpy_float}, 4, collate_and_tell),
    ({"target_transform": shm_loader.shifted}, 4, collate_and_tell),
    ({"output": "numpy", "target_transform": shm_loader.shifted}, 4, collate_and_tell),
    ({"transform": shm_loader.to_float}, None, convert_and_tell)],
    ids=["transform", "numpy-transform", "target-transform", "numpy-batched",
         "batch-size-none"])
def test_worker_tensors_live_in_memfd_memory(small_store, kwargs, batch_size, collate_fn):
    """Every tensor that ``shardkit.collate`` (or ``convert``, for ``batch_size=None``) returns in
    a worker is in a memfd, none in /dev/shm (runs anywhere: no root needed)."""
    ds = ShardDataset(small_store, crop=16, **kwargs)
    loader = ds.loader(batch_size=batch_size, num_workers=2, multiprocessing_context="fork",
                       collate_fn=collate_fn)
    places = [place for _, batch_places in loader for place in batch_places]
    assert places and all(p.startswith("/memfd:shardkit-batch") for p in places), places[:4]


@pytest.fixture(scope="module")
def fields_store(tmp_path_factory) -> str:
    """24 records with a multi-label field and a caption (a store with typed fields)."""
    from shardkit.fields import MultiLabel, Text

    path = str(tmp_path_factory.mktemp("fields-places") / "f.lmdb")
    rng = np.random.default_rng(5)
    schema = [MultiLabel("tags", 3, classes=["a", "b", "c"]), Text("caption")]
    with shardkit.StoreWriter(path, ["x"], schema=schema) as w:
        for i in range(24):
            w.add(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), 0, tags=[i % 3],
                  caption=f"record {i}")
    return path


def images_and_tell(batch):
    """Where a fields batch's images live, and whether sending its targets shares any tensor
    (they travel as numpy arrays, ``TargetBatch.__reduce__``: no /dev/shm either)."""
    from multiprocessing.reduction import ForkingPickler

    images, targets = shardkit.collate(batch)
    ForkingPickler.dumps(targets)
    shared = [t.untyped_storage().is_shared() for t in _tensors(dict(targets))]
    return [images, targets], (_places(images), shared)


def test_fields_batches_live_in_memfd_memory(fields_store):
    """A dataset with ``fields=`` collates its images through the same memfd path."""
    ds = ShardDataset(fields_store, crop=16, fields=["tags", "caption"],
                      transform=shm_loader.to_float)
    loader = ds.loader(batch_size=4, num_workers=2, multiprocessing_context="fork",
                       collate_fn=images_and_tell)
    told = [tell for _, tell in loader]
    places = [p for image_places, _ in told for p in image_places]
    assert len(told) == 6 and len(places) == 6
    assert all(p.startswith("/memfd:shardkit-batch") for p in places), places[:4]
    assert not any(s for _, shared in told for s in shared)
