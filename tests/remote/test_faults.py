"""Remote stores through a faulty network (``helpers.faultproxy`` in front of a real moto S3
server): stalls with one deadline per shard, damaged and cut-short transfers, uploads verified by
SHA-256, errors that say what happened, local cache faults, --overwrite and missing buckets."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading

import boto3
import numpy as np
import pytest

import shardkit
import shardkit.remote.access
from helpers.faultproxy import FaultProxy
from helpers.s3server import S3Server, bucket_objects
from helpers.s3server import folder_files as files
from shardkit import ShardDataset, metadata
from shardkit.errors import PackError, StoreError
from shardkit.fileutil import sha256_file
from shardkit.remote import RemoteFolder, ShardCache, upload_folder_store

SOURCE = {"classes": 3, "per_class": 6, "seed": 31}  # src and local: tests/remote/conftest.py
SHARDS = 3
QUICK = {"config_kwargs": {"connect_timeout": 2, "read_timeout": 1,
                           "retries": {"total_max_attempts": 1}}}


@pytest.fixture(scope="module")
def server(s3_env):
    with S3Server() as s3:  # no AWS_ENDPOINT_URL: each test's clients go through the proxy
        yield s3


@pytest.fixture
def proxy(server, monkeypatch):
    """The proxy in front of the server; every client of the test goes through it."""
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.05, 0.05))
    with FaultProxy(server.endpoint) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
        yield p


@pytest.fixture
def url(server, proxy, local) -> str:
    url = f"s3://{server.new_bucket()}/train"
    upload_folder_store(local, url)
    return url


def key(url: str, name: str) -> str:
    return "/" + url.removeprefix("s3://") + "/" + name


def stored(server: S3Server, url: str) -> dict[str, bytes]:
    """Every object under ``url``, read straight from the server (boto3, no proxy)."""
    return bucket_objects(url, server.endpoint)


def shard_files(folder: str) -> list[str]:
    with open(os.path.join(folder, metadata.MANIFEST_NAME), "rb") as f:
        return [e["file"] for e in metadata.parse_manifest_layout(f.read(), folder)["shards"]]


# -- downloads --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["reset", "truncate", "flip"])
def test_a_damaged_transfer_is_downloaded_again_never_cached(proxy, url, local, tmp_path, kind):
    name = shard_files(local)[1]
    size = os.path.getsize(os.path.join(local, name))
    proxy.add("GET", key(url, name), kind, at=size // 2)
    cache = ShardCache(RemoteFolder(url, QUICK), tmp_path / "cache")
    assert sha256_file(cache.fetch(1)) == sha256_file(os.path.join(local, name))
    assert proxy.count("GET", key(url, name)) == 2
    assert not [n for n in os.listdir(cache.folder) if n.endswith(".part")]
    cache.close()


def test_a_stalled_shard_has_one_deadline_however_many_wait(proxy, url, local, tmp_path):
    """A read-ahead hits the stalled endpoint first; the reader that then needs the shard waits
    for that download and gets its failure: one retry chain (3 GETs), not one per waiter."""
    name = shard_files(local)[1]
    proxy.add("GET", key(url, name), "stall", at=100, times=None)
    cache = ShardCache(RemoteFolder(url, QUICK), tmp_path / "cache")
    cache.read_ahead([1])
    assert proxy.stalled.wait(30)  # the read-ahead's download holds the shard's lock now
    with pytest.raises(StoreError, match=f"{url}/{name}: the endpoint stopped answering or "
                                         "sending data .*gave up after 3 attempts"):
        cache.fetch(1)
    cache.wait_read_ahead()
    assert proxy.count("GET", key(url, name)) == 3
    proxy.release()


# Bytes that keep coming, too slowly (botocore's read timeout, 30 s without a byte, never fires):
# each download is cut at its deadline, set to about 1 s here.
TRICKLE = {"config_kwargs": {"connect_timeout": 2, "read_timeout": 30,
                             "retries": {"total_max_attempts": 1}}}


@pytest.fixture
def short_deadline(monkeypatch):
    monkeypatch.setenv("SHARDKIT_TRANSFER_TIMEOUT", "1")
    monkeypatch.setenv("SHARDKIT_TRANSFER_MIN_RATE", "1e12")


def guarded(call, timeout: float = 60):
    """``call()`` in a thread: its result or exception; a guard against a hang (not a timing)."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still waiting after {timeout} s: a hang"
    return out


def test_a_trickling_download_is_cut_at_its_deadline_and_retried(proxy, url, local, tmp_path,
                                                                 short_deadline):
    name = shard_files(local)[1]
    proxy.add("GET", key(url, name), "trickle", at=100)
    cache = ShardCache(RemoteFolder(url, TRICKLE), tmp_path / "cache")
    out = guarded(lambda: cache.fetch(1))
    assert "error" not in out, out
    assert sha256_file(out["value"]) == sha256_file(os.path.join(local, name))
    assert proxy.trickling.is_set() and proxy.count("GET", key(url, name)) == 2
    cache.close()


def test_a_trickling_manifest_is_cut_at_its_deadline(proxy, url, short_deadline):
    """Opening a store whose manifest GET trickles ends with the deadline's error after the
    retries (3 GETs), not a wait for ever."""
    proxy.add("GET", key(url, "manifest.json"), "trickle", at=100, times=None)
    out = guarded(lambda: RemoteFolder(url, TRICKLE))
    assert isinstance(out.get("error"), StoreError), out
    assert re.match(f"{url}/manifest.json: the download did not finish within its deadline of "
                    "1 s .*gave up after 3 attempts", str(out["error"])), out["error"]
    assert proxy.count("GET", key(url, "manifest.json")) == 3
    proxy.release()


def test_a_shard_that_always_trickles_fails_its_waiters_too(proxy, url, local, tmp_path,
                                                            short_deadline, monkeypatch):
    """The read-ahead's download trickles every time: it gives up after its retries, and the
    reader waiting for it gets that failure (3 GETs in all), naming the shard. Then another
    process holds the shard's download lock and never finishes (a stopped process): a reader
    waits as long as that download's retries could take, then says so."""
    name = shard_files(local)[1]
    proxy.add("GET", key(url, name), "trickle", at=100, times=None)
    cache = ShardCache(RemoteFolder(url, TRICKLE), tmp_path / "cache")
    cache.read_ahead([1])
    assert proxy.trickling.wait(30)  # the read-ahead's download holds the shard's lock now
    out = guarded(lambda: cache.fetch(1))
    assert isinstance(out.get("error"), StoreError), out
    assert re.match(f"{url}/{name}: the download did not finish within its deadline of 1 s .*"
                    "gave up after 3 attempts", str(out["error"])), out["error"]
    guarded(cache.wait_read_ahead)
    assert proxy.count("GET", key(url, name)) == 3
    proxy.release()

    monkeypatch.setenv("SHARDKIT_TRANSFER_TIMEOUT", "0.2")
    fd = os.open(cache.side_file(name, "dl"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        out = guarded(lambda: cache.fetch(1))
    finally:
        os.close(fd)
    assert isinstance(out.get("error"), StoreError), out
    assert f"{url}/{name}: another process has been downloading it into {cache.folder}" in \
        str(out["error"])
    assert proxy.count("GET", key(url, name)) == 3
    cache.close()


def test_errors_name_the_bucket_and_what_to_check(server, proxy, url, tmp_path):
    missing = f"s3://shardkit-no-such-bucket-{os.getpid()}/train"
    with pytest.raises(StoreError, match=f"{missing}: the bucket does not exist .*NoSuchBucket"):
        ShardDataset(missing, cache_dir=tmp_path / "cache")
    bucket = url.removeprefix("s3://").split("/")[0]
    with pytest.raises(StoreError, match=f"s3://{bucket}/elsewhere has no manifest.json"):
        ShardDataset(f"s3://{bucket}/elsewhere", cache_dir=tmp_path / "cache")


def test_credential_errors_are_not_retried(proxy, url, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    before = len(proxy.requests)
    with pytest.raises(StoreError, match="NoCredentialsError.*set credentials") as err:
        ShardDataset(url, cache_dir=tmp_path / "cache")
    assert "gave up" not in str(err.value) and len(proxy.requests) == before
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(StoreError, match="ProfileNotFound") as err:
        ShardDataset(url, cache_dir=tmp_path / "cache")
    assert "gave up" not in str(err.value)


def test_a_cache_folder_removed_while_in_use_is_made_again(url, local, tmp_path):
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    want = ShardDataset(local, output="bytes")
    assert ds[0] == want[0]
    ds.store.cache.wait_read_ahead()
    shutil.rmtree(tmp_path / "cache")
    assert [ds[i] for i in range(len(ds))] == [want[i] for i in range(len(want))]
    ds.close()


_LOCAL_FAULT = textwrap.dedent("""
    import sys
    from shardkit.errors import StoreError
    from shardkit.remote import RemoteFolder, ShardCache
    cache = ShardCache(RemoteFolder(sys.argv[1]), sys.argv[2])
    try:
        cache.fetch(0)
    except StoreError as exc:
        print(exc)
""")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (a private tmpfs mount)")
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_local_cache_faults_name_the_cache_and_are_not_retried(proxy, url, local, tmp_path,
                                                              fault):
    """A cache disk too small for the shard, or mounted read-only: one GET at most, and a
    StoreError naming the cache folder, not the remote object."""
    cache = tmp_path / "cache"
    cache.mkdir()
    size = os.path.getsize(os.path.join(local, shard_files(local)[0]))
    if fault == "full":
        mount = f"mount -t tmpfs -o size={size // 2},mode=0755 tmpfs {cache}"  # private
    else:  # the store's cache folder exists (made by an earlier run), read-only now
        ShardCache(RemoteFolder(url), str(cache))
        mount = f"mount --bind {cache} {cache} && mount -o remount,bind,ro {cache}"
    script = tmp_path / "child.py"
    script.write_text(_LOCAL_FAULT)
    out = subprocess.run(["unshare", "-m", "sh", "-c",
                          f"{mount} && exec {sys.executable} {script} {url} {cache}"],
                         capture_output=True, text=True, timeout=120, env=os.environ)
    assert out.returncode == 0, out.stderr
    message = out.stdout.strip()
    what = "the cache disk is full" if fault == "full" else "read-only"
    assert message.startswith((f"cache {cache}", f"cache file {cache}",
                               f"no space left in {cache}")), message
    assert what in message or "Read-only" in message, message
    assert proxy.count("GET", key(url, shard_files(local)[0])) <= 1


# -- uploads ----------------------------------------------------------------------------------

def test_an_upload_damaged_in_transit_is_sent_again(server, proxy, local):
    """moto keeps whatever bytes arrive; the pack checks what was stored against the SHA-256
    it knows, uploads again, and the stored objects are the local files."""
    url = f"s3://{server.new_bucket()}/train"
    name = shard_files(local)[1]
    proxy.add("PUT", key(url, name), "flip", at=os.path.getsize(os.path.join(local, name)) // 2)
    upload_folder_store(local, url)
    assert proxy.count("PUT", key(url, name)) == 2
    assert stored(server, url) == files(local)


def test_an_upload_damaged_every_time_fails_and_leaves_no_store(server, proxy, local):
    url = f"s3://{server.new_bucket()}/train"
    name = shard_files(local)[0]
    proxy.add("PUT", key(url, name), "flip", at=100, times=None)
    with pytest.raises(StoreError, match=f"{url}/{name}: the stored object is not the uploaded "
                                         "file"):
        upload_folder_store(local, url)
    assert metadata.MANIFEST_NAME not in stored(server, url)


def test_overwrite_with_fewer_shards_leaves_exactly_the_new_store(server, proxy, src, local,
                                                                  tmp_path):
    url = f"s3://{server.new_bucket()}/train"
    upload_folder_store(local, url)
    smaller = str(tmp_path / "smaller")
    shardkit.pack(src, smaller, num_shards=SHARDS - 1, workers=1, progress=False)
    shardkit.pack(src, url, num_shards=SHARDS - 1, workers=1, progress=False, overwrite=True)
    assert stored(server, url) == files(smaller)
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    want = ShardDataset(smaller, output="bytes")
    assert [ds[i] for i in range(len(ds))] == [want[i] for i in range(len(want))]
    ds.close()


def test_pack_to_a_missing_bucket_fails_before_any_work(proxy, src, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "staging"))
    out = f"s3://shardkit-no-such-bucket-{os.getpid()}/train"
    with pytest.raises(PackError, match=f"cannot write to {out}: .*the bucket does not exist"):
        shardkit.pack(src, out, num_shards=2, workers=1, progress=False)
    assert not [m for m, _ in proxy.requests if m == "PUT" and "shard-" in _]
    assert not os.path.exists(tmp_path / "staging") or not any(
        "shard-" in n for _, _, names in os.walk(tmp_path / "staging") for n in names)


def test_pack_cli_to_a_missing_bucket_is_one_line(proxy, src, tmp_path):
    out = f"s3://shardkit-no-such-bucket-{os.getpid()}/train"
    env = os.environ | {"SHARDKIT_CACHE_DIR": str(tmp_path / "staging")}
    run = subprocess.run([sys.executable, "-m", "shardkit.cli", "pack", src, out,
                          "--shard-size", "1MiB"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "the bucket does not exist" in lines[0], run.stderr
    assert np.all([m != "PUT" or "shard-" not in p for m, p in proxy.requests])


def test_a_deeply_nested_remote_manifest_is_a_store_error(server, proxy, tmp_path):
    """The remote manifest goes through the same parser as a local one: deep nesting is a
    StoreError naming the object, not a RecursionError."""
    bucket = server.new_bucket()
    boto3.client("s3", endpoint_url=server.endpoint).put_object(
        Bucket=bucket, Key="train/manifest.json", Body=b'{"a": ' + b"[" * 100000 + b"]" * 100000
        + b"}")
    with pytest.raises(StoreError, match=f"s3://{bucket}/train/manifest.json: metadata nests too "
                                         "deeply"):
        ShardDataset(f"s3://{bucket}/train", cache_dir=tmp_path / "cache")
