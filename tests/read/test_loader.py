"""``ShardDataset.loader``: a DataLoader set up as documented (``shardkit.collate``,
``shardkit.worker_init_fn`` then the user's, persistent workers) that passes every DataLoader
argument through. Its batches equal those of the hand-built DataLoader, in the main process and in
forked and spawned workers, with shuffling, samplers and ``DistributedSampler``; except that its
random crops and flips are each sample's own draws (``torch.manual_seed(shardkit.sample_seed(
seed, epoch, position))`` then ``ds[i]``), where a hand-built loader's come from each worker's
RNG (``tests/read/test_draws.py``).
"""

from __future__ import annotations

import functools
import json
import os

import pytest
import torch
from torch.utils.data import (BatchSampler, DataLoader, DistributedSampler, SequentialSampler,
                              get_worker_info)

import shardkit
from shardkit import ShardDataset
from shardkit.bench.sample import make_sample


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """30 photo-like JPEGs in 3 classes, packed at 64."""
    base = tmp_path_factory.mktemp("loader")
    make_sample(str(base / "src"), 30, 3, seed=5, workers=1)
    path = str(base / "s.lmdb")
    shardkit.pack(str(base / "src"), path, size=64, workers=1, progress=False)
    return path


def mark_worker(folder: str, worker_id: int) -> None:
    """A user's ``worker_init_fn``: one file per call, named by worker id and process, saying
    whether the worker's dataset was already open in this process (shardkit's init ran first:
    opening a single-file store opens its one shard)."""
    store = get_worker_info().dataset.store
    with open(os.path.join(folder, f"{worker_id}-{os.getpid()}"), "w") as f:
        json.dump({"opened_here": store.open_shards == [0]}, f)


def as_list(batch):
    return list(batch)


def epochs(loader, count: int = 2) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    # Batches from shardkit.collate live in reused buffers: keep copies.
    return [[(images.clone(), labels.clone()) for images, labels in loader] for _ in range(count)]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b))


def same_records(a: list, b: list) -> bool:
    """The same labels in the same batches, images of the same shapes."""
    return len(a) == len(b) and all(x[0].shape == y[0].shape and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b))


def keyed(ds, seed: int, epoch: int, positions, indices) -> torch.Tensor:
    """``ds[i]``'s image under each sample's own seed: what ``ds.loader`` gives for the sample
    at ``position`` of ``epoch`` with the loader's seed ``seed``."""
    images = []
    for position, i in zip(positions, indices):
        torch.manual_seed(shardkit.sample_seed(seed, epoch, position))
        images.append(ds[i][0])
    return torch.stack(images)


@pytest.mark.parametrize("context, workers", [(None, 0), ("fork", 2), ("spawn", 2)],
                         ids=["main-process", "fork", "spawn"])
def test_batches_equal_the_documented_hand_built_loader(store, tmp_path, context, workers):
    """Shuffled centre crops: the same batches as ``DataLoader(...,
    worker_init_fn=shardkit.worker_init_fn, collate_fn=shardkit.collate,
    persistent_workers=True)`` (random crops: see ``test_samplers_and_distributed_sampler_pass_
    through``); the user's ``worker_init_fn`` runs once in each worker (persistent across
    epochs), after shardkit's."""
    ds = ShardDataset(store, crop=32)
    common = dict(batch_size=4, shuffle=True, num_workers=workers, multiprocessing_context=context)
    marks = tmp_path / "marks"
    marks.mkdir()
    loader = ds.loader(**common, generator=torch.Generator().manual_seed(3),
                       worker_init_fn=functools.partial(mark_worker, str(marks)))
    assert loader.collate_fn is shardkit.collate and loader.persistent_workers == (workers > 0)
    hand = DataLoader(ds, **common, generator=torch.Generator().manual_seed(3),
                      worker_init_fn=shardkit.worker_init_fn, collate_fn=shardkit.collate,
                      persistent_workers=workers > 0)
    torch.manual_seed(8)  # the main process's draws (num_workers=0)
    got = epochs(loader)
    torch.manual_seed(8)
    expected = epochs(hand)
    del loader, hand  # persistent workers end here
    assert all(same(a, b) for a, b in zip(got, expected))
    images, labels = got[0][0]
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
    assert sorted(label for batch in got[0] for label in batch[1].tolist()) == \
        sorted(ds.targets.tolist())
    assert not same(got[0], got[1])  # a new shuffle each epoch
    records = {name: json.loads((marks / name).read_text()) for name in os.listdir(marks)}
    if workers:
        ids, pids = zip(*(name.split("-") for name in records))
        assert sorted(ids) == ["0", "1"] and len(set(pids)) == 2
        assert str(os.getpid()) not in pids
        assert all(r["opened_here"] for r in records.values())
    else:
        assert not records  # no worker, no worker_init_fn


def test_samplers_and_distributed_sampler_pass_through(store):
    """A plain sampler (main process) and DistributedSampler (forked workers, two ranks): the
    hand-built loader's batches of records, each image the sample's own random crop and flip
    (its place in the epoch: ``k``; under DistributedSampler ``rank + k * num_replicas``), and
    the ranks' batches cover the dataset once."""
    ds = ShardDataset(store, crop=32, crop_mode="random", flip=0.5)
    order = [7, 3, 29, 0, 11, 11, 5]
    torch.manual_seed(1)
    got = epochs(ds.loader(batch_size=3, sampler=order), 1)[0]
    torch.manual_seed(1)
    expected = epochs(DataLoader(ds, batch_size=3, sampler=order, collate_fn=shardkit.collate,
                                 worker_init_fn=shardkit.worker_init_fn), 1)[0]
    assert same_records(got, expected) and [len(b[1]) for b in got] == [3, 3, 1]
    assert torch.cat([b[1] for b in got]).tolist() == ds.targets[order].tolist()
    # record 11 twice: at two places, two crops
    assert torch.equal(torch.cat([b[0] for b in got]), keyed(ds, 1, 0, range(7), order))
    labels = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
        sampler.set_epoch(1)
        common = dict(batch_size=4, sampler=sampler, num_workers=2, multiprocessing_context="fork")
        torch.manual_seed(2)
        got = epochs(ds.loader(**common), 1)[0]
        torch.manual_seed(2)
        expected = epochs(DataLoader(ds, **common, collate_fn=shardkit.collate,
                                     worker_init_fn=shardkit.worker_init_fn), 1)[0]
        assert same_records(got, expected)
        mine = list(sampler)
        assert torch.equal(torch.cat([b[0] for b in got]), keyed(
            ds, 2, 1, range(rank, 2 * len(mine), 2), mine))
        labels += [label for batch in got for label in batch[1].tolist()]
    assert sorted(labels) == sorted(ds.targets.tolist())


def test_every_dataloader_argument_passes_through(store):
    ds = ShardDataset(store, crop=32)
    plain = ds.loader()  # DataLoader's own defaults, with shardkit's three
    assert plain.batch_size == 1 and plain.worker_init_fn is shardkit.worker_init_fn
    assert plain.collate_fn is shardkit.collate and not plain.persistent_workers
    batches = ds.loader(batch_sampler=BatchSampler(SequentialSampler(ds), 7, drop_last=False))
    assert [len(labels) for _, labels in batches] == [7, 7, 7, 7, 2]
    loader = ds.loader(8, drop_last=True, timeout=30, num_workers=2, prefetch_factor=3,
                       pin_memory=True, multiprocessing_context="fork", persistent_workers=False,
                       worker_init_fn=shardkit.worker_init_fn, collate_fn=as_list)
    assert (loader.drop_last, loader.timeout, loader.prefetch_factor, loader.pin_memory,
            loader.persistent_workers) == (True, 30, 3, True, False)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert loader.worker_init_fn is shardkit.worker_init_fn and loader.collate_fn is as_list
    samples = list(loader)  # lists of (image, label): the user's collate
    assert [len(b) for b in samples] == [8, 8, 8]
    assert all(torch.equal(b[0][0], ds[i * 8][0]) for i, b in enumerate(samples))
    with pytest.raises(TypeError, match="bogus"):
        ds.loader(4, bogus=1)



@pytest.mark.parametrize("context, workers", [(None, 0), ("fork", 2), ("spawn", 2)],
                         ids=["main-process", "fork", "spawn"])
def test_batch_size_none_yields_single_samples(store, context, workers):
    """``ds.loader(batch_size=None)``: each sample as ``DataLoader(ds, batch_size=None)`` gives it
    (torch's ``default_convert``; a collate function would try to stack image and label)."""
    ds = ShardDataset(store, crop=32)
    loader = ds.loader(batch_size=None, num_workers=workers, multiprocessing_context=context)
    got = [(image.clone(), label) for image, label in loader]
    assert len(got) == len(ds)
    for i, (image, label) in enumerate(got):
        reference, expected_label = ds[i]
        assert torch.equal(image, reference) and image.shape == (3, 32, 32)
        assert isinstance(label, int) and label == expected_label
