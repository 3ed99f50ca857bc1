"""A sampler or loader state saved over one version of a store resumes over a later one on the
records both share, when asked (``load_state_dict(state, across_versions=True)``): the saved
run's unconsumed samples in its order, less the deleted ones, split by this run's ranks."""

from __future__ import annotations

import json
import shutil

import pytest
from torch.utils.data import ConcatDataset

import shardkit
from helpers.versioned import write_images
from shardkit import ShardDataset, ShardSampler
from shardkit.errors import OptionError

SEED = 3
GONE = ["cat/s0_1.jpg", "cat/s0_4.jpg", "dog/s0_2.jpg"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Version 1: 11 records, one a shard; 2: two appended; 3: three of version 1's deleted."""
    root = tmp_path_factory.mktemp("across")
    src, out = root / "src", root / "out"
    write_images(src, 0, {"cat": 6, "dog": 5})
    shardkit.pack(src, out, shard_size=4000, workers=1, progress=False)
    write_images(src, 1, {"cat": 2})
    shardkit.pack(src, out, append=True, workers=1, progress=False)
    shardkit.update(out, delete=GONE)
    assert ShardDataset(out).version == 3
    return out


def _interleave(lists):
    return [x for step in zip(*lists) for x in step]


def _saved_run(out, consumed, **kw):
    """A 2-rank run over version 1 that consumed ``consumed`` samples a rank: its state (through
    JSON) and the keys it had not consumed, in the epoch's global order."""
    old = ShardDataset(out, version=1, **kw)
    ranks = [ShardSampler(old, num_replicas=2, rank=r, seed=SEED) for r in range(2)]
    sequence = _interleave([list(s) for s in ranks])  # 11 records: 6 places a rank, 1 padding
    state = json.loads(json.dumps(ranks[0].state_dict(consumed=consumed)))
    return state, [old.key(i) for i in sequence[2 * consumed:len(old)]]


def _resumed(ds, state, world, **kw):
    ranks = [ShardSampler(ds, num_replicas=world, rank=r, seed=SEED) for r in range(world)]
    for sampler in ranks:
        sampler.load_state_dict(state, **kw)
    return ranks


def test_a_state_resumes_on_the_records_both_versions_share(store):
    state, rest = _saved_run(store, 3)
    expected = [k for k in rest if k not in GONE]
    assert 0 < len(expected) < len(rest)  # some of the rest was deleted, some is left
    ds = ShardDataset(store)
    with pytest.raises(OptionError, match=r"saved store_version=\[1\], this sampler has \[3\] "
                       r".*version=N.*across_versions=True") as refused:
        ShardSampler(ds, num_replicas=2, rank=0, seed=SEED).load_state_dict(state)
    assert "\n" not in str(refused.value)
    one = _resumed(ds, state, 1, across_versions=True)[0]
    assert len(one) == len(expected) and [ds.key(i) for i in one] == expected
    two = _resumed(ds, state, 2, across_versions=True)
    lists = [list(s) for s in two]
    per_rank = -(-len(expected) // 2)  # padded to equal counts, as DistributedSampler
    assert [len(s) for s in two] == [len(x) for x in lists] == [per_rank, per_rank]
    assert [ds.key(i) for i in _interleave(lists)[:len(expected)]] == expected
    # Saved in the bridged epoch (1 sample a rank consumed), at 2 ranks: resumes at 1 rank and
    # at 2, without asking again, on the rest of the same bridge.
    bridged = json.loads(json.dumps(two[1].state_dict(consumed=1)))
    assert bridged["store_version"] == [3] and bridged["position"] == 2
    again = _resumed(ds, bridged, 1)[0]
    assert len(again) == len(expected) - 2 and [ds.key(i) for i in again] == expected[2:]
    lists = [list(s) for s in _resumed(ds, bridged, 2)]
    assert [ds.key(i) for i in _interleave(lists)[:len(expected) - 2]] == expected[2:]
    # The epochs after it are this version's own order (in the saved run's partition, as
    # after any resume: that of 2 ranks).
    again.set_epoch(state["epoch"] + 1)
    fresh = [ShardSampler(ds, num_replicas=2, rank=r, seed=SEED) for r in range(2)]
    for sampler in fresh:
        sampler.set_epoch(state["epoch"] + 1)
    assert len(again) == len(ds) and list(again) == _interleave([list(s) for s in fresh])


def test_a_loader_resumes_across_versions(store):
    old = ShardDataset(store, version=1, crop=16)
    loader = old.loader(2, sampler=ShardSampler(old, num_replicas=1, rank=0, seed=SEED))
    order = [old.key(i) for i in loader.sampler]
    batches = iter(loader)
    next(batches), next(batches)
    state = loader.state_dict()
    del batches
    expected = [k for k in order[4:] if k not in GONE]
    assert len(expected) < len(order) - 4
    ds = ShardDataset(store, crop=16)

    def made():
        return ds.loader(2, sampler=ShardSampler(ds, num_replicas=1, rank=0, seed=SEED))

    with pytest.raises(OptionError, match="across_versions=True"):
        made().load_state_dict(state)
    resumed = made()
    resumed.load_state_dict(state, across_versions=True)
    assert len(resumed) == -(-len(expected) // 2)
    images = [image for batch, _ in resumed for image in batch]
    assert len(images) == len(expected)
    for image, key in zip(images, expected):
        assert image.equal(ds[ds.index_of(key)][0]), key
    # A state saved after the bridged epoch's first batch resumes at its second.
    resumed = made()
    resumed.load_state_dict(state, across_versions=True)
    batches = iter(resumed)
    next(batches)
    bridged = resumed.state_dict()
    del batches
    last = made()
    last.load_state_dict(bridged)
    rest = [image for batch, _ in last for image in batch]
    assert len(rest) == len(expected) - 2
    assert all(a.equal(b) for a, b in zip(rest, images[2:]))


def test_what_cannot_be_bridged_is_refused_in_one_line(store, tmp_path):
    state, _ = _saved_run(store, 2)
    # A subset's saved order is not the saved version read whole.
    part = ShardDataset(store, version=1).subset(range(8))
    subset_state = ShardSampler(part, num_replicas=1, rank=0, seed=SEED).state_dict(consumed=2)
    with pytest.raises(OptionError, match="does not resume on version 1 of .* read whole"):
        _resumed(ShardDataset(store), subset_state, 1, across_versions=True)
    # No keys to map by: a ConcatDataset of two stores.
    both = ConcatDataset([ShardDataset(store), ShardDataset(store)])
    with pytest.raises(OptionError, match="needs a sampler over one ShardDataset"):
        _resumed(both, state, 1, across_versions=True)
    # The saved version dropped by gc.
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    shardkit.storelog.gc(str(copy), 1)
    with pytest.raises(OptionError, match=r"version 1 of .*copy, which the state was saved "
                       r"over, is no longer kept \(kept: 3\)") as gone:
        _resumed(ShardDataset(copy), state, 1, across_versions=True)
    assert "\n" not in str(gone.value)
