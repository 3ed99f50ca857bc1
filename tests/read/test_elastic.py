"""The sampler's order is a pure function of (seed, epoch): the same global sequence at every world
size dividing num_canonical, and a state saved at one world size resumes exactly at another;
the resume position survives repeated iter() (DataLoader with batch_size=None); a state from
another store is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from torch.utils.data import ConcatDataset, DataLoader

import shardkit
from shardkit import ShardSampler
from shardkit.cli import main as cli_main

from helpers import image_tree, program_env, rank_outputs
from helpers.tensors import tensor_shards

SIZES = (31, 17, 0, 23, 40, 9, 28, 35, 12, 19, 26, 14)  # 254 samples, uneven shards, one empty


def _concat(sizes=SIZES) -> ConcatDataset:
    return tensor_shards(sizes)


def _ranks(ds, world, **kw) -> list[ShardSampler]:
    return [ShardSampler(ds, world, r, **kw) for r in range(world)]


def _interleave(lists: list[list[int]]) -> list[int]:
    """The global sequence the ranks read together: step by step, rank by rank."""
    return [lst[i] for i in range(max(map(len, lists), default=0)) for lst in lists
            if i < len(lst)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_global_sequence_is_the_same_at_every_world_size_dividing_canonical(drop_last):
    ds = _concat()
    n = len(ds)
    sequences = {}
    for world in (1, 2, 3, 4, 6, 8, 12, 24):
        samplers = _ranks(ds, world, seed=5, num_canonical=24, drop_last=drop_last)
        for s in samplers:
            s.set_epoch(3)
        lists = [list(s) for s in samplers]
        assert len({len(lst) for lst in lists}) == 1  # equal per rank
        kept = (n // world) * world if drop_last else n
        sequences[world] = _interleave(lists)[:kept]
    reference = sequences[1]
    assert sorted(reference) == list(range(n))
    for world, seq in sequences.items():
        assert seq == reference[:len(seq)], world
    # another epoch or seed is another order; the same (seed, epoch) is the same order
    other = ShardSampler(ds, 1, 0, seed=5, num_canonical=24)
    other.set_epoch(4)
    assert list(other) != reference
    again = ShardSampler(ds, 1, 0, seed=5, num_canonical=24)
    again.set_epoch(3)
    assert list(again)[:len(sequences[1])] == reference


def test_world_size_must_divide_canonical():
    ds = _concat()
    with pytest.raises(ValueError, match="num_canonical=24 is not a multiple of num_replicas=5"):
        ShardSampler(ds, 5, 0, num_canonical=24)
    with pytest.raises(ValueError, match="num_canonical must be an integer"):
        ShardSampler(ds, 2, 0, num_canonical=0)


def _run_until(ds, world, k, epoch, **kw) -> tuple[dict, list[list[int]]]:
    """World of ``world`` ranks consumes ``k`` samples each; returns rank 0's state and what
    each rank consumed."""
    samplers = _ranks(ds, world, **kw)
    consumed = []
    for s in samplers:
        s.set_epoch(epoch)
        consumed.append(list(s)[:k])
        s.consumed = k
    states = [s.state_dict() for s in samplers]
    assert all(st == states[0] for st in states)  # rank-independent
    return json.loads(json.dumps(states[0])), consumed


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("k", [0, 1, 7, 30, 63])
@pytest.mark.parametrize("after", [4, 2, 3, 8, 1, 12])
def test_elastic_resume_is_exact_sample_for_sample(after, k, drop_last):
    ds = _concat()
    n = len(ds)
    kw = dict(seed=9, num_canonical=24, drop_last=drop_last)
    # the uninterrupted run at 4 ranks, read one step at a time
    full = _interleave([list(s) for s in _ranks_at_epoch(ds, 4, 2, **kw)])
    state, consumed = _run_until(ds, 4, k, 2, **kw)
    done = _interleave(consumed)
    assert done == full[:len(done)]
    resumed = _ranks(ds, after, **{**kw, "num_canonical": None})  # adopts the saved partition
    for s in resumed:
        s.load_state_dict(state)
        s.set_epoch(2)  # the usual loop sets the epoch again: the position is kept
    rest_lists = [list(s) for s in resumed]
    assert len({len(x) for x in rest_lists}) == 1 and all(len(s) == len(rest_lists[0])
                                                          for s in resumed)
    rest = _interleave(rest_lists)
    left = n - len(done)
    if drop_last:  # only the last partial step of the remainder is dropped
        assert len(rest) == left - left % after
    else:  # the ranks together yield the remainder, then pad with their own samples
        assert len(rest) == after * -(-left // after)
        assert set(rest[left:]) <= set(done + rest[:left])
    if after == 4:  # the same world size: exactly the uninterrupted run, padding included
        assert done + rest == full
    unpadded = rest[:left]
    # nothing repeated, nothing skipped: consumed + rest is the whole epoch, in global order
    assert done + unpadded == _interleave([list(s) for s in _ranks_at_epoch(
        ds, 1, 2, seed=9, num_canonical=24)])[:len(done) + len(unpadded)]
    if not drop_last:
        assert sorted(done + unpadded) == list(range(n))
    # a second save at the new size resumes at yet another size
    if not drop_last and after in (2, 3) and k <= 30:
        for s in resumed:
            s.consumed += 5
        again = resumed[0].state_dict()
        final = _ranks(ds, 8, seed=9)
        for s in final:
            s.load_state_dict(again)
        tail = _interleave([list(s) for s in final])[:n - len(done) - 5 * after]
        assert done + unpadded[:5 * after] + tail == done + unpadded


def _ranks_at_epoch(ds, world, epoch, **kw):
    samplers = _ranks(ds, world, **kw)
    for s in samplers:
        s.set_epoch(epoch)
    return samplers


def test_resume_refused_where_the_world_size_does_not_divide():
    ds = _concat()
    state, _ = _run_until(ds, 4, 10, 0, seed=1, num_canonical=4)  # chosen: 4
    with pytest.raises(ValueError, match="cannot resume.*num_canonical=4.*num_replicas=8"):
        ShardSampler(ds, 8, 0, seed=1).load_state_dict(state)
    ShardSampler(ds, 2, 0, seed=1).load_state_dict(state)  # 2 divides 4
    with pytest.raises(ValueError, match="cannot resume: saved num_canonical=4"):
        ShardSampler(ds, 2, 0, seed=1, num_canonical=2).load_state_dict(state)
    with pytest.raises(ValueError, match="state version"):
        ShardSampler(ds, 4, 0, seed=1).load_state_dict({**state, "version": 1})


def test_default_state_from_4_ranks_resumes_exactly_at_1_2_3_6_8_12():
    """Elastic by default: no num_canonical chosen, a state saved at 4 ranks resumes at the
    sizes jobs move between, every remaining sample exactly once, in the uninterrupted order."""
    ds = _concat()
    n = len(ds)
    full = _interleave([list(s) for s in _ranks_at_epoch(ds, 4, 1, seed=2)])
    state, consumed = _run_until(ds, 4, 9, 1, seed=2)  # 36 samples consumed at 4 ranks
    done = _interleave(consumed)
    assert done == full[:36] and state["num_canonical"] == 24
    for after in (1, 2, 3, 6, 8, 12):
        resumed = _ranks(ds, after, seed=2)
        for s in resumed:
            s.load_state_dict(state)
        rest = _interleave([list(s) for s in resumed])[:n - 36]
        assert rest == full[36:n], after  # the uninterrupted run's remaining samples, in order
        assert sorted(done + rest) == list(range(n))
    # a world size that divides neither is refused with one line
    with pytest.raises(ValueError, match="cannot resume.*num_canonical=24.*num_replicas=16"):
        ShardSampler(ds, 16, 0, seed=2).load_state_dict(state)


def test_ranks_read_their_own_shards_at_every_world_size():
    sizes = [10] * 48
    ds = _concat(sizes)
    for world in (2, 4, 8):
        for s in _ranks(ds, world, seed=3, num_canonical=8):
            # C/W runs of S/C shards each, a shard at each run's edge shared
            assert len(s.shards_of_rank()) <= len(sizes) // world + 8 // world


# -- 15.1: the skip belongs to the epoch, not to the first iter() -------------------------------

@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_resume_survives_a_dataloader_that_calls_iter_twice(context):
    ds = _concat()
    full_sampler = ShardSampler(ds, 2, 1, seed=4)
    full = list(full_sampler)
    state, _ = _run_until(ds, 2, 40, 0, seed=4)
    sampler = ShardSampler(ds, 2, 1, seed=4)
    sampler.load_state_dict(state)
    assert len(sampler) == len(full) - 40
    # batch_size=None with workers: the DataLoader calls iter(sampler) more than once
    loader = DataLoader(ds, batch_size=None, sampler=sampler, num_workers=2,
                        multiprocessing_context=context)
    got = [int(x[0]) for x in loader]
    assert got == full[40:]
    assert len(sampler) == len(full) - 40  # still the resumed epoch's length
    assert list(sampler) == full[40:]      # and again: the skip stays with the epoch
    sampler.set_epoch(1)
    full_sampler.set_epoch(1)
    assert len(sampler) == len(full) and list(sampler) == list(full_sampler)


# -- 15.2: a state from another store is refused -------------------------------------------------

@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("fingerprint")
    a, b, c = str(base / "a"), str(base / "b"), str(base / "c")
    image_tree(a, classes=2, per_class=8, seed=1)
    image_tree(b, classes=2, per_class=8, seed=2)  # same counts, other pixels
    image_tree(c, classes=2, per_class=8, seed=1)
    with open(os.path.join(c, "c0", "broken.jpg"), "wb") as f:  # 17 sources, 16 records
        f.write(b"not an image")
    out = {}
    for name, src in (("a", a), ("a2", a), ("b", b), ("sizes", c)):
        out[name] = str(base / f"store-{name}")
        assert cli_main(["pack", src, out[name], "--num-shards", "4", "--size", "16", "-q",
                         "--workers", "1", "--order", "source"]) == 0
    out["mixed"] = str(base / "store-mixed")  # 3 classes x 9, the default layout, 5 shards
    image_tree(str(base / "m"), classes=3, per_class=9, seed=4)
    assert cli_main(["pack", str(base / "m"), out["mixed"], "--num-shards", "5", "--size", "16",
                     "-q", "--workers", "1"]) == 0
    return out


def test_state_from_another_store_is_refused(stores):
    a = shardkit.ShardDataset(stores["a"])
    state = ShardSampler(a, 2, 0, seed=0).state_dict(consumed=3)
    ShardSampler(shardkit.ShardDataset(stores["a2"]), 2, 0).load_state_dict(state)  # same pack
    for name in ("b", "sizes"):  # other contents; other shard sizes
        other = shardkit.ShardDataset(stores[name])
        assert len(other) == len(a) and len(other.store.shards) == len(a.store.shards)
        with pytest.raises(ValueError, match="cannot resume: saved fingerprint"):
            ShardSampler(other, 2, 0).load_state_dict(state)
    sizes = shardkit.ShardDataset(stores["sizes"]).store.starts.tolist()
    assert sizes != a.store.starts.tolist()


# -- one real DDP run under torchrun (gloo, 2 processes): resume a state saved at 4 ranks ------

def test_torchrun_resumes_a_state_from_another_world_size(stores, tmp_path):
    ds = shardkit.ShardDataset(stores["mixed"], output="bytes")
    n = len(ds)
    full = _interleave([list(s) for s in _ranks_at_epoch(ds, 4, 1, seed=7)])  # 28 (1 padded)
    state, _ = _run_until(ds, 4, 3, 1, seed=7)  # 12 consumed at 4 ranks
    state_path, out = str(tmp_path / "state.json"), str(tmp_path / "result.json")
    with open(state_path, "w") as f:
        json.dump(state, f)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", "-m", "helpers.programs.elastic_ddp",
                           stores["mixed"], state_path, out], env=program_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = rank_outputs(out, 2)
    assert [len(g["rest"]) for g in ranks] == [-(-(n - 12) // 2)] * 2  # equal, padded
    rest = _interleave([[bytes.fromhex(r) for r in g["rest"]] for g in ranks])
    assert rest[:n - 12] == [ds[i][0] for i in full[12:n]]  # the rest, in the global order
    # The next epoch: the adopted partition (num_canonical and the runs grouped for 4 ranks,
    # from the state), as two in-process samplers that load the same state give it.
    resumed = []
    for r in range(2):
        sampler = ShardSampler(ds, 2, r, seed=7)
        sampler.load_state_dict(state)
        sampler.set_epoch(2)
        resumed.append(list(sampler))
    expect_next = _interleave(resumed)
    assert sorted(set(expect_next)) == list(range(n))  # every sample of the next epoch
    assert _interleave([g["next"] for g in ranks]) == expect_next


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_resumed_sampler_through_ds_loader_with_batch_size_none(stores, context):
    ds = shardkit.ShardDataset(stores["mixed"], output="bytes")
    full = list(ShardSampler(ds, 2, 0, seed=3))
    state, _ = _run_until(ds, 2, 5, 0, seed=3)
    sampler = ShardSampler(ds, 2, 0, seed=3)
    sampler.load_state_dict(state)
    got = [rec for rec, _ in ds.loader(batch_size=None, sampler=sampler, num_workers=2,
                                       multiprocessing_context=context)]
    assert got == [ds[i][0] for i in full[5:]]
