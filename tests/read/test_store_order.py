"""``ds.loader()`` without shuffle reads a class-mixed store shard after shard (the store's order),
not in index order, which visits every shard in every batch; ``ds[i]`` keeps ImageFolder's order."""

from __future__ import annotations

import numpy as np
import pytest

import shardkit
from shardkit.cli import main as cli_main

from helpers import image_tree


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("store-order")
    image_tree(str(base / "src"), classes=4, per_class=6, seed=3)
    out = str(base / "store")  # the default, class-mixed layout
    assert cli_main(["pack", str(base / "src"), out, "--num-shards", "4", "--size", "16", "-q",
                     "--workers", "1"]) == 0
    return out


def _read_order(ds) -> list[int]:
    """The dataset indices of the records a sequential ``ds.loader`` pass delivers, in order,
    told apart by their bytes (every image differs)."""
    index_of = {ds[i][0]: i for i in range(len(ds))}
    loader = ds.loader(batch_size=5, shuffle=False, num_workers=0, collate_fn=list)
    return [index_of[record] for batch in loader for record, _ in batch]


def _switches(ds, indices) -> int:
    shards = ds.store.locate_many(indices)[0]
    return int(np.count_nonzero(np.diff(shards)))


def test_sequential_loader_reads_a_mixed_store_shard_by_shard(mixed):
    ds = shardkit.ShardDataset(mixed, output="bytes")
    assert len(ds.store.shards) == 4 and "layout" in ds.store.base.meta
    assert _switches(ds, np.arange(len(ds))) > 10  # index order hops between the shards
    order = _read_order(ds)
    assert sorted(order) == list(range(len(ds)))  # every record once
    assert _switches(ds, order) == 3              # one shard after another
    assert ds.loader(shuffle=False).sampler.indices().tolist() == order
    # a subset reads its records the same way
    half = ds.subset(fraction=0.5, seed=1)
    order = _read_order(half)
    assert sorted(order) == list(range(len(half))) and _switches(half, order) == 3
    # index order on request; ds[i] is ImageFolder's order either way
    loader = ds.loader(batch_size=5, sampler=range(len(ds)), collate_fn=list)
    assert [r for batch in loader for r, _ in batch] == [ds[i][0] for i in range(len(ds))]
    assert ds.targets.tolist() == sorted(ds.targets.tolist())


def test_sequential_mix_loader_reads_each_part_shard_by_shard(mixed):
    a = shardkit.ShardDataset(mixed, output="bytes")
    b = a.subset(fraction=0.5, seed=2)
    mix = shardkit.Mix([a, b])
    loader = mix.loader(batch_size=5, shuffle=False, num_workers=0, collate_fn=list)
    order = loader.sampler.indices()
    assert sorted(order.tolist()) == list(range(len(mix)))  # every record once
    part_a, part_b = order[order < len(a)], order[order >= len(a)] - len(a)
    assert order[: len(a)].tolist() == part_a.tolist()  # the parts end to end
    assert _switches(a, part_a) == 3 and _switches(b, part_b) == 3
    got = [r for batch in loader for r, _ in batch]
    assert got == [mix[i][0] for i in order.tolist()]
