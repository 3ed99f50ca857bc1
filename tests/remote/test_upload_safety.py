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
from helpers.s3server import S3Server, bucket_objects
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


class Server(S3Server):
    """``S3Server`` that also calls ``put_hooks`` with each PUT's path before serving it."""

    def start(self) -> "Server":
        super().start()
        self.put_hooks: list = []
        wsgi = self._moto._server
        inner = wsgi.app

        def app(environ, start_response):
            if environ["REQUEST_METHOD"] == "PUT":
                for hook in list(self.put_hooks):
                    hook(environ["PATH_INFO"])
            return inner(environ, start_response)

        wsgi.app = app
        return self


@pytest.fixture(scope="module")
def server(s3_env, tmp_path_factory):
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("upload-safety-cache")))
    with Server() as s3:
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
        with S3Server() as other:
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
