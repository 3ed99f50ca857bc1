"""What the merging process holds per shard: ``shardkit.merge`` of a two-node pack reads the
shards' done entries one at a time and keeps only what the manifest records of each (its file,
counts, checksum: a few hundred bytes), so a pack of 100,000 shards does not hold every entry
(with its skipped list and slots) at once. Measured with tracemalloc, the peak of Python
allocations during the merge, at two shard counts of the same sources."""

from __future__ import annotations

import os
import tracemalloc

import pytest

import shardkit

from helpers import image_tree

IMAGES = 160


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("merge-memory") / "src")
    image_tree(root, classes=4, per_class=IMAGES // 4, seed=2, sides=(8, 8))
    return root


def merge_peak(src: str, out: str, shards: int) -> int:
    """Bytes of Python allocations at the peak of merging a pack of ``shards`` shards made by
    two nodes, over what was allocated before it."""
    for rank in (0, 1):
        shardkit.pack(src, out, num_shards=shards, size=0, workers=1, num_nodes=2,
                      node_rank=rank, progress=False)
    tracemalloc.start()
    try:
        result = shardkit.merge(out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.count == IMAGES and result.shards == shards
    return peak


def test_merge_holds_a_few_hundred_bytes_a_shard(src, tmp_path):
    few, many = 30, IMAGES
    merge_peak(src, str(tmp_path / "warm"), 2)  # first-use imports and caches, not per shard
    per_shard = (merge_peak(src, str(tmp_path / "many"), many) -
                 merge_peak(src, str(tmp_path / "few"), few)) / (many - few)
    # The manifest's own record of a shard is about 600 bytes as Python objects; every entry
    # held at once added about 1,200 more.
    assert 0 < per_shard < 1024, per_shard
