"""Remote stores (shardkit.remote): upload to and read from a real S3-protocol server (moto).

Every test starts its own server on 127.0.0.1 (``tests/s3server.py``) and counts requests on the
server's side: "downloaded once" means one GET of that object reached the server.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from contextlib import contextmanager

import boto3
import pytest

from helpers.s3server import S3Server, use_dummy_credentials
from shardkit import metadata
from shardkit.errors import PackError, StoreError
from shardkit.remote import (RemoteFolder, ShardCache, Uploader, default_cache_dir,
                             upload_folder_store)
from shardkit.fileutil import sha256_file
from shardkit.read.store import Store

# Fail fast once the server is gone: one botocore attempt per call (shardkit still retries).
FAST = {"config_kwargs": {"retries": {"total_max_attempts": 1}}}
SOURCE = {"classes": 4, "per_class": 8, "seed": 3}  # src and local: tests/remote/conftest.py
SHARDS = 4


@pytest.fixture(scope="module")
def local_store(local) -> str:
    """A real folder store of 4 LMDB shards."""
    return local


@pytest.fixture
def s3(monkeypatch):
    use_dummy_credentials(monkeypatch)
    with S3Server() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)  # inherited by spawned children
        yield server


@pytest.fixture
def url(s3, local_store) -> str:
    """``local_store`` uploaded to a fresh bucket."""
    url = f"s3://{s3.new_bucket()}/train"
    assert upload_folder_store(local_store, url) == 4
    return url


def manifest_of(folder: str) -> dict:
    with open(os.path.join(folder, metadata.MANIFEST_NAME), "rb") as f:
        return metadata.parse_manifest_layout(f.read(), folder)


def key(url: str, name: str) -> str:
    """The server-side request path of object ``name`` under ``url``."""
    return "/" + url.removeprefix("s3://") + "/" + name


def remote_names(url: str) -> set[str]:
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    listing = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return {obj["Key"][len(prefix) + 1:] for obj in listing.get("Contents", [])}


@contextmanager
def running(*procs):
    """Start the processes; on the way out kill any still running (a failed test must not leave
    a child that multiprocessing would wait for at exit)."""
    for p in procs:
        p.daemon = True
        p.start()
    try:
        yield
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()


def same_bytes(a: str, b: str) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


# -- children (module level: spawn imports them) ----------------------------------------------

def _fetch_child(cache: ShardCache, k: int, results) -> None:
    results.put(sha256_file(cache.fetch(k)))


def _hold_child(cache: ShardCache, k: int, conn) -> None:
    path = cache.fetch(k)  # in use until this process ends
    conn.send(path)
    conn.recv()
    conn.send(sha256_file(path))


def _cycle_child(cache: ShardCache, epochs: int, results) -> None:
    shards = cache.remote.meta["shards"]
    for _ in range(epochs):
        for k in range(len(shards)):
            path = cache.fetch(k)
            results.put(sha256_file(path) == shards[k]["sha256"])
            cache.release(k)


def _killed_uploader(url: str, local: str, conn) -> None:
    uploader = Uploader(url)
    for entry in manifest_of(local)["shards"][:2]:
        uploader.put_shard(os.path.join(local, entry["file"]), entry["file"], entry["sha256"],
                           entry["bytes"])
    conn.send("two shards up")
    conn.recv()  # killed here


def _blocked_waiters(path: str) -> int:
    """flock waiters on ``path`` (``->`` lines of /proc/locks): a process blocked on its lock."""
    ino = str(os.stat(path).st_ino)
    with open("/proc/locks") as f:
        return sum(1 for line in f
                   if "->" in line.split() and line.split()[-3].split(":")[-1] == ino)


# -- tests ------------------------------------------------------------------------------------

def test_upload_then_read_back_identical(s3, url, local_store, tmp_path):
    local = manifest_of(local_store)
    assert remote_names(url) == set(os.listdir(local_store))  # no upload records left behind
    puts = [path for method, path in s3.requests if method == "PUT"]
    assert puts[-1] == key(url, "manifest.json")  # the manifest goes up last
    remote = RemoteFolder(url)
    assert remote.meta == local
    cache = ShardCache(remote, tmp_path / "cache")
    for _ in range(2):  # the second pass is served from the cache
        for k, entry in enumerate(local["shards"]):
            path = cache.fetch(k)
            assert same_bytes(path, os.path.join(local_store, entry["file"]))
            cache.release(k)
    assert same_bytes(cache.labels(), os.path.join(local_store, "labels.npy"))
    for entry in local["shards"]:
        assert s3.count("GET", key(url, entry["file"])) == 1


def test_file_url_upload_is_a_plain_folder_store(local_store, tmp_path):
    target = tmp_path / "copy"
    target.mkdir()
    upload_folder_store(local_store, f"file://{target}")
    assert sorted(os.listdir(target)) == sorted(os.listdir(local_store))
    copy, orig = Store(str(target)), Store(local_store)
    assert copy.meta == orig.meta and (copy.labels == orig.labels).all()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_processes_download_a_shard_once(s3, url, tmp_path, method):
    ctx = mp.get_context(method)
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache")
    name = cache.remote.meta["shards"][1]["file"]
    s3.hold(key(url, name))  # the first download stays in flight ...
    results = ctx.Queue()
    procs = [ctx.Process(target=_fetch_child, args=(cache, 1, results)) for _ in range(2)]
    with running(*procs):
        try:
            s3.hold_reached.wait()
            # ... until the other process is blocked on the shard's download lock (or, without
            # the lock, has sent a second GET).
            while not (os.path.exists(cache.side_file(name, "dl"))
                       and _blocked_waiters(cache.side_file(name, "dl")) >= 1) \
                    and s3.count("GET", key(url, name)) < 2:
                assert all(p.is_alive() for p in procs), [p.exitcode for p in procs]
                time.sleep(0.01)
        finally:
            s3.release()
        for p in procs:
            p.join()
            assert p.exitcode == 0
    assert [results.get() for _ in procs] == [cache.remote.meta["shards"][1]["sha256"]] * 2
    assert s3.count("GET", key(url, name)) == 1


def test_cache_limit_evicts_least_recent_never_in_use(s3, url, local_store, tmp_path):
    remote = RemoteFolder(url)
    shards = remote.meta["shards"]
    largest = max(e["bytes"] for e in shards)
    cache = ShardCache(remote, tmp_path / "cache", cache_limit=2 * largest + largest // 2)

    def cached() -> set[int]:
        return {k for k in range(len(shards)) if os.path.exists(cache.path(k))}

    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    holder = ctx.Process(target=_hold_child, args=(cache, 0, child))
    with running(holder):
        assert parent.recv() == cache.path(0)  # shard 0: fetched first (least recent), in use
        for k in (1, 2, 3):
            cache.fetch(k)
            cache.release(k)
        assert cached() == {0, 3}  # 1 and 2 were evicted; 0, older still, is in use
        parent.send("done")
        assert parent.recv() == shards[0]["sha256"]
        holder.join()
        assert holder.exitcode == 0
    cache.fetch(1)  # 0 is free now and least recent: it goes
    assert cached() == {1, 3}
    assert sum(os.path.getsize(cache.path(k)) for k in cached()) <= cache.cache_limit
    assert [s3.count("GET", key(url, e["file"])) for e in shards] == [1, 2, 1, 1]
    assert same_bytes(cache.path(1), os.path.join(local_store, shards[1]["file"]))


def test_eviction_under_load_never_removes_a_shard_being_read(s3, url, tmp_path):
    remote = RemoteFolder(url)
    largest = max(e["bytes"] for e in remote.meta["shards"])
    cache = ShardCache(remote, tmp_path / "cache", cache_limit=2 * largest + largest // 2)
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_cycle_child, args=(cache, 3, results)) for _ in range(3)]
    with running(*procs):
        for p in procs:
            p.join()
            assert p.exitcode == 0  # a shard deleted while in use: FileNotFoundError in a child
    assert all(results.get() for _ in range(3 * 3 * len(remote.meta["shards"])))
    gets = sum(s3.count("GET", key(url, e["file"])) for e in remote.meta["shards"])
    assert gets > len(remote.meta["shards"])  # the limit forced evictions and downloads again


def test_cache_limit_smaller_than_a_shard_is_refused(url, tmp_path):
    with pytest.raises(ValueError, match="cache_limit"):
        ShardCache(RemoteFolder(url), tmp_path / "cache", cache_limit=1000)


def test_damaged_or_missing_object_raises_store_error(s3, url, tmp_path):
    remote = RemoteFolder(url)
    cache = ShardCache(remote, tmp_path / "cache")
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3")
    name = remote.meta["shards"][2]["file"]
    body = bytearray(client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read())
    body[len(body) // 2] ^= 0xFF  # same size, one byte different
    client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=bytes(body))
    before = s3.count("GET", key(url, name))
    with pytest.raises(StoreError, match=f"{url}/{name}: object is damaged"):
        cache.fetch(2)
    assert s3.count("GET", key(url, name)) - before == 3  # retried, then refused
    assert not [n for n in os.listdir(cache.folder) if n == name or n.endswith(".part")]

    missing = remote.meta["shards"][3]["file"]
    client.delete_object(Bucket=bucket, Key=f"{prefix}/{missing}")
    with pytest.raises(StoreError, match=f"{url}/{missing}: object not found"):
        cache.fetch(3)
    assert s3.count("GET", key(url, missing)) == 1  # missing is final: not retried


def test_server_gone_warm_cache_serves_the_next_epoch(s3, url, local_store, tmp_path):
    remote = RemoteFolder(url, FAST)
    cache = ShardCache(remote, tmp_path / "cache")
    shards = remote.meta["shards"]
    for k, entry in enumerate(shards):  # epoch 1, prefetching the next shard
        path = cache.fetch(k)
        if k + 1 < len(shards):
            cache.prefetch(k + 1)
            cache.wait_read_ahead()
            assert os.path.exists(cache.path(k + 1))
        assert same_bytes(path, os.path.join(local_store, entry["file"]))
        cache.release(k)
    assert [s3.count("GET", key(url, e["file"])) for e in shards] == [1, 1, 1, 1]
    s3.stop()
    for k, entry in enumerate(shards):  # epoch 2: no server
        assert same_bytes(cache.fetch(k), os.path.join(local_store, entry["file"]))
    with pytest.raises(StoreError, match=f"{url}/{shards[0]['file']}: .*gave up after 3"):
        ShardCache(remote, tmp_path / "cold").fetch(0)
    with pytest.raises(StoreError, match=f"{url}/manifest.json: .*gave up after 3"):
        RemoteFolder(url, FAST)


def test_server_that_stops_answering_raises_store_error(s3, url, tmp_path):
    quick = {"config_kwargs": {"connect_timeout": 1, "read_timeout": 1,
                               "retries": {"total_max_attempts": 1}}}
    cache = ShardCache(RemoteFolder(url, quick), tmp_path / "cache")
    cache.fetch(0)
    name = cache.remote.meta["shards"][1]["file"]
    s3.hold(key(url, name))  # every GET of shard 1 now waits forever for an answer
    stalled = f"{url}/{name}: the endpoint stopped answering.*ReadTimeoutError.*gave up after 3"
    with pytest.raises(StoreError, match=stalled):
        cache.fetch(1)
    assert s3.count("GET", key(url, name)) == 3
    assert not os.path.exists(cache.path(1))


def test_killed_upload_leaves_no_store_and_resume_skips_uploaded_shards(s3, local_store,
                                                                         tmp_path):
    url = f"s3://{s3.new_bucket()}/train"
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_killed_uploader, args=(url, local_store, child))
    with running(proc):
        assert parent.recv() == "two shards up"
        os.kill(proc.pid, signal.SIGKILL)
    with pytest.raises(StoreError, match=f"{url} has no manifest.json"):
        RemoteFolder(url)

    assert upload_folder_store(local_store, url, resume=True) == 2
    shards = manifest_of(local_store)["shards"]
    assert [s3.count("PUT", key(url, e["file"])) for e in shards] == [1, 1, 1, 1]
    assert remote_names(url) == set(os.listdir(local_store))
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache")
    for k, entry in enumerate(shards):
        assert same_bytes(cache.fetch(k), os.path.join(local_store, entry["file"]))


def test_upload_refuses_an_existing_store_unless_overwrite(s3, url, local_store):
    with pytest.raises(PackError, match="already holds a store"):
        upload_folder_store(local_store, url)
    assert upload_folder_store(local_store, url, overwrite=True) == 4
    assert RemoteFolder(url).meta == manifest_of(local_store)


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("SHARDKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "shardkit")
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == str(tmp_path / "mine")
