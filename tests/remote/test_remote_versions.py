"""``shardkit log`` and ``shardkit gc`` of a folder store in object storage: a store made of four
versions by updates and an append lists them as the same operations on a local store do, and
gc deletes exactly the objects only dropped versions name; against a real moto S3 server, with
the fault proxy in front of it."""

from __future__ import annotations

import json

import boto3
import pytest
from helpers.faultproxy import FaultProxy
from helpers.s3server import S3Server, bucket_objects
from helpers.versioned import by_key, write_images

import shardkit
import shardkit.remote.access
from shardkit import ShardDataset, metadata
from shardkit.cli import main
from shardkit.errors import PackError, StoreError
from shardkit.remote.packlock import LOCK_NAME, PackLock
from shardkit.storelog import gc, history


@pytest.fixture(scope="module")
def proxy(s3_env, tmp_path_factory):
    """A moto server with the fault proxy in front: every client here goes through it."""
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("versions-cache")))
    with S3Server() as server, FaultProxy(server.endpoint) as p:
        s3_env.setenv("AWS_ENDPOINT_URL", p.endpoint)  # inherited by the CLI
        p.server = server
        yield p


def both(src, url, local, change) -> None:
    """The same change made to the store at ``url`` and to its local twin."""
    for out in (url, local):
        change(out)


@pytest.fixture(scope="module")
def grown(proxy, tmp_path_factory):
    """Versions 1-4 of a store at a URL (pack, relabel, delete, append) and of its local twin:
    version 3 keeps version 2's labels, version 4 has its own."""
    root = tmp_path_factory.mktemp("versions")
    src, local = root / "src", str(root / "local")
    write_images(src, 0, {"cat": 4, "dog": 3})
    url = f"s3://{proxy.server.new_bucket()}/train"
    both(src, url, local, lambda out: shardkit.pack(src, out, shard_size=30000, workers=1,
                                                    progress=False))
    both(src, url, local, lambda out: shardkit.update(
        out, set_labels={"dog/s0_1.jpg": "eel"}, progress=False))
    both(src, url, local, lambda out: shardkit.update(out, delete=["cat/s0_0.jpg"],
                                                      progress=False))
    (src / "cat" / "s0_0.jpg").unlink()  # else the append packs it again
    write_images(src, 1, {"ant": 2, "dog": 2})
    both(src, url, local, lambda out: shardkit.pack(src, out, append=True, workers=1,
                                                    progress=False))
    return url, local


def copy_of(url: str, proxy) -> str:
    """The store at ``url`` copied, object by object, to a new bucket (a test's own store)."""
    client = boto3.client("s3")
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    new = proxy.server.new_bucket()
    for name in bucket_objects(url):
        client.copy_object(Bucket=new, Key=f"{prefix}/{name}",
                           CopySource={"Bucket": bucket, "Key": f"{prefix}/{name}"})
    return f"s3://{new}/{prefix}"


def put(url: str, name: str, data: bytes) -> None:
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)


def named(manifest: dict) -> set[str]:
    """The objects a version's manifest names (shards and side files)."""
    return {e["file"] for e in manifest["shards"]} | {
        manifest[k]["file"] for k in metadata.SIDE_FILES if k in manifest}


def test_log_of_a_url_store_lists_its_versions_as_a_local_one_does(grown, proxy, capsys):
    url, local = grown
    start = len(proxy.requests)
    listed = history(url)
    # Only the small JSONs are downloaded (besides a listing of versions/): the manifest and
    # each version's.
    under = "/" + url.removeprefix("s3://") + "/"
    gets = [p[len(under):] for m, p in proxy.requests[start:] if m == "GET" and
            p.startswith(under)]
    assert sorted(gets) == [
        "manifest.json", "versions/1.json", "versions/2.json", "versions/3.json",
        "versions/4.json"]
    twin = history(local)
    assert [(v.number, v.count, v.shards, v.change) for v in listed] == \
        [(v.number, v.count, v.shards, v.change) for v in twin]
    assert [v.change for v in listed] == [
        {"kind": "pack"}, {"kind": "update", "deleted": 0, "relabelled": 1},
        {"kind": "update", "deleted": 1, "relabelled": 0},
        {"kind": "append", "added": 4, "classes_added": 1, "skipped": 0}]
    assert [v.count for v in listed] == [7, 7, 7, 11]  # records in its shards
    assert all(v.time and v.time.endswith("Z") for v in listed[1:])
    assert main(["log", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert main(["log", local]) == 0
    # The same lines but for the times.
    assert [line[:6] + line[26:] for line in out] == \
        [line[:6] + line[26:] for line in capsys.readouterr().out.splitlines()]
    assert len(out) == 4
    with pytest.raises(StoreError, match="has no manifest.json: not a shardkit store"):
        history(url + "-none")


def test_gc_deletes_only_what_dropped_versions_name_and_kept_ones_read_the_same(
        grown, proxy, capsys):
    url = copy_of(grown[0], proxy)
    # Objects shardkit did not write (one named like a side file, one like a shard): kept.
    planted = {"notes.txt": b"mine", "labels-00000000deadbeef.npy": b"not a version's",
               "shard-00042.lmdb": b"not a version's either"}
    for name, data in planted.items():
        put(url, name, data)
    before = bucket_objects(url)
    manifests = {n: json.loads(before[f"versions/{n}.json"]) for n in (1, 2, 3, 4)}
    only_dropped = (named(manifests[1]) | named(manifests[2])) - named(manifests[3]) \
        - named(manifests[4])
    # Something real goes (version 1's labels), and what a dropped version shares with a kept
    # one that is not the current one stays (version 2's labels, which version 3 reads).
    shared = manifests[2]["labels"]["file"]
    assert "labels.npy" in only_dropped and shared in named(manifests[3]) - named(manifests[4])
    opened = ShardDataset(url, version=3)  # a reader of a kept version, open during gc
    v3, v4 = by_key(opened), by_key(ShardDataset(url))
    assert main(["gc", url, "--keep", "2"]) == 0
    assert "dropped 2 versions (1, 2)" in capsys.readouterr().err
    after = bucket_objects(url)
    assert set(before) - set(after) == only_dropped | {"versions/1.json", "versions/2.json"}
    assert {n: before[n] for n in after} == after  # nothing written over or added
    assert by_key(opened) == v3
    assert by_key(ShardDataset(url, version=3)) == v3 and by_key(ShardDataset(url)) == v4
    with pytest.raises(StoreError, match="has no version 1"):
        ShardDataset(url, version=1)
    assert [v.number for v in history(url)] == [3, 4]
    assert gc(url, 2) == [] and bucket_objects(url) == after


def test_gc_is_refused_while_another_writer_holds_the_prefix(grown, proxy, capsys, tmp_path,
                                                             monkeypatch):
    url = copy_of(grown[0], proxy)
    before = bucket_objects(url)
    with monkeypatch.context() as m:  # a writer on another machine: its own local claim
        m.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "elsewhere"))
        other = PackLock(url)
        other.acquire()
    try:
        with pytest.raises(PackError, match=f"another pack is writing {url} "):
            gc(url, 1)
        assert main(["gc", url, "--keep", "1"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and LOCK_NAME in err
        assert {n: v for n, v in bucket_objects(url).items() if n != LOCK_NAME} == before
    finally:
        other.release()
    assert gc(url, 1) == [1, 2, 3]  # once it is given back
    start = len(proxy.requests)
    with pytest.raises(StoreError, match="has no manifest.json: not a shardkit store"):
        gc(url + "-none", 1)
    assert [m for m, _ in proxy.requests[start:] if m not in ("GET", "HEAD")] == []


def test_a_failed_delete_is_an_error_naming_the_object(grown, proxy, monkeypatch):
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.05, 0.05))
    url = copy_of(grown[0], proxy)
    path = "/" + url.removeprefix("s3://") + "/labels.npy"
    proxy.answer("DELETE", path, 403, "AccessDenied", times=None)
    try:
        with pytest.raises(StoreError, match=f"cannot delete {url}/labels.npy: .*AccessDenied"):
            gc(url, 1)
    finally:
        proxy.clear()
    assert "labels.npy" in bucket_objects(url)
    assert [v.number for v in history(url)] == [1, 2, 3, 4]  # still listed: run gc again
    assert gc(url, 1) == [1, 2, 3] and "labels.npy" not in bucket_objects(url)
