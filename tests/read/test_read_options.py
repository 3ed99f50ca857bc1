"""Bad seeds and hand-edited states are refused with ``OptionError`` naming the parameter or the
state's key, never numpy's ValueError or a KeyError from inside."""

from __future__ import annotations

import json

import pytest

import shardkit
from shardkit import OptionError, ShardSampler

from helpers import build_store_fast
from helpers.tensors import tensor_shards


def test_subset_and_split_seeds(tmp_path):
    path = str(tmp_path / "s.lmdb")
    build_store_fast(path, 20, classes=2)
    ds = shardkit.ShardDataset(path)
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(OptionError, match=f"seed must be an integer >= 0, got {bad!r}"):
            ds.subset(fraction=0.5, seed=bad)
        with pytest.raises(OptionError, match=f"seed must be an integer >= 0, got {bad!r}"):
            ds.split(val=0.2, seed=bad)
    assert len(ds.subset(fraction=0.5, seed=2**40)) == 10  # any size of seed


def test_hand_edited_sampler_states_are_refused_by_key():
    ds = tensor_shards([6, 9, 5])
    state = json.loads(json.dumps(ShardSampler(ds, 2, 0, seed=1).state_dict(consumed=3)))
    ShardSampler(ds, 2, 1, seed=1).load_state_dict(state)  # as saved: fine
    edits = {"epoch": ("x", "epoch must be an integer >= 0, got 'x'"),
             "position": (2.5, "position must be an integer >= 0"),
             "num_canonical": ("24", "num_canonical must be an integer >= 1"),
             "canonical_world": (0, "canonical_world must be an integer >= 1"),
             "shuffle": ("yes", "shuffle must be true or false"),
             "seed": (None, "seed must be an integer")}
    for key, (value, message) in edits.items():
        with pytest.raises(OptionError, match=f"cannot resume: the ShardSampler state's {message}"):
            ShardSampler(ds, 2, 0, seed=1).load_state_dict({**state, key: value})
    for key in ("epoch", "position", "fingerprint"):
        with pytest.raises(OptionError, match=f"not a ShardSampler state \\(no {key}\\)"):
            ShardSampler(ds, 2, 0, seed=1).load_state_dict(
                {k: v for k, v in state.items() if k != key})
    with pytest.raises(OptionError, match="not a ShardSampler state \\(unknown epoc\\)"):
        ShardSampler(ds, 2, 0, seed=1).load_state_dict({**state, "epoc": 0})
    with pytest.raises(OptionError, match="canonical_world=5 does not divide num_canonical=24"):
        ShardSampler(ds, 2, 0, seed=1).load_state_dict({**state, "canonical_world": 5})
    with pytest.raises(OptionError, match="seed must be an integer, got 'x'"):
        ShardSampler(ds, 2, 0, seed="x")
    # A state from before canonical_world existed (its runs in plain order) still resumes.
    old = ShardSampler(ds, 2, 0, seed=1, num_canonical=4).state_dict(consumed=3)
    del old["canonical_world"]
    again = ShardSampler(ds, 1, 0, seed=1)
    again.load_state_dict(old)
    assert (again.num_canonical, again.canonical_world) == (4, 4)
    assert list(again) == list(ShardSampler(ds, 1, 0, seed=1, num_canonical=4))[6:]


def test_hand_edited_loader_states_are_refused_by_key(tmp_path):
    path = str(tmp_path / "s.lmdb")
    build_store_fast(path, 12)
    ds = shardkit.ShardDataset(path, crop=8)
    plain = ds.loader(batch_size=4)
    state = plain.state_dict()
    with pytest.raises(OptionError, match="state's batches must be an integer >= 0"):
        ds.loader(batch_size=4).load_state_dict({k: v for k, v in state.items() if k != "batches"})
    with pytest.raises(OptionError, match="state's complete must be true or false"):
        ds.loader(batch_size=4).load_state_dict({**state, "complete": "no"})
    sampled = ds.loader(batch_size=4, sampler=ShardSampler(ds, 1, 0))
    with pytest.raises(OptionError, match="has no sampler state"):
        sampled.load_state_dict({k: v for k, v in sampled.state_dict().items() if k != "sampler"})
