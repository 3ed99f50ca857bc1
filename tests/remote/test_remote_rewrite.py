"""New pixels for a URL store's keys (``update(url, replace=SRC)``) and its compaction
(``compact(url)``), against a real moto S3 server: each equals the same operation on a local twin
(every record's stored bytes, class and fields, by key), readers of the version before read the
same bytes, a compaction killed while it uploads switches nothing and runs again, and gc after
a compaction leaves only the live shards."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

import shardkit
from helpers.s3server import S3Server, bucket_objects, kill_at_put
from helpers.versioned import write_images
from shardkit import ShardDataset
from shardkit.storelog import gc


@pytest.fixture(scope="module")
def server(s3_env, tmp_path_factory):
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("rewrite-cache")))
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # inherited by the CLI
        yield s3


def with_scores(root, seed: int) -> str:
    """``root``'s images with a ``score`` field each (a metadata file beside them)."""
    path = os.path.join(str(root), "..", f"meta-{seed}.jsonl")
    names = sorted(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
                   for d, _, files in os.walk(root) for f in files)
    with open(path, "w") as f:
        for n, name in enumerate(names):
            f.write(json.dumps({"file_name": name, "score": seed * 100.0 + n}) + "\n")
    return path


def opened(path: str, **options) -> ShardDataset:
    return ShardDataset(path, output="bytes", fields=["score"], **options)


def stored(ds: ShardDataset | str) -> dict[str, tuple[str, str, float]]:
    """Every record of a store as stored, by key: its bytes' SHA-256, class and score."""
    ds = opened(ds) if isinstance(ds, str) else ds
    out = {}
    for i in range(len(ds)):
        data, fields = ds[i]
        out[ds.key(i)] = (hashlib.sha256(data).hexdigest(), ds.classes[ds.targets[i]],
                          float(fields["score"]))
    return out


@pytest.fixture()
def twins(server, tmp_path):
    """A store of 7 records with a field, packed to a new prefix and to a local twin, then
    one record deleted in both (version 2): what each test changes."""
    src = tmp_path / "src"
    write_images(src, 0, {"cat": 4, "dog": 3})
    meta = with_scores(src, 0)
    url, local = f"s3://{server.new_bucket()}/train", str(tmp_path / "local")
    for out in (url, local):
        shardkit.pack(src, out, shard_size=15000, workers=1, progress=False, metadata_file=meta)
        shardkit.update(out, delete=["cat/s0_0.jpg"])
    return url, local, src


def test_replace_at_a_url_equals_the_local_twin_and_keeps_the_version_before(twins, server,
                                                                             tmp_path):
    url, local, _ = twins
    before, v2 = bucket_objects(url), stored(url)
    reader = opened(url)  # version 2, first read after version 3 is in
    new = tmp_path / "new"
    write_images(new, 5, {"cat": 2, "dog": 1})  # the keys of 3 records, new pixels and scores
    os.rename(new / "cat" / "s5_0.jpg", new / "cat" / "s0_1.jpg")
    os.rename(new / "cat" / "s5_1.jpg", new / "cat" / "s0_2.jpg")
    os.rename(new / "dog" / "s5_0.jpg", new / "eel.jpg")  # no key of the store: not packed
    os.makedirs(new / "eel")
    os.rename(new / "eel.jpg", new / "eel" / "s0_0.jpg")
    os.rmdir(new / "dog")
    meta = with_scores(new, 5)
    results = [shardkit.update(out, replace=new, metadata_file=meta, workers=1, progress=False)
               for out in (url, local)]
    assert [(r.version, r.replaced, r.count) for r in results] == [(3, 2, 6)] * 2
    got = stored(url)
    assert got == stored(local)
    assert {k for k in got if got[k] != v2[k]} == {"cat/s0_1.jpg", "cat/s0_2.jpg"}
    assert stored(reader) == v2 == stored(opened(url, version=2))
    objects = bucket_objects(url)
    # Nothing of version 2 written over; the new shard is named after the store's.
    assert {n: objects[n] for n in before if n != "manifest.json"} == \
        {n: b for n, b in before.items() if n != "manifest.json"}
    shards = [e["file"] for e in json.loads(objects["manifest.json"])["shards"]]
    assert shards == [f"shard-{k:05d}.lmdb" for k in range(len(shards))]
    assert set(shards) - set(before) == {shards[-1]}
    assert not any(n.startswith(".shardkit") for n in objects)  # no lock, no upload records


def test_compact_at_a_url_equals_the_local_twin_then_gc_keeps_only_live_shards(twins, server):
    url, local, src = twins
    v2, old = stored(url), json.loads(bucket_objects(url)["manifest.json"])["shards"]
    reader = opened(url)
    results = [shardkit.compact(out, progress=False) for out in (url, local)]
    assert [(r.version, r.count, r.dropped) for r in results] == [(3, 6, 1)] * 2
    assert results[0].shards == results[1].shards
    assert stored(url) == stored(local) == v2
    assert stored(reader) == v2 and reader.version == 2
    manifest = json.loads(bucket_objects(url)["manifest.json"])
    shards = [e["file"] for e in manifest["shards"]]
    first = len(old)  # after the store's: none of version 2's written over
    assert shards == [f"shard-{first + k:05d}.lmdb" for k in range(results[0].shards)]
    assert gc(url, 1) == [1, 2]
    objects = bucket_objects(url)
    named = set(shards) | {manifest[k]["file"] for k in ("labels", "layout")}
    assert set(objects) == named | {"manifest.json", "versions/3.json"}
    assert stored(url) == v2
    # The compacted store grows as its twin does: new shards named after its last.
    write_images(src, 9, {"dog": 2})
    for out in (url, local):
        shardkit.pack(src, out, append=True, workers=1, progress=False,
                      metadata_file=with_scores(src, 9))
    assert stored(url) == stored(local)
    assert [e["file"] for e in json.loads(bucket_objects(url)["manifest.json"])["shards"]][
        len(shards)] == f"shard-{first + len(shards):05d}.lmdb"


def test_a_killed_compaction_switches_nothing_and_runs_again(twins, server):
    """Killed (SIGKILL) while it uploads its labels, its new shards uploaded: every reader
    reads version 2, as it was; run again, it installs what an uninterrupted compaction
    installs."""
    url, local, _ = twins
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    v2, before = stored(url), bucket_objects(url)
    reader = opened(url)
    n = len(json.loads(before["manifest.json"])["shards"])
    labels = f"/{bucket}/{prefix}/labels-"  # its new labels, under a name no version uses
    kill_at_put(server, lambda path: path.startswith(labels), ["compact", url, "-q"],
                "the upload of the compaction's labels", wait=120)
    objects = bucket_objects(url)
    assert objects["manifest.json"] == before["manifest.json"]  # nothing switched
    assert f"shard-{n:05d}.lmdb" in objects  # its first new shard, named by no version
    assert {k: objects[k] for k in before} == before
    for ds in (reader, opened(url)):
        assert ds.version == 2 and stored(ds) == v2
    result = shardkit.compact(url, progress=False)
    twin = shardkit.compact(local, progress=False)
    assert (result.version, result.shards) == (twin.version, twin.shards)
    assert stored(url) == stored(local) == v2 == stored(reader)
    assert not any(n.startswith(".shardkit") for n in bucket_objects(url))
