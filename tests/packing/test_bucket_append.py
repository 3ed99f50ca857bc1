"""``pack(..., append=True)`` to a folder store packed with aspect-ratio buckets: new images are
placed by the store's rule (with ``min_bucket_count``: the merges its pack made, never merged
again), the new version's ``buckets`` counts the union, and the store equals a fresh pack of
the union; ``BucketSampler`` over it batches one bucket at a time, every record once."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.bucketgrow import FIRST, MERGED, OPTIONS, SECOND, THIRD, held, records, write

import shardkit
from shardkit import BucketSampler, ShardDataset
from shardkit.cli import main
from shardkit.errors import PackOptionError
from shardkit.metadata import MANIFEST_NAME, seal


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """Stores packed from FIRST with and without min_bucket_count, each appended SECOND (no
    bucket options: the store's; the command line's for the store without), and fresh packs
    of the union."""
    root = tmp_path_factory.mktemp("bucket-append")
    src = root / "src"
    write(src, FIRST)
    out = {"plain": root / "plain", "merged": root / "merged"}
    for name, options in (("plain", OPTIONS), ("merged", MERGED)):
        shardkit.pack(src, out[name], num_shards=2, **options)
    merged_before = shardkit.info(out["merged"])["buckets"]["merged"]
    before = records(out["merged"])
    write(src, SECOND)
    added = shardkit.pack(src, out["merged"], append=True, workers=0, progress=False)
    assert main(["pack", str(src), str(out["plain"]), "--append", "-q", "--workers", "0"]) == 0
    fresh = {"plain": root / "fresh-plain", "merged": root / "fresh-merged"}
    for name, options in (("plain", OPTIONS), ("merged", MERGED)):
        shardkit.pack(src, fresh[name], num_shards=2, **options)
    return {"src": src, "out": out, "fresh": fresh, "added": added,
            "before": before, "merged_before": merged_before}


def test_appended_store_equals_a_fresh_pack_of_the_union(grown):
    assert grown["merged_before"] == [[[192, 320], [224, 288]]]  # A was merged into B
    assert grown["added"].count == len(SECOND)
    for name in ("plain", "merged"):
        out, fresh = grown["out"][name], grown["fresh"][name]
        got = records(out)
        assert set(got) == set(FIRST) | set(SECOND)
        assert got == records(fresh), name
        assert held(out) == held(fresh), name
        assert shardkit.verify(out).ok, name
        assert ShardDataset(out).version == 2
    # Without merges each source sits in the bucket it selects; with them A's go to B.
    plain, merged = records(grown["out"]["plain"]), records(grown["out"]["merged"])
    assert plain["b/a1.png"][2]["target_size"] == [192, 320]
    assert merged["b/a1.png"][2]["target_size"] == [224, 288]
    assert merged["b/a1.png"][2]["original_size"] == [250, 480]
    assert merged["a/b3.png"][2]["target_size"] == [224, 288]
    assert merged["a/c3.png"][2]["target_size"] == [256, 256]
    assert held(grown["out"]["merged"]) == {(224, 288): 6, (256, 256): 4}
    assert held(grown["out"]["plain"]) == {(192, 320): 2, (224, 288): 4, (256, 256): 4}
    # The store's own records are as they were.
    assert {k: merged[k] for k in grown["before"]} == grown["before"]
    assert shardkit.info(grown["out"]["merged"])["buckets"]["merged"] == grown["merged_before"]


def test_bucket_sampler_over_the_appended_store(grown):
    ds = ShardDataset(grown["out"]["merged"])
    size = [tuple(ds[i][0].shape[-2:]) for i in range(len(ds))]
    sampler = BucketSampler(ds, 3, seed=1, num_replicas=1, rank=0)
    sampler.set_epoch(0)
    seen = []
    for batch in sampler:
        assert len({size[i] for i in batch}) == 1, batch
        seen.extend(batch)
    assert len(ds) == len(FIRST) + len(SECOND)
    assert sorted(seen) == list(range(len(ds)))  # every record once


def test_append_keeps_the_stores_merges(grown, tmp_path):
    """A third image of A: a fresh pack of the union would give A its own bucket; the append
    puts it in B, where the store put A's records, and merges nothing again."""
    out = tmp_path / "store"
    src = tmp_path / "src"
    write(src, FIRST | SECOND)
    shardkit.pack(src, out, num_shards=2, **MERGED)
    write(src, THIRD)
    shardkit.pack(src, out, append=True, workers=0, progress=False, buckets=256,
                  bucket_step=32, bucket_upscale=True, min_bucket_count=3, encoding="raw")
    got = records(out)
    # 490x255 covers 224x288 at 224x431 (ceil(490 * 224 / 255)); v2's anchor round(71.5) = 72
    assert got["a/a2.png"][2] == {"original_size": [255, 490], "crop_top_left": [0, 72],
                                  "target_size": [224, 288]}
    assert held(out) == {(224, 288): 7, (256, 256): 4}
    assert shardkit.info(out)["buckets"]["merged"] == [[[192, 320], [224, 288]]]
    fresh = tmp_path / "fresh"
    shardkit.pack(src, fresh, num_shards=2, **MERGED)
    assert held(fresh) == {(192, 320): 3, (224, 288): 4, (256, 256): 4}


def test_append_with_other_bucket_options_is_refused(grown, tmp_path):
    out = grown["out"]["merged"]
    for options, named in ((dict(bucket_step=64), "`bucket_step` 64 (the store: 32)"),
                           (dict(min_bucket_count=4), "`min_bucket_count` 4 (the store: 3)"),
                           (dict(min_bucket_count=None, bucket_upscale=None),
                            "`min_bucket_count` None (the store: 3), `bucket_upscale` False "
                            "(the store: True)"),
                           (dict(buckets=320), "`buckets` side=320 (the store: side=256)"),
                           (dict(buckets="sdxl", bucket_step=None, bucket_upscale=None),
                            "`buckets` rule='sdxl' (the store: rule='area');")):
        given = dict(MERGED, **options)
        with pytest.raises(PackOptionError, match="other bucket options") as caught:
            shardkit.pack(grown["src"], out, append=True, **given)
        assert named in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(PackOptionError, match="size"):
        shardkit.pack(grown["src"], out, append=True, size=64, progress=False)
    assert ShardDataset(out).version == 2  # nothing installed


def test_append_to_a_store_without_its_recorded_merges_is_refused(grown, tmp_path):
    """A manifest that names min_bucket_count but not the merges it made cannot place new
    images as the store did: refused in one line, the store left as it was."""
    out = tmp_path / "store"
    shutil.copytree(grown["out"]["merged"], out)
    with open(out / MANIFEST_NAME) as f:
        meta = json.load(f)
    for entry in (meta["settings"]["buckets"], meta["buckets"]):
        del entry["merged"]
    with open(out / MANIFEST_NAME, "w") as f:
        json.dump(seal(meta), f)
    with pytest.raises(PackOptionError, match="with its merged buckets.*repack the union") as e:
        shardkit.pack(grown["src"], out, append=True, progress=False)
    assert "\n" not in str(e.value) and ShardDataset(out).version == 2
