"""``ds.loader`` resumes mid-epoch from ``state_dict()`` at exactly the next batch (ShardSampler,
DistributedSampler, ``shuffle=True``, with and without workers), counts what the loop received
(not what workers prefetched), keeps ``len`` the full epoch, refuses what it cannot replay, and
gives normalised contiguous float batches on request."""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import DistributedSampler, WeightedRandomSampler

import shardkit
from shardkit.errors import OptionError

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def labels_of(batches) -> list[list[int]]:
    return [b[1].tolist() for b in batches]


def roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)  # what a checkpoint does; loadable with weights_only
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


SAMPLERS = {
    "shard": lambda ds: dict(sampler=shardkit.ShardSampler(ds, num_replicas=2, rank=1, seed=4)),
    "distributed": lambda ds: dict(sampler=DistributedSampler(ds, num_replicas=2, rank=0, seed=4)),
    "shuffle": lambda ds: dict(shuffle=True),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_resume_mid_epoch_at_the_next_batch(photo_store, kind, workers):
    ds = shardkit.ShardDataset(photo_store, crop=32, crop_mode="random")
    torch.manual_seed(1)
    make = lambda: ds.loader(batch_size=5, num_workers=workers, **SAMPLERS[kind](ds))  # noqa: E731
    loader = make()
    sampler = loader.sampler
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(1)
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(3)]  # workers have prefetched further
    state = roundtrip(loader.state_dict())
    tail = labels_of(it)
    assert state["batches"] == 3

    torch.manual_seed(99)  # the resumed run's RNG differs: the order must not depend on it
    resumed = make()
    resumed.load_state_dict(state)  # shuffle: the saved generator state replaces the new seed
    assert len(resumed) == len(loader)  # Lightning counts the epoch's batches from it
    assert labels_of(resumed) == tail
    assert len(head) + len(tail) == len(loader)


def test_a_completed_epoch_resumes_at_the_next_epoch(photo_store):
    ds = shardkit.ShardDataset(photo_store, crop=32)
    make = lambda: ds.loader(batch_size=8, sampler=shardkit.ShardSampler(  # noqa: E731
        ds, num_replicas=1, rank=0, seed=2))
    loader = make()
    loader.sampler.set_epoch(0)
    labels_of(loader)
    state = loader.state_dict()
    loader.sampler.set_epoch(1)
    next_epoch = labels_of(loader)
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.sampler.epoch == 1 and labels_of(resumed) == next_epoch


def test_an_order_that_cannot_be_replayed_is_refused(photo_store):
    ds = shardkit.ShardDataset(photo_store, crop=32)
    weights = torch.ones(len(ds))
    loader = ds.loader(batch_size=4, sampler=WeightedRandomSampler(weights, len(ds)))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = ds.loader(batch_size=4, sampler=WeightedRandomSampler(weights, len(ds)))
    with pytest.raises(OptionError, match="does not give the same order again"):
        again.load_state_dict(state)
    other = ds.loader(batch_size=3, sampler=shardkit.ShardSampler(ds, num_replicas=1, rank=0))
    with pytest.raises(OptionError, match="another kind"):
        other.load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
def test_normalised_output_is_contiguous_float(photo_store, workers):
    ds = shardkit.ShardDataset(photo_store, crop=32)
    raw = next(iter(ds.loader(batch_size=6)))
    images, labels = next(iter(ds.loader(batch_size=6, num_workers=workers,
                                         normalize=(MEAN, STD), device="cpu")))
    assert images.dtype == torch.float32 and images.is_contiguous()
    assert not raw[0].is_contiguous()  # uint8 batches: NCHW views of NHWC memory
    assert torch.equal(images, shardkit.normalize(raw[0], MEAN, STD))
    assert torch.equal(labels, raw[1])
    last = next(iter(ds.loader(batch_size=6, normalize=(MEAN, STD),
                               memory_format=torch.channels_last)))[0]
    assert last.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(OptionError, match="device needs normalize"):
        ds.loader(batch_size=6, device="cpu")
    with pytest.raises(OptionError, match="uint8"):
        next(iter(shardkit.ShardDataset(photo_store, crop=32, output="numpy").loader(
            batch_size=2, normalize=(MEAN, STD))))
