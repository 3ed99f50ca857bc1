"""What a Dask pack's client holds: per shard a few hundred bytes at most (finished shards are
recorded on disk, the manifest is written from a spool file of their records), and nothing per
source (the plan's per-source arrays are files; its mixed layout, the one step that holds every
source at once, runs on a worker). Measured with tracemalloc in the client's process, the peak
of its Python allocations over a whole pack, on a real ``dask scheduler`` + ``dask worker``."""

from __future__ import annotations

import gc
import os
import tracemalloc

import pytest

import shardkit

from helpers import image_tree

pytest.importorskip("distributed")

FEW, MANY = 40, 400  # shards; and sources: MANY, or MANY * SOURCES_FACTOR
SOURCES_FACTOR = 10


def linked_tree(root: str, n: int, classes: int = 20) -> str:
    """``n`` images in ``classes`` class folders: hard links of one 8x8 image per class."""
    image_tree(os.path.join(root, "one"), classes=classes, per_class=1, seed=3, sides=(8, 8))
    for c in sorted(os.listdir(os.path.join(root, "one"))):
        (first,) = os.listdir(os.path.join(root, "one", c))
        os.makedirs(os.path.join(root, "src", c))
        for i in range(c_count := n // classes):
            os.link(os.path.join(root, "one", c, first),
                    os.path.join(root, "src", c, f"{i:06d}{os.path.splitext(first)[1]}"))
        assert c_count
    return os.path.join(root, "src")


@pytest.fixture(scope="module")
def scheduler():
    from helpers.dask_cluster import dask_cluster

    with dask_cluster(1) as (address, _):
        yield address


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    base = tmp_path_factory.mktemp("client-memory")
    return {n: linked_tree(str(base / f"t{n}"), n) for n in (MANY, MANY * SOURCES_FACTOR)}


def client_peak(src: str, out: str, scheduler: str, shards: int) -> int:
    """Bytes of Python allocations in this process at the peak of a Dask pack, over what it
    held before."""
    gc.collect()  # an earlier pack's cycles, freed during this one, would hide its growth
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = shardkit.pack(src, out, num_shards=shards, size=0, engine="dask",
                               scheduler=scheduler, progress=False)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert result.shards == shards
    return peak


def test_the_client_holds_little_per_shard_and_nothing_per_source(trees, scheduler, tmp_path):
    small, large = trees[MANY], trees[MANY * SOURCES_FACTOR]
    client_peak(small, str(tmp_path / "warm"), scheduler, FEW)  # first-use imports and caches
    # The least of three packs each: an allocation of the process's other threads (the Dask
    # client's own, now and then a few MB) only adds (seen in both of two packs once: 150 kB,
    # 42 bytes a source).
    few, many, sources = (min(client_peak(src, str(tmp_path / f"{name}{i}"), scheduler, shards)
                              for i in range(3))
                          for name, src, shards in (("few", small, FEW), ("many", small, MANY),
                                                    ("sources", large, FEW)))
    per_shard = (many - few) / (MANY - FEW)
    per_source = (sources - few) / (MANY * (SOURCES_FACTOR - 1))
    print(f"client: {per_shard:.0f} bytes a shard, {per_source:.1f} a source")
    # With each shard's manifest record held as objects at the merge, the mixed layout computed
    # here and each plan file read whole to hash it: about 850 bytes a shard, 37 a source. Under
    # 16,384 sources (plan_store.CHUNK) a pass's chunk grows with them: about 15 bytes a source.
    assert per_shard < 512, per_shard
    assert per_source < 24, per_source


def test_installing_a_new_store_does_not_parse_its_manifest(trees, tmp_path):
    """The install's clean-up of a killed writer's files (``swap.collect_garbage``) reads the
    manifest's every shard record as objects only when a file of ours is not named in it: a
    fresh store's are all named (the records as objects, about 1.5 KB a shard at the end of a
    pack, were the client's largest growth per shard in its resident set)."""
    from shardkit import swap

    out = str(tmp_path / "out")
    shardkit.pack(trees[MANY], out, num_shards=MANY, size=0, progress=False)
    stray = os.path.join(out, "shard-99999.lmdb")  # a name of ours the manifest does not give
    mine = os.path.join(out, "notes.txt")
    for path in (stray, mine):
        with open(path, "wb") as f:
            f.write(b"x")
    names = sorted(os.listdir(out))
    gc.collect()
    tracemalloc.start()
    try:
        swap.collect_garbage(out)  # the stray file: the manifest parsed, the file deleted
        parsed = tracemalloc.get_traced_memory()[1]
        assert sorted(os.listdir(out)) == sorted(set(names) - {"shard-99999.lmdb"})
        lean = []
        for _ in range(2):  # the least of two: another thread's allocation only adds
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            swap.collect_garbage(out)  # nothing to delete
            lean.append(tracemalloc.get_traced_memory()[1] - base)
        lean = min(lean)
    finally:
        tracemalloc.stop()
    assert sorted(os.listdir(out)) == sorted(set(names) - {"shard-99999.lmdb"})
    print(f"collect_garbage: {parsed / MANY:.0f} bytes a shard parsing, {lean / MANY:.0f} not")
    assert parsed > 1000 * MANY  # what the lean check avoids (a manifest's records as objects)
    assert lean < 600 * MANY, lean / MANY
    assert len(shardkit.ShardDataset(out)) == MANY
