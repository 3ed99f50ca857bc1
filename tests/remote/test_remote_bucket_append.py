"""An append to a bucketed folder store in object storage (``pack(src, URL, append=True)``)
places the new images by the store's merged rule and equals a fresh pack of the union; against
a real moto S3 server."""

from __future__ import annotations

import pytest
from helpers.bucketgrow import FIRST, MERGED, SECOND, held, records, write
from helpers.s3server import S3Server

import shardkit


@pytest.fixture(scope="module")
def server(s3_env, tmp_path_factory):
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("bucket-append-cache")))
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
        yield s3


def test_append_to_a_bucketed_url_store_equals_a_fresh_pack(server, tmp_path):
    src, url = tmp_path / "src", f"s3://{server.new_bucket()}/train"
    write(src, FIRST)
    shardkit.pack(src, url, num_shards=2, **MERGED)
    write(src, SECOND)
    assert shardkit.pack(src, url, append=True, workers=0, progress=False).count == len(SECOND)
    fresh = tmp_path / "fresh"
    shardkit.pack(src, fresh, num_shards=2, **MERGED)
    got = records(url)
    assert got == records(fresh) and len(got) == len(FIRST) + len(SECOND)
    assert got["b/a1.png"][2]["target_size"] == [224, 288]  # A's bucket is merged into B's
    assert held(url) == held(fresh) == {(224, 288): 6, (256, 256): 4}
    assert shardkit.ShardDataset(url).version == 2
