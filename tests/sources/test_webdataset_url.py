"""WebDataset tars in an S3 bucket (moto's S3 server on 127.0.0.1), read through fsspec: the
same store as the local tars, and as packing their folder; a refused read fails the pack."""

from __future__ import annotations

import os

import fsspec
import pytest
from conftest import CLASSES, store_records
from helpers.faultproxy import FaultProxy
from helpers.s3server import DUMMY_ENV, S3Server
from test_webdataset import write_tars

import shardkit
import shardkit.remote.access


@pytest.fixture
def bucket(monkeypatch, folder, tmp_path):
    for key, value in DUMMY_ENV.items():
        monkeypatch.setenv(key, value)
    with S3Server() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)  # inherited by the workers
        name = server.new_bucket()
        local = str(tmp_path / "tars")
        write_tars(folder, local)
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        for n in sorted(os.listdir(local)):
            fs.put_file(os.path.join(local, n), f"{name}/shards/{n}")
        yield server, f"s3://{name}/shards"


def test_tars_in_a_bucket_pack_as_their_folder(bucket, folder_store, tmp_path):
    server, url = bucket
    want = [r[:4] for r in store_records(folder_store(64))]
    for src, workers in ((url + "/", 2), (url + "/train-{000000..000002}.tar", 1)):
        out = str(tmp_path / f"w{workers}.lmdb")
        result = shardkit.pack(src, out, size=64, workers=workers, progress=False)
        assert result.count == 24 and result.skipped == []
        got = store_records(out)
        assert [r[:4] for r in got] == want
        assert got[0][4] == "train-000000.tar#c0_img000.jpg"
        assert shardkit.ShardDataset(out).classes == CLASSES  # classes.json in the bucket
    # images are read by range requests (GET), the tars never copied to a local folder
    assert any(method == "GET" and path.endswith("train-000001.tar")
               for method, path in server.requests)


def test_a_refused_member_read_fails_the_pack_never_a_skip(bucket, monkeypatch, tmp_path):
    """Each request of a tar at a URL is retried and a refusal that outlasts the retries fails
    the pack naming the tar: the scan's read of train-000001.tar passes, then the member reads
    are refused (403)."""
    server, url = bucket
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.05, 0.05))
    with FaultProxy(server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        tar = "/" + url.removeprefix("s3://") + "/train-000001.tar"
        proxy.answer("GET", tar, 403, "AccessDenied", times=None, after=1)
        with pytest.raises(shardkit.PackError, match=(
                f"^{url}/train-000001.tar: access denied by the server \\(HTTP 403 AccessDenied"
                ".*gave up after 3 attempts\\); no output written$")):
            shardkit.pack(url + "/", str(tmp_path / "out.lmdb"), size=64, workers=0,
                          progress=False)
        assert proxy.count("GET", tar) == 4  # the scan's, then one member's 3 attempts
