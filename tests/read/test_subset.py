"""Subsets without repacking: by index, by class (labels kept or remapped), a seeded stratified
fraction and a seeded train/val split; each a picklable, lazy ShardDataset with the same decode
paths, dealt shard by shard by ShardSampler, through fork and spawn workers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import shardkit
from shardkit import ShardSampler
from shardkit.cli import main as cli_main

from helpers import image_tree

CLASSES, PER_CLASS = 4, 12
N = CLASSES * PER_CLASS


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("subset")
    src, out = str(base / "src"), str(base / "store")
    image_tree(src, classes=CLASSES, per_class=PER_CLASS, seed=8)
    assert cli_main(["pack", src, out, "--num-shards", "6", "--size", "16", "-q",
                     "--workers", "1"]) == 0  # the default (mixed) layout
    return out


def _records(ds) -> list[tuple[bytes, int]]:
    return [ds[i] for i in range(len(ds))]


def test_subset_by_indices(store):
    ds = shardkit.ShardDataset(store, output="bytes")
    picks = [40, 3, -1, 3, 17]
    sub = ds.subset(picks)
    assert isinstance(sub, shardkit.ShardDataset) and len(sub) == 5
    assert _records(sub) == [ds[i] for i in picks]
    assert sub.targets.tolist() == [int(ds.targets[i]) for i in picks]
    assert [sub.source_path(i) for i in range(5)] == [ds.source_path(i) for i in picks]
    assert sub.__getitems__([4, 0]) == [ds[17], ds[40]]
    assert sub.classes == ds.classes
    # a subset of a subset composes
    assert _records(sub.subset([0, 4])) == [ds[40], ds[17]]
    with pytest.raises(ValueError, match="indices: 48 is out of range"):
        ds.subset([1, 48])
    with pytest.raises(ValueError, match="indices must be a sequence of integers"):
        ds.subset([1.5])
    with pytest.raises(IndexError):
        sub[5]


def test_subset_by_classes_kept_or_remapped(store):
    ds = shardkit.ShardDataset(store, output="bytes")
    targets = np.asarray(ds.targets)
    kept = ds.subset(classes=["c3", "c1"])
    want = np.flatnonzero(np.isin(targets, [1, 3]))
    assert _records(kept) == [ds[i] for i in want.tolist()]
    assert kept.classes == ds.classes and set(kept.targets.tolist()) == {1, 3}
    remapped = ds.subset(classes=["c3", 1], remap=True)
    assert remapped.classes == ["c1", "c3"] and remapped.class_to_idx == {"c1": 0, "c3": 1}
    assert remapped.targets.tolist() == [0 if t == 1 else 1 for t in targets[want].tolist()]
    assert [y for _, y in _records(remapped)] == remapped.targets.tolist()  # read from shards
    # the batched decode path carries the remapped labels too
    cropped = shardkit.ShardDataset(store, crop=8).subset(classes=["c1", "c3"], remap=True)
    _, labels = shardkit.collate(cropped.__getitems__(list(range(len(cropped)))))
    assert labels.tolist() == remapped.targets.tolist()
    with pytest.raises(ValueError, match="classes: 'dog' is not a class"):
        ds.subset(classes=["dog"])
    with pytest.raises(ValueError, match="remap needs classes"):
        ds.subset([0], remap=True)


def test_fraction_is_seeded_and_stratified(store):
    ds = shardkit.ShardDataset(store, output="bytes")
    a = ds.subset(fraction=0.25, seed=1)
    assert np.bincount(a.targets, minlength=CLASSES).tolist() == [3] * CLASSES
    assert a.targets.tolist() == sorted(a.targets.tolist())  # dataset order (class-sorted)
    b = ds.subset(fraction=0.25, seed=1)
    c = ds.subset(fraction=0.25, seed=2)
    assert _records(a) == _records(b) and _records(a) != _records(c)
    small = ds.subset(classes=["c0", "c2"], fraction=0.5, seed=0)
    assert np.bincount(small.targets, minlength=CLASSES).tolist() == [6, 0, 6, 0]
    with pytest.raises(ValueError, match="fraction must be a number in"):
        ds.subset(fraction=1.5)


def test_split_is_disjoint_stratified_and_seeded(store):
    ds = shardkit.ShardDataset(store, output="bytes")
    train, val = ds.split(val=0.25, seed=3)
    assert len(train) + len(val) == N
    assert np.bincount(val.targets, minlength=CLASSES).tolist() == [3] * CLASSES
    paths = {ds.source_path(i): i for i in range(N)}
    t = {paths[train.source_path(i)] for i in range(len(train))}
    v = {paths[val.source_path(i)] for i in range(len(val))}
    assert not t & v and t | v == set(range(N))
    again, _ = ds.split(val=0.25, seed=3)
    other, _ = ds.split(val=0.25, seed=4)
    assert _records(again) == _records(train) != _records(other)


def test_subset_is_lazy_picklable_and_sampled_by_shard(store):
    ds = shardkit.ShardDataset(store, crop=8)
    sub = ds.subset(classes=["c0", "c2"])
    assert sub.store.open_shards == []  # nothing opened to make it
    clone = pickle.loads(pickle.dumps(sub))
    x, y = clone[5]
    assert torch.equal(x, sub[5][0]) and y == sub[5][1]
    # the sampler deals the subset's records shard by shard, and covers them
    lists = [list(ShardSampler(sub, 2, r, seed=0)) for r in range(2)]
    assert sorted(lists[0] + lists[1]) == list(range(len(sub)))
    groups = ShardSampler(sub, 2, 0).groups
    shard_of = np.asarray(sub.store.locate_many(groups.members)[0])
    assert np.array_equal(shard_of, groups.group_of(np.arange(len(sub))))  # grouped right
    for context in ("fork", "spawn"):
        sampler = ShardSampler(sub, 1, 0, seed=2)
        got = list(sub.loader(batch_size=5, sampler=sampler, num_workers=2,
                              multiprocessing_context=context))
        labels = torch.cat([b[1] for b in got]).tolist()
        assert labels == [int(sub.targets[i]) for i in list(sampler)]
        images = torch.cat([b[0] for b in got])
        assert torch.equal(images[3], sub[list(sampler)[3]][0])


def test_fraction_rounds_each_class_and_keeps_one_of_a_small_class(store):
    ds = shardkit.ShardDataset(store, output="bytes")
    targets = np.asarray(ds.targets)
    by_class = [np.flatnonzero(targets == c) for c in range(CLASSES)]
    uneven = ds.subset(np.concatenate([by_class[0], by_class[1][:7], by_class[2][:1]]))
    assert np.bincount(uneven.targets, minlength=CLASSES).tolist() == [12, 7, 1, 0]
    # round(0.3 * n): 3.6 -> 4 (floor 3), 2.1 -> 2, 0.3 -> 0 but at least 1; c3 is absent
    share = uneven.subset(fraction=0.3, seed=5)
    assert np.bincount(share.targets, minlength=CLASSES).tolist() == [4, 2, 1, 0]


def test_remap_of_a_remapped_subset_composes(store):
    ds = shardkit.ShardDataset(store, output="bytes")
    targets = np.asarray(ds.targets)
    first = ds.subset(classes=["c1", "c2", "c3"], remap=True)  # c1, c2, c3 -> 0, 1, 2
    second = first.subset(classes=["c3", "c1"], remap=True)   # c1, c3 -> 0, 1
    want = np.flatnonzero(np.isin(targets, [1, 3]))
    assert second.classes == ["c1", "c3"] and second.class_to_idx == {"c1": 0, "c3": 1}
    assert second.targets.tolist() == [0 if t == 1 else 1 for t in targets[want].tolist()]
    assert [y for _, y in _records(second)] == second.targets.tolist()  # read from shards
    kept = first.subset(classes=["c3"])  # no remap: the first remap's labels stay
    assert kept.classes == ["c1", "c2", "c3"] and set(kept.targets.tolist()) == {2}
    assert {y for _, y in _records(kept)} == {2}


def test_store_view_keeps_its_old_import_path() -> None:
    """``shardkit.read.view`` (the old module name) still gives the store view for a release;
    ``shardkit.View`` is the view recipe."""
    import shardkit
    from shardkit.read import storeview, view

    assert view.StoreView is storeview.StoreView and view.open_layout is storeview.open_layout
    assert shardkit.View is not view.StoreView
