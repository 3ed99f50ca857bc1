"""A folder store in object storage that grows: ``pack(src, URL, append=True)`` installs the
next version there, ``ShardDataset(URL, version=N)`` reads a kept one, and an append that finds
the store changed since it read it switches nothing; against a real moto S3 server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import boto3
import pytest

import shardkit
from helpers.s3server import S3Server, bucket_objects, kill_at_put
from helpers.versioned import by_key, write_images
from shardkit import ShardDataset
from shardkit.cli import main
from shardkit.errors import PackError


@pytest.fixture(scope="module")
def server(s3_env, tmp_path_factory):
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("append-cache")))
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # inherited by the CLI
        yield s3


def packed(server, tmp_path) -> tuple[str, object]:
    """A store of 2 classes packed to a new prefix (version 1), and its source folder."""
    src = tmp_path / "src"
    write_images(src, 0, {"cat": 4, "dog": 3})
    url = f"s3://{server.new_bucket()}/train"
    shardkit.pack(src, url, shard_size=30000, workers=1, progress=False)
    return url, src


def test_append_to_a_url_equals_a_fresh_pack_and_keeps_version_1(server, tmp_path):
    url, src = packed(server, tmp_path)
    v1 = by_key(ShardDataset(url))
    opened = ShardDataset(url)  # opened at version 1, first read after version 3 is in
    before = set(bucket_objects(url))
    write_images(src, 1, {"ant": 2, "dog": 2})
    first = shardkit.pack(src, url, append=True, workers=1, progress=False)
    write_images(src, 2, {"bee": 2})
    bucket = url.removeprefix("s3://").split("/")[0]
    shards = [f"/{bucket}/train/{n}" for n in sorted(before) if n.startswith("shard-")]
    gets = [server.count("GET", p) for p in shards]
    assert main(["pack", str(src), url, "--append", "-q", "--workers", "1"]) == 0
    # The keys of the shards the first append read are kept here: not downloaded again.
    assert [server.count("GET", p) for p in shards] == gets
    assert first.count == 4
    objects = bucket_objects(url)
    # Nothing of version 1 was deleted or written over.
    assert {n: objects[n] for n in before} == {n: v for n, v in bucket_objects(url).items()
                                               if n in before}
    assert {"versions/1.json", "versions/2.json", "versions/3.json"} <= set(objects)
    assert objects["versions/3.json"] == objects["manifest.json"]
    fresh = tmp_path / "fresh"
    shardkit.pack(src, fresh, shard_size=30000, workers=1, progress=False)
    ds = ShardDataset(url)
    assert ds.version == 3 and ds.classes == ["cat", "dog", "ant", "bee"]
    assert by_key(ds) == by_key(ShardDataset(fresh))  # same records, pixels, classes per key
    assert by_key(ShardDataset(url, version=1)) == v1
    assert len(ShardDataset(url, version=2)) == 11
    assert opened.version == 1 and by_key(opened) == v1
    with pytest.raises(shardkit.errors.StoreError, match="has no version 4"):
        ShardDataset(url, version=4)
    # An overwrite replaces the store with its kept versions: none of their objects is left.
    shardkit.pack(src, url, shard_size=30000, workers=1, progress=False, overwrite=True)
    meta = ShardDataset(url).store.meta
    assert set(bucket_objects(url)) == {"manifest.json", "labels.npy", "layout.npy", *(
        e["file"] for e in meta["shards"])}
    with pytest.raises(shardkit.errors.StoreError, match="has no version 2"):
        ShardDataset(url, version=2)


def test_a_stale_append_is_refused_and_the_store_stays_readable(server, tmp_path):
    """Append B reads the store, then append A (another process, as on another machine: its
    own staging folder) installs version 2 before B takes the prefix's lock."""
    url, src = packed(server, tmp_path)
    other = tmp_path / "other"
    shutil.copytree(src, other)
    write_images(other, 3, {"cat": 2})
    write_images(src, 4, {"dog": 2})
    ran = []

    def install_another_version(path: str) -> None:
        # B has read the store and not locked it yet (the first probe: B's, not A's)
        if ".shardkit-lock-probe-" in path and not ran:
            ran.append(None)
            ran.append(subprocess.run(
                [sys.executable, "-m", "shardkit.cli", "pack", str(other), url, "--append",
                 "-q", "--workers", "1"], capture_output=True, text=True, timeout=300,
                env=dict(os.environ, SHARDKIT_CACHE_DIR=str(tmp_path / "elsewhere"))))

    server.put_hooks.append(install_another_version)
    try:
        with pytest.raises(PackError, match="changed while its next version was made"):
            shardkit.pack(src, url, append=True, workers=1, progress=False)
    finally:
        server.put_hooks.remove(install_another_version)
    assert ran[1].returncode == 0, ran[1].stderr
    ds = ShardDataset(url)  # A's version, whole: B wrote none of its shards over
    assert ds.version == 2 and len(ds) == 9
    assert set(by_key(ds)) == {str(p.relative_to(other)) for p in other.rglob("*.jpg")}
    assert "versions/3.json" not in bucket_objects(url)


def test_a_manifest_replaced_before_the_switch_is_never_switched(server, tmp_path):
    """The manifest is compared again right before the switch: one written meanwhile by
    another tool is left in place."""
    url, src = packed(server, tmp_path)
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3")
    written = client.get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read()
    small = tmp_path / "small"
    shutil.copytree(src, small)
    write_images(small, 9, {"cat": 2})
    write_images(src, 5, {"cat": 16})  # two new shards

    def rewrite_manifest(path: str) -> None:
        if path.startswith(f"/{bucket}/{prefix}/labels-"):  # B's new labels, before its switch
            client.put_object(Bucket=bucket, Key=f"{prefix}/manifest.json", Body=written + b"\n")

    server.put_hooks.append(rewrite_manifest)
    try:
        with pytest.raises(PackError, match="stopped before writing manifest.json, nothing "
                                            "was switched"):
            shardkit.pack(src, url, append=True, workers=1, progress=False)
    finally:
        server.put_hooks.remove(rewrite_manifest)
    assert bucket_objects(url)["manifest.json"] == written + b"\n"
    ds = ShardDataset(url)
    assert ds.version == 1 and len(ds) == 7
    assert "versions/2.json" not in bucket_objects(url)
    # Its two uploaded shards are named by no version and kept as shardkit's own (their upload
    # records): the next appends write over them, one each (another version named the first).
    n = len(ds.store.meta["shards"])
    shardkit.pack(small, url, append=True, workers=1, progress=False)
    assert f".shardkit-upload/shard-{n + 1:05d}.lmdb.json" in bucket_objects(url)
    shardkit.pack(src, url, append=True, workers=1, progress=False)
    ds = ShardDataset(url)
    assert ds.version == 3 and len(ds) == 7 + 2 + 16
    assert not any(n.startswith(".shardkit") for n in bucket_objects(url))


def test_update_of_a_url_store_deletes_and_relabels_as_a_new_version(server, tmp_path):
    url, src = packed(server, tmp_path)
    v1 = by_key(ShardDataset(url))
    gone, moved = sorted(v1)[:2]
    result = shardkit.update(url, delete=[gone], set_labels={moved: "eel"})
    assert (result.version, result.deleted, result.relabelled, result.count) == (2, 1, 1, 6)
    ds = ShardDataset(url)
    assert ds.version == 2 and ds.classes == ["cat", "dog", "eel"]
    assert by_key(ds) == {k: (v[0], "eel" if k == moved else v[1]) for k, v in v1.items()
                          if k != gone}
    assert by_key(ShardDataset(url, version=1)) == v1
    # Classes put in name order at a URL: the same records and class names, other indices.
    renamed = sorted(v1)[2]
    result = shardkit.update(url, set_labels={renamed: "ant"}, relabel=True)
    assert (result.version, result.reordered) == (3, 4)  # cat dog eel ant -> ant cat dog eel
    ds = ShardDataset(url)
    assert ds.classes == ["ant", "cat", "dog", "eel"]
    assert by_key(ds) == {k: (v[0], "ant" if k == renamed else v[1])
                          for k, v in by_key(ShardDataset(url, version=2)).items()}
    assert [int(ds[i][1]) for i in range(len(ds))] == ds.targets.tolist()


def test_a_killed_append_keeps_the_store_and_resume_finishes_it(server, tmp_path):
    """An append killed (SIGKILL) while it uploads its second new shard: the store stays
    version 1 for every reader; a resume with other sources is refused in one line; the resume
    keeps the shard already uploaded and installs the version an uninterrupted append makes."""
    url, src = packed(server, tmp_path)
    bucket = url.removeprefix("s3://").split("/")[0]
    v1, v1_objects = by_key(ShardDataset(url)), bucket_objects(url)
    opened = ShardDataset(url)
    reference, client = f"s3://{bucket}/reference", boto3.client("s3")
    for name, body in v1_objects.items():  # the same store, appended to without a kill
        client.put_object(Bucket=bucket, Key=f"reference/{name}", Body=body)
    write_images(src, 6, {"cat": 8, "eel": 8})  # two new shards
    old = len(opened.store.meta["shards"])
    first, second = (f"/{bucket}/train/shard-{old + k:05d}.lmdb" for k in range(2))
    kill_at_put(server, lambda path: path == second,  # its first new shard uploaded
                ["pack", str(src), url, "--append", "-q", "--workers", "1"],
                "the upload of the append's second new shard", wait=120)
    assert server.count("PUT", first) == 1
    assert ".shardkit-lock.json" in bucket_objects(url)  # the killed append's: taken over
    for ds in (ShardDataset(url), opened):  # version 1, as it was
        assert ds.version == 1 and by_key(ds) == v1
    other = tmp_path / "other"
    shutil.copytree(src, other)
    write_images(other, 7, {"eel": 1})
    # Other sources, or other settings: refused in one line, the kept shard untouched.
    for args, options in ((other, {}), (src, {"shard_size": 20000})):
        with pytest.raises(PackError, match="cannot resume: .*; run it again without "
                                            "`resume=True` to start over$") as refused:
            shardkit.pack(args, url, append=True, resume=True, workers=1, progress=False,
                          **options)
        assert "\n" not in str(refused.value)
    assert main(["pack", str(src), url, "--append", "--resume", "-q", "--workers", "1"]) == 0
    assert server.count("PUT", first) == 1  # kept, not packed or uploaded again
    shardkit.pack(src, reference, append=True, workers=1, progress=False)
    got, want = ShardDataset(url), ShardDataset(f"s3://{bucket}/reference")
    assert got.version == want.version == 2
    assert by_key(got) == by_key(want)
    assert got.store.meta["shards"] == want.store.meta["shards"]
    assert [server.count("PUT", f"/{bucket}/train/{e['file']}")
            for e in got.store.meta["shards"]] == [1] * old + [1, 2]  # the one in flight, again
    objects = bucket_objects(url)  # version 1's objects, as they were (the switch aside)
    assert {n: objects[n] for n in v1_objects if n != "manifest.json"} == \
        {n: b for n, b in v1_objects.items() if n != "manifest.json"}
    assert not any(n.startswith(".shardkit") for n in objects)  # no lock, no upload records
    assert opened.version == 1 and by_key(opened) == v1 == by_key(ShardDataset(url, version=1))


def test_an_append_never_writes_over_an_object_shardkit_did_not_write(server, tmp_path):
    """An object at the name the next new shard takes, with no upload record (not a killed
    append's): the append stops before writing it; the store stays version 1."""
    url, src = packed(server, tmp_path)
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    n = len(ShardDataset(url).store.meta["shards"])
    foreign = f"{prefix}/shard-{n:05d}.lmdb"
    boto3.client("s3").put_object(Bucket=bucket, Key=foreign, Body=b"the user's own")
    write_images(src, 8, {"cat": 2})
    with pytest.raises(PackError, match=f"{url}/shard-{n:05d}.lmdb exists and was not "
                                        "written by shardkit"):
        shardkit.pack(src, url, append=True, workers=1, progress=False)
    assert server.count("PUT", f"/{bucket}/{foreign}") == 1  # the user's own PUT only
    assert bucket_objects(url)[f"shard-{n:05d}.lmdb"] == b"the user's own"
    assert ShardDataset(url).version == 1
