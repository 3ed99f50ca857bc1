"""Fields through the other read paths: a COCO pack to an S3-protocol server (moto on
127.0.0.1) read back by URL, and a ``ShardSampler`` over a multi-shard store, give the values a
local read gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.coco import make_coco
from helpers.s3server import DUMMY_ENV, S3Server

import shardkit
from shardkit import ShardSampler

FIELDS = ["boxes", "labels", "masks", "image_id", "iscrowd", "area"]


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    base = tmp_path_factory.mktemp("coco-remote")
    images, annotations = make_coco(str(base), 9, seed=7)
    local = str(base / "local")
    shardkit.pack(images, local, coco=annotations, num_shards=3, workers=1, progress=False)
    return images, annotations, local


def _same_targets(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def test_remote_store_reads_the_same_fields(coco, tmp_path, monkeypatch):
    images, annotations, local = coco
    for name, value in DUMMY_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "cache"))
    with S3Server() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
        url = f"s3://{server.new_bucket()}/coco"
        shardkit.pack(images, url, coco=annotations, num_shards=3, workers=1, progress=False)
        remote = shardkit.ShardDataset(url, fields=FIELDS, cache_dir=str(tmp_path / "c2"))
        here = shardkit.ShardDataset(local, fields=FIELDS)
        assert len(remote) == len(here) == 9
        for i in range(len(here)):
            assert _same_targets(remote[i][1], here[i][1])
            assert torch.equal(remote[i][0], here[i][0])
        assert shardkit.verify(url, cache_dir=str(tmp_path / "c3")).ok
        assert [f["name"] for f in shardkit.info(url, cache_dir=str(tmp_path / "c4"))[
            "fields"]] == ["boxes", "labels", "iscrowd", "area", "image_id", "masks"]


@pytest.mark.parametrize("rank", [0, 1])
def test_shard_sampler_batches_match_items(coco, rank):
    ds = shardkit.ShardDataset(coco[2], fields=FIELDS, crop=224, ragged="padded")
    sampler = ShardSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=4)
    order = list(iter(sampler))
    loader = ds.loader(batch_size=2, sampler=sampler, num_workers=2)
    seen = 0
    for images, targets in loader:
        for j in range(len(images)):
            image, target = ds[order[seen]]
            assert torch.equal(images[j], image)
            n = int(targets["boxes_lengths"][j])
            assert torch.equal(targets["boxes"][j, :n], target["boxes"].as_subclass(torch.Tensor))
            assert not targets["boxes"][j, n:].any()
            assert torch.equal(targets["masks"][j, :n], target["masks"].as_subclass(torch.Tensor))
            assert targets["image_id"][j].item() == target["image_id"]
            seen += 1
    assert seen == len(order) == 5  # 9 records over 2 ranks: one repeated to even them
    assert np.isin(order, np.arange(len(ds))).all()
