"""What a pack to a URL may touch: the user's objects under the prefix (never deleted; a prefix
holding objects named like a store's files refused without ``overwrite``), and its staging
folder (one pack at a time, keyed by endpoint as well as URL). Against real moto S3 servers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import boto3
import pytest

import shardkit
from helpers import one_line_error, run_cli
from helpers.s3server import S3Server, SeparateMoto, bucket_objects
from helpers.damage import forge_count
from helpers.s3server import folder_files as files
from shardkit import ShardDataset, metadata
from shardkit.errors import PackError, StoreError
from shardkit.packing.staging import staging_path
from shardkit.remote import upload_folder_store

SOURCE = {"classes": 2, "per_class": 4, "seed": 5}  # src and local: tests/remote/conftest.py
SHARDS = 2
# Objects a user keeps under the prefix: named like store files, and not.
USER = {"shard-000017.tar": b"a webdataset shard\n", "labels.csv": b"cat,0\ndog,1\n",
        "layout.png": b"\x89PNG not really", "shard-00001.lmdb.bak": b"a backup",
        "notes.txt": b"keep me"}


@pytest.fixture(scope="module")
def server(s3_env, tmp_path_factory):
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("upload-safety-cache")))
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # inherited by the CLI
        yield s3


def plant(url: str, objects: dict[str, bytes], endpoint: str | None = None) -> None:
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3", endpoint_url=endpoint)
    for name, body in objects.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)


def test_pack_never_deletes_the_users_objects(server, src, local, tmp_path):
    url = f"s3://{server.new_bucket()}/train"
    plant(url, USER)
    before = len(server.requests)
    with pytest.raises(PackError, match=f"^{url} holds objects not written by shardkit that are "
                                        "named like a store's files \\(labels.csv, layout.png, "
                                        "shard-000017.tar\\); .*`overwrite=True`"):
        shardkit.pack(src, url, num_shards=SHARDS, workers=1, progress=False)
    puts = [p for m, p in server.requests[before:] if m == "PUT"]
    assert all("/.shardkit-upload/probe-" in p for p in puts), puts  # no shard was uploaded
    assert bucket_objects(url) == USER
    proc = run_cli("pack", src, url, "--num-shards", str(SHARDS), "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert "labels.csv" in proc.stderr and bucket_objects(url) == USER

    # With overwrite the store is written beside them; every user object stays byte for byte.
    shardkit.pack(src, url, num_shards=SHARDS, workers=1, progress=False, overwrite=True)
    assert bucket_objects(url) == USER | files(local)
    # Replacing that store by a smaller one deletes only what the old manifest named.
    smaller = str(tmp_path / "smaller")
    shardkit.pack(src, smaller, num_shards=1, workers=1, progress=False)
    shardkit.pack(src, url, num_shards=1, workers=1, progress=False, overwrite=True)
    assert bucket_objects(url) == USER | files(smaller)
    assert not os.path.exists(staging_path(url))


def test_a_second_pack_to_the_same_url_is_refused_and_another_endpoint_is_not(
        server, src, local, tmp_path):
    url = f"s3://{server.new_bucket()}/train"
    first = sorted(n for n in files(local) if n.startswith("shard-"))[0]
    reached, go = threading.Event(), threading.Event()

    def hold(path: str) -> None:
        if path == f"/{url.removeprefix('s3://')}/{first}" and not reached.is_set():
            reached.set()  # pack A waits in this PUT
            go.wait()

    server.put_hooks.append(hold)
    cmd = [sys.executable, "-m", "shardkit.cli", "pack", src, url, "--num-shards", str(SHARDS),
           "-q", "--workers", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        assert reached.wait(300), "pack A never uploaded its first shard"
        before = len(server.requests)
        second = run_cli("pack", src, url, "--num-shards", str(SHARDS), "-q")
        assert second.returncode == 1 and one_line_error(second.stderr), second.stderr
        assert f"another pack to {url} is running on this machine" in second.stderr
        assert len(server.requests) == before  # refused before it asked the server anything
        # The same bucket and prefix on another server has a staging folder of its own.
        with SeparateMoto() as other:
            boto3.client("s3", endpoint_url=other.endpoint).create_bucket(
                Bucket=url.removeprefix("s3://").split("/")[0])
            options = {"endpoint_url": other.endpoint}
            assert staging_path(url, options) != staging_path(url)
            shardkit.pack(src, url, num_shards=SHARDS, workers=1, progress=False,
                          storage_options=options)
            assert bucket_objects(url, other.endpoint) == files(local)
    finally:
        server.put_hooks.remove(hold)
        go.set()
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert bucket_objects(url) == files(local)
    assert not os.path.exists(staging_path(url))


# -- the remote manifest: its size asked first, its count checked at open ----------------------

def test_an_oversized_remote_manifest_is_refused_unread(server, tmp_path, monkeypatch):
    monkeypatch.setattr(metadata, "MAX_MANIFEST_BYTES", 4096)  # a small bound, same code
    url = f"s3://{server.new_bucket()}/train"
    plant(url, {metadata.MANIFEST_NAME: b" " * 4097})
    path = f"/{url.removeprefix('s3://')}/{metadata.MANIFEST_NAME}"
    with pytest.raises(StoreError, match=f"^{url}/manifest.json: manifest is implausibly large "
                                         "\\(4097 bytes; at most 4096 are read\\)$"):
        ShardDataset(url, cache_dir=tmp_path / "cache")
    assert server.count("HEAD", path) == 1 and server.count("GET", path) == 0


def test_a_forged_remote_record_count_is_refused_at_open(server, local, tmp_path):
    forged = str(tmp_path / "forged")
    shutil.copytree(local, forged)
    forge_count(forged, 2 ** 40)
    url = f"s3://{server.new_bucket()}/train"
    upload_folder_store(forged, url)
    with pytest.raises(StoreError, match=f"^{url}/manifest.json: manifest says {2 ** 40} "
                                         "records, but labels.npy holds labels of shape \\[8\\]"):
        ShardDataset(url, cache_dir=tmp_path / "cache")
    proc = run_cli("info", url, "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr


# -- local faults name the local folder; requests that cannot succeed are sent once -------------

needs_mount = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                 reason="needs root and unshare (a private tmpfs mount)")


def in_small_tmpfs(folder: str, size: str, *argv: str) -> subprocess.CompletedProcess:
    """``argv`` run with a private ``size`` tmpfs mounted on ``folder`` (a full disk)."""
    mount = f'mount -t tmpfs -o size={size},mode=0700 tmpfs "{folder}" && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", *argv], capture_output=True,
                          text=True, timeout=300, env=os.environ)


@needs_mount
def test_a_full_staging_disk_names_the_staging_folder(server, src, tmp_path):
    url = f"s3://{server.new_bucket()}/train"
    cache = tmp_path / "cache"
    cache.mkdir()
    proc = in_small_tmpfs(str(cache), "8k", "env", f"SHARDKIT_CACHE_DIR={cache}", sys.executable,
                          "-m", "shardkit.cli", "pack", src, url, "--num-shards", "2", "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARDKIT_CACHE_DIR", str(cache))
        staging = staging_path(url)
    assert f"cannot write {url}: no space left in {staging} (the local staging folder; free " \
        "space there, or set SHARDKIT_CACHE_DIR to a folder on another disk); no shard was " \
        "finished, nothing to resume" in proc.stderr


@needs_mount
def test_a_full_disk_while_planning_a_local_out_names_where(src, tmp_path):
    """A local OUT's plan is written beside OUT: a full disk there says so, and that nothing
    is kept (the same handling as a shard's write)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "out"
    proc = in_small_tmpfs(str(disk), "8k", sys.executable, "-m", "shardkit.cli", "pack", src,
                          str(out), "--num-shards", "2", "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert f"cannot write {out}: No space left on device (writing the pack's plan in {disk}); " \
        "no shard was finished, nothing to resume" in proc.stderr, proc.stderr


_FETCH = """
import sys
from shardkit.errors import StoreError
from shardkit.remote import RemoteFolder, ShardCache
try:
    ShardCache(RemoteFolder(sys.argv[1]), sys.argv[2]).fetch(0)
except StoreError as exc:
    print(exc)
"""


@needs_mount
def test_a_full_cache_disk_names_the_cache_folder_and_the_shard(server, local, tmp_path):
    url = f"s3://{server.new_bucket()}/train"
    upload_folder_store(local, url)
    shard = sorted(n for n in files(local) if n.startswith("shard-"))[0]
    cache = tmp_path / "cache"
    cache.mkdir()
    size = os.path.getsize(os.path.join(local, shard))
    proc = in_small_tmpfs(str(cache), str(size // 2), sys.executable, "-c", _FETCH, url,
                          str(cache))
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert message.startswith(f"no space left in {cache}{os.sep}"), message
    assert message.endswith(f"(the cache disk is full) while downloading {url}/{shard}; check "
                            "cache_dir and cache_limit"), message
    assert server.count("GET", f"/{url.removeprefix('s3://')}/{shard}") == 1  # not retried


def test_a_request_the_http_client_refuses_is_sent_once(server, tmp_path):
    url = f"s3://{server.new_bucket()}/train"
    host = server.endpoint.removeprefix("http://")
    before = len(server.requests)
    with pytest.raises(StoreError, match="the HTTP client refused the request .*credentials "
                                         "encoded in URL.*check the endpoint URL") as err:
        ShardDataset(url, cache_dir=tmp_path / "cache",
                     storage_options={"endpoint_url": f"http://user:password@{host}"})
    assert "gave up" not in str(err.value)  # one attempt: the same request is refused again
    assert len(server.requests) == before
