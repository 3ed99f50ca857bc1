"""Mixing stores: exact per-epoch quotas (proportion, repeat, choose), shard locality,
determinism, exact resume across epochs and world sizes, foreign states refused; real stores
through Mix.loader with fork and spawn workers and batch_size None."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

import shardkit
from shardkit.cli import main as cli_main
from shardkit.read.mix import Mix, MixSampler

from helpers import image_tree
from helpers.tensors import tensor_shards as _part  # a part made of shards


def _mix(a=(10,) * 10, b=(20,) * 10) -> Mix:
    return Mix([_part(a, 0), _part(b, sum(a))])  # 100 + 200 samples


def _epoch(mix, world, epoch, **kw) -> list[list[int]]:
    samplers = [MixSampler(mix, num_replicas=world, rank=r, **kw) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(s) for s in samplers]


def _interleave(lists):
    return [lst[i] for i in range(max(map(len, lists), default=0)) for lst in lists
            if i < len(lst)]


def _per_part(indices, first=100):
    return sum(i < first for i in indices), sum(i >= first for i in indices)


def test_streaming_example_quotas_are_exact_every_epoch():
    mix = _mix()
    for epoch in range(4):
        lists = _epoch(mix, 4, epoch, proportion=[0.25, 0.75], epoch_size=400, seed=1)
        flat = [i for lst in lists for i in lst]
        assert len(flat) == 400 and {len(x) for x in lists} == {100}
        assert _per_part(flat) == (100, 300)
        counts = Counter(flat)
        assert set(counts) >= set(range(100, 300))  # part b: every sample, 100 twice
        assert sorted(Counter(counts[i] for i in range(100, 300)).items()) == [(1, 100),
                                                                               (2, 100)]
        assert all(counts[i] == 1 for i in range(100))


@pytest.mark.parametrize("kw,want", [
    (dict(repeat=[0.5, 2]), (50, 400)),
    (dict(choose=[7, 333]), (7, 333)),
    (dict(proportion=[1, 1]), (150, 150)),  # epoch_size: both lengths
    (dict(proportion=[1, 2], epoch_size=301), (100, 201)),  # largest remainder
])
def test_repeat_choose_and_proportion_quotas(kw, want):
    mix = _mix()
    for epoch in (0, 1):
        sampler = MixSampler(mix, num_replicas=1, rank=0, seed=3, **kw)
        sampler.set_epoch(epoch)
        assert _per_part(list(sampler)) == want and len(sampler) == sum(want)


def test_down_sampled_part_opens_only_the_shards_it_uses():
    mix = _mix()
    starts = np.cumsum([0] + [10] * 10 + [20] * 10)
    sampler = MixSampler(mix, num_replicas=1, rank=0, choose=[25, 200], seed=5)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        a = [i for i in sampler if i < 100]
        shards = set((np.searchsorted(starts, a, side="right") - 1).tolist())
        assert len(a) == 25 and len(shards) == 3  # two whole shards and part of a third
        assert len(set(a)) == 25


def test_deterministic_and_epochs_differ():
    mix = _mix()
    kw = dict(proportion=[0.25, 0.75], epoch_size=400, seed=9)
    assert _epoch(mix, 2, 0, **kw) == _epoch(mix, 2, 0, **kw)
    assert _epoch(mix, 2, 0, **kw) != _epoch(mix, 2, 1, **kw)
    assert _epoch(mix, 2, 0, **kw) != _epoch(mix, 2, 0, **{**kw, "seed": 10})


@pytest.mark.parametrize("after", [4, 2, 8, 1])
def test_resume_mid_epoch_at_another_world_size_then_next_epoch(after):
    mix = _mix()
    kw = dict(proportion=[0.25, 0.75], epoch_size=400, seed=2, num_canonical=8)
    full = _interleave(_epoch(mix, 1, 1, **kw))
    samplers = [MixSampler(mix, num_replicas=4, rank=r, **kw) for r in range(4)]
    done = []
    for s in samplers:
        s.set_epoch(1)
        done.append(list(s)[:23])
        s.consumed = 23
    state = json.loads(json.dumps(samplers[0].state_dict()))
    resumed = [MixSampler(mix, num_replicas=after, rank=r, **{**kw, "num_canonical": None})
               for r in range(after)]
    for s in resumed:
        s.load_state_dict(state)
        s.set_epoch(1)
    rest = _interleave([list(s) for s in resumed])
    assert _interleave(done) + rest[:400 - 92] == full  # sample for sample
    assert _per_part(_interleave(done) + rest[:400 - 92]) == (100, 300)
    for s in resumed:
        s.set_epoch(2)
    assert _interleave([list(s) for s in resumed])[:400] == _interleave(_epoch(mix, 1, 2, **kw))


def test_foreign_state_refused():
    mix = _mix()
    state = MixSampler(mix, num_replicas=2, rank=0, proportion=[0.25, 0.75],
                       epoch_size=400).state_dict(consumed=3)
    for other in (MixSampler(mix, num_replicas=2, rank=0, proportion=[0.5, 0.5],
                             epoch_size=400),
                  MixSampler(_mix(a=(5,) * 20), num_replicas=2, rank=0,
                             proportion=[0.25, 0.75], epoch_size=400)):
        with pytest.raises(ValueError, match="cannot resume"):
            other.load_state_dict(state)


def test_bad_options_name_the_parameter():
    mix = _mix()
    with pytest.raises(ValueError, match="exactly one of proportion, repeat or choose"):
        MixSampler(mix, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="proportion must be 2 non-negative numbers"):
        MixSampler(mix, num_replicas=1, rank=0, proportion=[1])
    with pytest.raises(ValueError, match="epoch_size goes with proportion"):
        MixSampler(mix, num_replicas=1, rank=0, repeat=[1, 1], epoch_size=5)
    with pytest.raises(ValueError, match="choose must be whole numbers"):
        MixSampler(mix, num_replicas=1, rank=0, choose=[1.5, 2])


# -- real stores ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("mix")
    out = []
    for name, classes, per_class, shards in (("a", 2, 6, 3), ("b", 3, 8, 4)):
        src, store = str(base / f"src-{name}"), str(base / name)
        image_tree(src, classes=classes, per_class=per_class, seed=len(out) + 1)
        assert cli_main(["pack", src, store, "--num-shards", str(shards), "--size", "16", "-q",
                         "--workers", "1"]) == 0
        out.append(store)
    return out  # 12 and 24 records


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_real_stores_through_the_loader(stores, context):
    a, b = (shardkit.ShardDataset(s, crop=8) for s in stores)
    mix = Mix([a, b])
    targets = np.concatenate([a.targets, b.targets])
    sampler = MixSampler(mix, num_replicas=2, rank=1, proportion=[0.5, 0.5], epoch_size=40,
                         seed=4)
    order = list(sampler)
    other = list(MixSampler(mix, num_replicas=2, rank=0, proportion=[0.5, 0.5], epoch_size=40,
                            seed=4))
    assert _per_part(order + other, 12) == (20, 20) and len(order) == len(other) == 20
    batches = list(mix.loader(batch_size=6, sampler=sampler, num_workers=2,
                              multiprocessing_context=context))
    labels = torch.cat([y for _, y in batches]).tolist()
    assert labels == targets[order].tolist()
    images = torch.cat([x for x, _ in batches])
    in_process = list(mix.loader(batch_size=6, sampler=sampler))  # no workers: the same batches
    assert torch.equal(torch.cat([x for x, _ in in_process]), images)
    for j in (0, 7, len(order) - 1):
        i = order[j]
        want = a[i][0] if i < 12 else b[i - 12][0]
        assert torch.equal(images[j], want)
    # batch_size=None: one sample at a time (the loader calls iter(sampler) twice)
    single = list(mix.loader(batch_size=None, sampler=sampler, num_workers=2,
                             multiprocessing_context=context))
    assert [int(y) for _, y in single] == targets[order].tolist()


# -- draws that must change per epoch, quotas that must round ------------------------------------

def test_down_sampled_part_draws_other_shards_each_epoch_and_covers_the_store():
    mix = _mix()  # a: 10 shards of 10, b: 10 shards of 20
    sampler = MixSampler(mix, num_replicas=1, rank=0, proportion=[0.25, 0.75], epoch_size=100,
                         seed=7, num_canonical=1)
    assert sampler.quotas.tolist() == [25, 75]  # both parts down-sampled
    shard_sets = {"a": [], "b": []}
    for epoch in range(20):
        sampler.set_epoch(epoch)
        got = list(sampler)
        assert _per_part(got) == (25, 75)
        shard_sets["a"].append(frozenset(i // 10 for i in got if i < 100))
        shard_sets["b"].append(frozenset((i - 100) // 20 for i in got if i >= 100))
    for part, sets in shard_sets.items():
        assert all(len(s) == (3 if part == "a" else 4) for s in sets)  # whole shards + 1 partial
        assert len(set(sets)) > 10, part  # another draw of shards nearly every epoch
        assert frozenset().union(*sets) == frozenset(range(10)), part  # all shards in 20 epochs


def test_partly_taken_shard_gives_other_records_each_epoch():
    mix = Mix([_part((10,), 0), _part((10, 10), 10)])  # part a: one shard of 10
    sampler = MixSampler(mix, num_replicas=1, rank=0, choose=[4, 20], seed=3, num_canonical=1)
    drawn = []
    for epoch in range(10):
        sampler.set_epoch(epoch)
        drawn.append(frozenset(i for i in sampler if i < 10))
    assert all(len(d) == 4 for d in drawn)
    assert len(set(drawn)) > 5  # not the same (nor the first) 4 records every epoch
    assert frozenset().union(*drawn) == frozenset(range(10))


def test_repeat_quotas_are_rounded_not_floored():
    mix = _mix()  # 100 + 200 samples
    # 0.257 * 100 = 25.7 -> 26 and 1.3335 * 200 = 266.7 -> 267 (floor: 25 and 266)
    sampler = MixSampler(mix, num_replicas=1, rank=0, repeat=[0.257, 1.3335], seed=1,
                         num_canonical=1)
    assert sampler.quotas.tolist() == [26, 267]
    assert _per_part(list(sampler)) == (26, 267) and len(sampler) == 293
