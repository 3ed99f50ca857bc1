"""WebDataset tars in an S3 bucket (moto's S3 server on 127.0.0.1), read through fsspec: the
same store as the local tars, and as packing their folder."""

from __future__ import annotations

import os

import fsspec
import pytest
from conftest import CLASSES, store_records
from helpers.s3server import DUMMY_ENV, S3Server
from test_webdataset import write_tars

import shardkit


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
