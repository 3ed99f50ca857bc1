"""The pack's mixed record layout: every shard a uniform class mix, the logical order
(ds[i], targets, source_path) exactly the source order; --order source keeps shards in source
order; the sampler over the default pack is class-balanced per rank (chi-square)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import torch

import shardkit
from shardkit import ShardSampler
from shardkit.cli import main as cli_main
from shardkit.errors import StoreError

from helpers import image_tree

CLASSES, PER_CLASS, SHARDS = 6, 20, 12


def chi_square_p(counts: np.ndarray, expected: np.ndarray) -> float:
    """P-value of Pearson's chi-square statistic (upper tail, df = classes - 1)."""
    stat = float(((counts - expected) ** 2 / expected).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    base = tmp_path_factory.mktemp("layout")
    src = str(base / "src")
    image_tree(src, classes=CLASSES, per_class=PER_CLASS, seed=3)
    with open(os.path.join(src, "c2", "broken.jpg"), "wb") as f:  # skipped: leaves no record
        f.write(b"not an image")
    out = {"src": src}
    for name, extra in (("mixed", []), ("again", []), ("seed7", ["--layout-seed", "7"]),
                        ("source", ["--order", "source"])):
        out[name] = str(base / name)
        assert cli_main(["pack", src, out[name], "--num-shards", str(SHARDS), "--size", "16",
                         "-q", "--workers", "1", *extra]) == 0
    return out


def _shard_labels(store) -> list[np.ndarray]:
    ds = shardkit.ShardDataset(store)
    return [np.array(ds.store.shard(k).labels) for k in range(len(ds.store.shards))]  # copies


def test_every_shard_is_a_uniform_class_mix(packed):
    n = CLASSES * PER_CLASS
    share = np.full(CLASSES, PER_CLASS / n)
    for k, labels in enumerate(_shard_labels(packed["mixed"])):
        counts = np.bincount(labels, minlength=CLASSES)
        # each class within 1.5 records of its share of the shard (keys are stratified)
        assert np.all(np.abs(counts - share * len(labels)) <= 1.5), (k, counts)
    # today's layout, for contrast: each shard holds one or two classes
    for labels in _shard_labels(packed["source"]):
        assert len(np.unique(labels)) <= 2


def test_logical_order_is_the_source_order(packed):
    mixed = shardkit.ShardDataset(packed["mixed"], output="bytes")
    source = shardkit.ShardDataset(packed["source"], output="bytes")
    n = CLASSES * PER_CLASS
    assert len(mixed) == len(source) == n  # the broken file left no record in either
    assert np.array_equal(mixed.targets, source.targets)
    assert mixed.classes == source.classes and mixed.class_to_idx == source.class_to_idx
    assert all(mixed[i] == source[i] for i in range(n))
    assert [mixed.source_path(i) for i in range(n)] == [source.source_path(i) for i in range(n)]
    picks = [5, n - 1, 0, 37, 37, -1, -n]
    assert mixed.__getitems__(picks) == source.__getitems__(picks)
    assert mixed[-1] == source[n - 1]
    with pytest.raises(IndexError):
        mixed[n]
    # the batched decode path, cropped, in worker processes
    cropped = shardkit.ShardDataset(packed["mixed"], crop=8)
    plain = shardkit.ShardDataset(packed["source"], crop=8)
    for context in ("fork", "spawn"):
        order = list(range(n))[::-1]
        got = [b for b in cropped.loader(batch_size=16, sampler=order, num_workers=2,
                                         multiprocessing_context=context)]
        want = [b for b in plain.loader(batch_size=16, sampler=order)]
        for (xa, ya), (xb, yb) in zip(got, want):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_layout_is_recorded_seeded_and_reproducible(packed):
    def manifest(store):
        with open(os.path.join(store, "manifest.json"), "rb") as f:
            return json.loads(f.read())

    m = manifest(packed["mixed"])
    assert m["format_version"] == 3 and m["layout"]["order"] == "mixed" and m["layout"]["seed"] == 0
    assert "layout" not in manifest(packed["source"])
    assert manifest(packed["source"])["format_version"] == 1  # as stores packed before
    assert not os.path.exists(os.path.join(packed["source"], "layout.npy"))

    def digest(store):
        return {name: hashlib.sha256(open(os.path.join(store, name), "rb").read()).hexdigest()
                for name in sorted(os.listdir(store))}

    assert digest(packed["mixed"]) == digest(packed["again"])  # same seed: byte-identical
    other = _shard_labels(packed["seed7"])
    assert any(not np.array_equal(a, b) for a, b in zip(other, _shard_labels(packed["mixed"])))
    layout = np.load(os.path.join(packed["mixed"], "layout.npy"))
    n = CLASSES * PER_CLASS
    assert layout.shape == (2, n) and layout.dtype == np.int64
    assert np.array_equal(layout[1][layout[0]], np.arange(n))  # rows are inverse permutations


def test_damaged_layout_is_refused(packed, tmp_path):
    bad = str(tmp_path / "bad")
    shutil.copytree(packed["mixed"], bad)
    path = os.path.join(bad, "layout.npy")
    layout = np.load(path)
    layout[:, [0, 1]] = layout[:, [1, 0]]  # two records swapped: valid-looking, wrong
    np.save(path, layout)
    ds = shardkit.ShardDataset(bad)
    with pytest.raises(StoreError, match="layout.npy: file is damaged or replaced"):
        ds[0]
    os.unlink(path)
    with pytest.raises(StoreError, match="not found: .*layout.npy"):
        shardkit.ShardDataset(bad)[0]


def test_pack_refuses_a_bad_order(packed, tmp_path):
    with pytest.raises(ValueError, match="`order` must be one of 'mixed', 'source'"):
        shardkit.pack(packed["src"], str(tmp_path / "x"), num_shards=2, order="random")
    with pytest.raises(ValueError, match="`layout_seed` must be an integer >= 0"):
        shardkit.pack(packed["src"], str(tmp_path / "x"), num_shards=2, layout_seed=-1)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_each_rank_is_class_balanced_on_the_default_pack(packed, world):
    n = CLASSES * PER_CLASS
    for store, balanced in ((packed["mixed"], True), (packed["source"], False)):
        ds = shardkit.ShardDataset(store)
        targets = np.asarray(ds.targets)
        freq = np.bincount(targets, minlength=CLASSES) / n
        ps = []
        for r in range(world):
            sampler = ShardSampler(ds, world, r, seed=11)
            counts = np.bincount(targets[list(sampler)], minlength=CLASSES)
            ps.append(chi_square_p(counts, freq * counts.sum()))
        if balanced:
            assert min(ps) > 0.05, ps
        else:  # today's layout: each rank sees only the classes of its own shards
            assert min(ps) < 0.01, ps


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_each_rank_is_class_balanced_on_a_single_file_store(packed, tmp_path, fmt):
    """The default pack into one file is one shard in source (class-sorted) order: the sampler
    shuffles within the shard too, so no rank reads one contiguous, class-sorted slice of it."""
    out = str(tmp_path / f"one.{'h5' if fmt == 'hdf5' else 'lmdb'}")
    shardkit.pack(packed["src"], out, workers=1, progress=False)
    ds = shardkit.ShardDataset(out)
    targets = np.asarray(ds.targets)
    assert np.all(np.diff(targets) >= 0)  # stored class-sorted: the hard case
    freq = np.bincount(targets, minlength=CLASSES) / len(targets)
    for world in (2, 3, 4):
        ps = []
        for r in range(world):
            counts = np.bincount(targets[list(ShardSampler(ds, world, r, seed=11))],
                                 minlength=CLASSES)
            ps.append(chi_square_p(counts, freq * counts.sum()))
        assert min(ps) > 0.05, (world, ps)


def test_unshuffled_sampler_reads_a_mixed_store_shard_by_shard(packed):
    ds = shardkit.ShardDataset(packed["mixed"])
    order = list(ShardSampler(ds, 1, 0, shuffle=False))
    assert sorted(order) == list(range(len(ds)))
    shards, local = ds.store.locate_many(order)
    places = np.asarray(ds.store.base.starts)[shards] + local
    assert np.array_equal(places, np.arange(len(ds)))  # the physical order, shard by shard
