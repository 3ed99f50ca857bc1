"""``update`` (delete, set_labels, replace), ``add_field`` and ``compact`` of a folder store
packed with aspect-ratio buckets: after each, the store equals a fresh bucketed pack of the
images it then holds (per key: pixels, label, bucket fields; the ``buckets`` counts, of live
records only), ``verify`` passes, and ``BucketSampler`` deals one-bucket batches covering the
live records once."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.bucketgrow import FIRST, MERGED, OPTIONS, SECOND, held, records, write

import shardkit
from shardkit import BucketSampler, ShardDataset
from shardkit.errors import PackOptionError
from shardkit.metadata import MANIFEST_NAME, seal

ALL = FIRST | SECOND
GONE = ["a/a0.png", "b/a1.png", "b/b1.png"]  # both A-shaped images: their bucket empties
# new pixels for two keys: b0 becomes A-shaped (another bucket), c1 another C
NEW = {"a/b0.png": (470, 245), "b/c1.png": (305, 312)}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """FIRST + SECOND packed with buckets, without and with min_bucket_count."""
    root = tmp_path_factory.mktemp("bucket-update")
    write(root / "src", ALL)
    shardkit.pack(root / "src", root / "plain", num_shards=2, **OPTIONS)
    shardkit.pack(root / "src", root / "merged", num_shards=2, **MERGED)
    return root


def _copy(packed, tmp_path, name="plain"):
    out = tmp_path / name
    shutil.copytree(packed / name, out)
    return out


def _fresh(tmp_path, sizes, tag, options=OPTIONS):
    """A fresh bucketed pack of the images ``sizes`` (their pixels as ``write`` makes them)."""
    src, out = tmp_path / f"src-{tag}", tmp_path / f"fresh-{tag}"
    write(src, sizes)
    shardkit.pack(src, out, num_shards=2, **options)
    return out


def _replacing(tmp_path, sizes):
    """A folder of new images for the store's keys: other pixels (``write`` seeds them by key,
    so another size is other pixels)."""
    src = tmp_path / "replace"
    write(src, sizes)
    return src


def _same(out, fresh, relabelled=None):
    got, want = records(out), records(fresh)
    for key, name in (relabelled or {}).items():
        want[key] = (want[key][0], name, want[key][2])
    assert got == want
    assert held(out) == held(fresh)
    assert shardkit.verify(out).ok


def _sampler_covers_live_once(out):
    ds = ShardDataset(out)
    size = [tuple(ds[i][0].shape[-2:]) for i in range(len(ds))]
    sampler = BucketSampler(ds, 2, seed=3, num_replicas=1, rank=0)
    sampler.set_epoch(0)
    seen = []
    for batch in sampler:
        assert len({size[i] for i in batch}) == 1, batch
        seen.extend(batch)
    assert sorted(seen) == list(range(len(ds)))
    return ds


def test_delete_and_set_labels_count_live_records(packed, tmp_path):
    out = _copy(packed, tmp_path)
    done = shardkit.update(out, delete=GONE)
    assert (done.deleted, done.count, done.version) == (3, len(ALL) - 3, 2)
    rest = {k: v for k, v in ALL.items() if k not in GONE}
    fresh = _fresh(tmp_path, rest, "deleted")
    _same(out, fresh)
    assert (192, 320) not in held(out)  # no live record left in A's bucket
    assert sum(held(out).values()) == len(rest)
    ds = _sampler_covers_live_once(out)
    assert {ds.key(i) for i in range(len(ds))} == set(rest)
    relabel = {"a/c0.png": "b", "b/c2.png": "z"}  # z: a class the store lacks
    done = shardkit.update(out, set_labels=relabel)
    assert (done.relabelled, done.version) == (2, 3)
    _same(out, fresh, relabel)
    _sampler_covers_live_once(out)
    # An append after the delete adds the deleted images again, counted with the live ones.
    shardkit.pack(packed / "src", out, append=True, workers=0, progress=False)
    _same(out, packed / "plain", relabel)
    _sampler_covers_live_once(out)


def test_verify_checks_live_bucket_counts(packed, tmp_path):
    """After a delete the manifest's counts are checked against the live records' sizes: one
    moved from a bucket to another (same total) is a fault."""
    out = _copy(packed, tmp_path)
    shardkit.update(out, delete=GONE)
    with open(out / MANIFEST_NAME) as f:
        meta = json.load(f)
    counts = meta["buckets"]["counts"]
    counts[0], counts[1] = counts[0] - 1, counts[1] + 1
    with open(out / MANIFEST_NAME, "w") as f:
        json.dump(seal(meta), f)
    faults = shardkit.verify(out).faults
    assert len(faults) == 1 and "buckets differ from the records' sizes" in faults[0]


def test_replace_places_new_images_by_the_stores_rule(packed, tmp_path):
    out = _copy(packed, tmp_path)
    done = shardkit.update(out, replace=_replacing(tmp_path, NEW), workers=0, progress=False)
    assert (done.replaced, done.count) == (2, len(ALL))
    fresh = _fresh(tmp_path, ALL | NEW, "replaced")
    _same(out, fresh)
    assert held(out) == {(192, 320): 3, (224, 288): 3, (256, 256): 4}  # b0 moved to A's
    _sampler_covers_live_once(out)
    # With min_bucket_count: A's images go to B, where the store's pack merged A.
    merged = _copy(packed, tmp_path, "merged")
    before = shardkit.info(merged)["buckets"]["merged"]
    shardkit.update(merged, replace=tmp_path / "replace", workers=0, progress=False)
    got = records(merged)
    assert got["a/b0.png"][2]["original_size"] == [245, 470]
    assert got["a/b0.png"][2]["target_size"] == [224, 288]
    assert got["b/c1.png"] == records(fresh)["b/c1.png"]
    assert held(merged) == {(224, 288): 6, (256, 256): 4}
    assert shardkit.info(merged)["buckets"]["merged"] == before
    assert shardkit.verify(merged).ok
    # Bucket options given must be the store's, as for an append.
    with pytest.raises(PackOptionError, match="other bucket options.*`bucket_step` 64"):
        shardkit.update(merged, replace=tmp_path / "replace", **dict(MERGED, bucket_step=64))
    assert ShardDataset(merged).version == 2


def test_add_field_reads_with_bucket_sampler(packed, tmp_path):
    out = _copy(packed, tmp_path)
    shardkit.update(out, delete=GONE[:1])
    fresh = _fresh(tmp_path, {k: v for k, v in ALL.items() if k != GONE[0]}, "field")
    done = shardkit.add_field(out, "total", lambda b: [int(x.sum()) for x in b[0]],
                              batch_size=1, progress=False)
    assert (done.version, done.computed) == (3, len(ALL) - 1)
    ds = ShardDataset(out, fields=["total", "target_size"])
    sampler = BucketSampler(ds, 3, seed=0, num_replicas=1, rank=0)
    sampler.set_epoch(0)
    seen = 0
    for images, fields in ds.loader(batch_sampler=sampler):
        assert [int(x.sum()) for x in images] == fields["total"].tolist()
        assert all(list(x.shape[-2:]) == t for x, t in zip(images,
                                                           fields["target_size"].tolist()))
        seen += len(images)
    assert seen == len(ALL) - 1
    _same(out, fresh)


def test_compact_keeps_buckets_and_bucket_fields(packed, tmp_path):
    out = _copy(packed, tmp_path)
    shardkit.update(out, delete=GONE)
    shardkit.update(out, replace=_replacing(tmp_path, NEW), workers=0, progress=False)
    done = shardkit.compact(out, progress=False)
    rest = {k: v for k, v in ALL.items() if k not in GONE} | NEW
    assert (done.count, done.dropped) == (len(rest), len(ALL) + len(NEW) - len(rest))
    _same(out, _fresh(tmp_path, rest, "compacted"))
    with open(out / MANIFEST_NAME) as f:
        meta = json.load(f)
    assert "records" not in meta and meta["settings"]["buckets"]["rule"] == "area"
    assert sum(sum(e["buckets"]["counts"]) for e in meta["shards"]) == len(rest)
    _sampler_covers_live_once(out)
