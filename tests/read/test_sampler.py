"""ShardSampler: DistributedSampler's contract with few shards per rank, epochs and exact resume;
unit behaviour in one process, then torch.distributed (gloo) with 2 real processes on CPU."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp_mp
from torch.utils.data import ConcatDataset, DataLoader, DistributedSampler, TensorDataset

import shardkit
from shardkit import ShardSampler
from shardkit.cli import main as cli_main

from helpers import image_tree, rank_outputs
from helpers.tensors import tensor_shards

SIZES = (7, 0, 13, 5, 9, 1, 11, 4)  # uneven shards, one empty


def _concat(sizes=SIZES) -> ConcatDataset:
    """Each part is one 'shard'; item i is the tensor [i]."""
    return tensor_shards(sizes)


def _lists(ds, replicas, **kw) -> list[list[int]]:
    return [list(ShardSampler(ds, replicas, r, **kw)) for r in range(replicas)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7, 16, 100])
def test_distributed_sampler_contract(replicas, drop_last, shuffle):
    ds = _concat()
    n = len(ds)
    lists = _lists(ds, replicas, drop_last=drop_last, shuffle=shuffle, seed=11)
    reference = DistributedSampler(ds, replicas, 0, drop_last=drop_last, shuffle=shuffle)
    assert all(len(lst) == len(reference) == len(ShardSampler(ds, replicas, 0, drop_last=drop_last))
               for lst in lists)
    flat = [i for lst in lists for i in lst]
    assert all(0 <= i < n for i in flat)
    if drop_last:
        assert len(set(flat)) == len(flat) == replicas * (n // replicas)
    else:
        assert set(flat) == set(range(n))
        assert len(flat) == replicas * math.ceil(n / replicas)
    if not shuffle:  # rank r reads one contiguous range, in order, after rank r-1's
        end = 0
        for lst in lists[:n]:  # (ranks beyond n only repeat others' samples)
            distinct = len(set(lst))
            start = lst[0] if lst else end
            assert start == end or (drop_last and start == end + 1)  # the dropped tail of a run
            assert lst[:distinct] == list(range(start, start + distinct))
            end = start + distinct


def test_each_rank_reads_few_shards():
    sizes = [10] * 40
    ds = _concat(sizes)
    starts = np.cumsum([0] + sizes)
    for replicas in (2, 4, 8):
        for epoch in range(3):
            per_rank = []
            for r in range(replicas):
                s = ShardSampler(ds, replicas, r, seed=1)
                s.set_epoch(epoch)
                shards = set((np.searchsorted(starts, list(s), side="right") - 1).tolist())
                assert shards == set(s.shards_of_rank())
                per_rank.append(len(shards))
            assert max(per_rank) <= len(sizes) // replicas + 1, per_rank
        # DistributedSampler, for comparison, has every rank read (nearly) every shard.
        d = DistributedSampler(ds, replicas, 0, seed=1)
        assert len(set((np.searchsorted(starts, list(d), side="right") - 1).tolist())) > \
            len(sizes) // replicas + 1


def test_padding_repeats_the_ranks_own_samples():
    ds = _concat([10, 10, 10, 3])  # 33 records, 4 ranks: 9 each, 3 of them padding
    for epoch in range(4):
        lists = []
        for r in range(4):
            s = ShardSampler(ds, 4, r, seed=2)
            s.set_epoch(epoch)
            lists.append(list(s))
        assert all(len(lst) == 9 for lst in lists)
        # Duplicates only within a rank: padding never pulls in another rank's samples (shards).
        assert sum(len(lst) - len(set(lst)) for lst in lists) == 3
        assert sum(len(set(lst)) for lst in lists) == len(set().union(*lists)) == 33


def test_deterministic_epochs_and_seeds():
    ds = _concat()
    a, b = ShardSampler(ds, 3, 1, seed=5), ShardSampler(ds, 3, 1, seed=5)
    assert list(a) == list(b) == list(a)
    e0 = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != e0
    assert list(ShardSampler(ds, 3, 1, seed=6)) != e0
    a.set_epoch(0)
    assert list(a) == e0
    # shuffled within a rank's run: not the sorted order
    assert e0 != sorted(e0)


def test_any_dataset_is_one_shard():
    ds = TensorDataset(torch.arange(25))
    lists = _lists(ds, 2, seed=3)
    assert set(lists[0] + lists[1]) == set(range(25)) and len(lists[0]) == len(lists[1]) == 13
    assert lists[0] != sorted(lists[0])


def test_world_from_torch_distributed_or_arguments():
    """Without a process group the world is one process, as in a script without DDP (the rule
    every OrderedSampler shares; README's BucketSampler block runs on it); half a world is
    refused."""
    ds = _concat()
    lone = ShardSampler(ds, seed=3)
    assert (lone.num_replicas, lone.rank) == (1, 0)
    assert list(lone) == list(ShardSampler(ds, 1, 0, seed=3)) and len(lone) == sum(SIZES)
    with pytest.raises(ValueError, match="num_replicas and rank"):
        ShardSampler(ds, num_replicas=2)
    with pytest.raises(ValueError, match="num_replicas and rank"):
        ShardSampler(ds, rank=0)
    with pytest.raises(ValueError, match="rank"):
        ShardSampler(ds, 2, 2)
    with pytest.raises(ValueError):
        ShardSampler(ds, 0, 0)


def test_state_dict_resume_exact_with_prefetching_loader():
    ds = _concat()
    full_sampler = ShardSampler(ds, 2, 1, seed=9)
    full_sampler.set_epoch(3)
    full = list(full_sampler)
    # A DataLoader with workers prefetches far ahead of what the loop has consumed.
    sampler = ShardSampler(ds, 2, 1, seed=9)
    sampler.set_epoch(3)
    loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, prefetch_factor=4)
    seen = []
    it = iter(loader)
    for _ in range(3):
        seen += next(it)[0].tolist()
        sampler.consumed += 4
    state = sampler.state_dict()
    assert state == sampler.state_dict(consumed=12) and state["epoch"] == 3
    del it

    resumed = ShardSampler(ds, 2, 1, seed=9)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a JSON checkpoint
    resumed.set_epoch(3)  # the usual loop calls set_epoch again: the position is kept
    assert len(resumed) == len(full) - 12
    rest = [i for (batch,) in DataLoader(ds, batch_size=4, sampler=resumed) for i in batch.tolist()]
    assert seen + rest == full
    # The next epoch is whole again.
    resumed.set_epoch(4)
    full_sampler.set_epoch(4)
    assert len(resumed) == len(full) and list(resumed) == list(full_sampler)


def test_load_state_dict_checks_compatibility():
    ds = _concat()
    state = ShardSampler(ds, 2, 0, seed=1).state_dict(consumed=5)
    ShardSampler(ds, 2, 1, seed=1).load_state_dict(state)  # rank-independent
    ShardSampler(ds, 3, 0, seed=1).load_state_dict(state)  # elastic: 3 divides the default 24
    for other in (ShardSampler(ds, 5, 0, seed=1), ShardSampler(ds, 2, 0, seed=2),
                  ShardSampler(ds, 2, 0, seed=1, drop_last=True),
                  ShardSampler(_concat([5, 5]), 2, 0, seed=1)):
        with pytest.raises(ValueError, match="cannot resume"):
            other.load_state_dict(state)
    with pytest.raises(ValueError):
        ShardSampler(ds, 2, 0).state_dict(consumed=10_000)


# -- a real store, and real processes ----------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("sampler")
    src, out = str(base / "src"), str(base / "store")
    # 27 records: odd, so 2 ranks pad / drop
    image_tree(src, classes=3, per_class=9, seed=4, pngs=1)
    assert cli_main(["pack", src, out, "--num-shards", "5", "--size", "24", "-q",
                     "--workers", "1"]) == 0
    return out


def test_shard_dataset_shards(store, tmp_path):
    ds = shardkit.ShardDataset(store)
    s = ShardSampler(ds, 2, 0, seed=0)
    assert np.array_equal(s.starts, ds.store.starts) and len(s.starts) == 6
    assert 1 <= len(s.shards_of_rank()) <= 4
    # a single-file store is one shard
    single = str(tmp_path / "one.lmdb")
    assert cli_main(["pack", os.path.join(os.path.dirname(store), "src"), single, "--size", "24",
                     "-q", "--workers", "1"]) == 0
    assert ShardSampler(shardkit.ShardDataset(single), 2, 0).starts.tolist() == [0, 27]


def _ddp_worker(rank: int, world: int, init: str, store: str, out: str) -> None:
    early = ShardSampler(shardkit.ShardDataset(store), seed=7)  # before the group: one replica
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        ds = shardkit.ShardDataset(store, output="bytes")
        result: dict = {"rank": rank}
        try:
            list(early)
            result["early"] = "iterated"
        except ValueError as exc:
            result["early"] = str(exc)
        sampler = ShardSampler(ds, seed=7)  # world and rank from torch.distributed
        assert (sampler.num_replicas, sampler.rank) == (world, rank)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            result[f"epoch{epoch}"] = list(sampler)
        result["shards"] = sampler.shards_of_rank()
        result["drop_last"] = list(ShardSampler(ds, seed=7, drop_last=True))

        # Train for 2 batches through a prefetching DataLoader, checkpoint on rank 0, resume.
        sampler = ShardSampler(ds, seed=7)
        sampler.set_epoch(2)
        full = list(sampler)
        loader = DataLoader(ds, batch_size=3, sampler=sampler, num_workers=2, prefetch_factor=4,
                            worker_init_fn=shardkit.worker_init_fn, collate_fn=list,
                            multiprocessing_context="fork")  # spawn would re-import torch
        it = iter(loader)
        consumed = [rec for _ in range(2) for rec in next(it)]
        del it
        state = [sampler.state_dict(consumed=6) if rank == 0 else None]
        dist.broadcast_object_list(state, src=0)  # the one collective (see rank_outputs)
        resumed = ShardSampler(ds, seed=7)
        resumed.load_state_dict(state[0])
        resumed.set_epoch(2)
        rest = [rec for batch in DataLoader(ds, batch_size=3, sampler=resumed, collate_fn=list)
                for rec in batch]
        result["resume_exact"] = consumed + rest == [ds[i] for i in full]

        # Plain DistributedSampler over a ShardDataset (labels through the DataLoader).
        labelled = shardkit.ShardDataset(store, crop=16)
        dsamp = DistributedSampler(labelled, seed=7)
        loader = DataLoader(labelled, batch_size=4, sampler=dsamp, num_workers=2,
                            multiprocessing_context="fork", worker_init_fn=shardkit.worker_init_fn,
                            collate_fn=shardkit.collate)
        got = [y for _, batch_labels in loader for y in batch_labels.tolist()]
        result["distributed_sampler"] = list(zip(list(dsamp), got))
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def test_torch_distributed_two_processes(store, tmp_path):
    out = str(tmp_path / "result.json")
    init = f"file://{tmp_path / 'rendezvous'}"
    tmp_mp.spawn(_ddp_worker, args=(2, init, store, out), nprocs=2, join=True)
    ranks = rank_outputs(out, 2)
    n = 27
    e0, e1 = [g["epoch0"] for g in ranks], [g["epoch1"] for g in ranks]
    assert [len(x) for x in e0] == [14, 14]
    assert set(e0[0]) | set(e0[1]) == set(range(n))  # union: the whole dataset
    assert set(e1[0]) | set(e1[1]) == set(range(n))
    assert e0 != e1  # epochs differ
    d0, d1 = [g["drop_last"] for g in ranks]
    assert len(d0) == len(d1) == 13 and not set(d0) & set(d1)  # disjoint
    assert all(1 <= len(g["shards"]) <= 4 for g in ranks)
    assert [g["resume_exact"] for g in ranks] == [True, True]
    # A sampler made before init_process_group took one replica: iterating it under the group
    # of 2 is refused (each rank would read the whole epoch).
    assert all("made before torch.distributed was initialised" in g["early"] for g in ranks)
    targets = shardkit.ShardDataset(store).targets
    pairs = [p for g in ranks for p in g["distributed_sampler"]]
    assert {i for i, _ in pairs} == set(range(n)) and len(pairs) == 28  # one padded
    assert all(y == targets[i] for i, y in pairs)


def test_is_a_distributed_sampler():
    # Lightning and timm check isinstance(sampler, DistributedSampler) and wrap anything else.
    s = ShardSampler(_concat(), 2, 1, seed=3)
    assert isinstance(s, DistributedSampler)
    assert (s.num_replicas, s.rank, s.epoch, s.seed, s.shuffle, s.drop_last) == (2, 1, 0, 3, True,
                                                                                  False)
    assert s.num_samples == len(DistributedSampler(s.dataset, 2, 1)) and s.total_size == 2 * 25


def test_canonical_runs_are_reshuffled_every_epoch():
    # Equal shards: were each run's shuffle the same every epoch, the places holding one shard's
    # samples would repeat each epoch (only which shard sits there would change).
    ds = _concat([5] * 8)
    sampler = ShardSampler(ds, 1, 0, seed=4, num_canonical=2)
    patterns = set()
    for epoch in range(4):
        sampler.set_epoch(epoch)
        shards = [i // 5 for i in sampler]
        first_seen = {s: k for k, s in enumerate(dict.fromkeys(shards))}
        patterns.add(tuple(first_seen[s] for s in shards))  # shard numbers up to renaming
    assert len(patterns) == 4
