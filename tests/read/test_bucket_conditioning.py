"""A bucketed store's crop conditioning in both conventions, and ``flip=`` without a crop:
whole records mirrored at decode, ``crop_top_left`` (diffusers') and ``crop_top_left_kohya``
moved as each convention moves them, ``crop_ltrb`` as sd-scripts' ``get_crop_ltrb`` gives it;
through ``ds[i]`` and a ``BucketSampler`` loader with fork workers. Expected values are worked
out here from each convention's text (the functions themselves are compared with the peers'
code in ``tests/packing/test_bucket_peers.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import shardkit
from shardkit import BucketSampler, OptionError
from shardkit.bucketing import kohya_crop_ltrb

from helpers.buckets import bucketed_store

FIELDS = ["original_size", "crop_top_left", "target_size", "crop_ltrb", "crop_top_left_kohya"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("conditioning")
    return bucketed_store(str(base / "src"), str(base / "b.lmdb"))


def resized_width(original: list[int], target: list[int]) -> int:
    """The width the list rule resized a source to (covering its bucket: the binding side
    exact, the other rounded up); every source of the store is at least its bucket's size."""
    (h, w), (bh, bw) = original, target
    return -(-w * bh // h) if bh * w >= bw * h else bw


def expected(t: dict, flipped: bool) -> dict:
    (h, w), (bh, bw), (top, left) = t["original_size"], t["target_size"], t["crop_top_left"]
    ltrb = kohya_crop_ltrb((h, w), (bh, bw))
    return {"crop_top_left": [top, resized_width([h, w], [bh, bw]) - bw - left if flipped
                              else left],
            "crop_ltrb": list(ltrb),
            "crop_top_left_kohya": [int(ltrb[1]), int(bw - ltrb[2] if flipped else ltrb[0])]}


def test_flip_mirrors_whole_records_and_moves_each_convention(store):
    plain = shardkit.ShardDataset(store, fields=FIELDS, output="numpy")
    flipped = shardkit.ShardDataset(store, fields=FIELDS, output="numpy", flip=1.0)
    odd = 0
    for i in range(len(plain)):
        (a, ta), (b, tb) = plain[i], flipped[i]
        ta = {k: v.tolist() for k, v in ta.items()}
        tb = {k: v.tolist() for k, v in tb.items()}
        assert np.array_equal(b, a[:, ::-1])
        assert {k: ta[k] for k in expected(ta, False)} == expected(ta, False)
        assert {k: tb[k] for k in expected(ta, True)} == expected(ta, True)
        assert tb["original_size"] == ta["original_size"]
        assert tb["target_size"] == ta["target_size"] == list(a.shape[:2])
        assert tb["crop_ltrb"] == ta["crop_ltrb"]
        odd += tb["crop_top_left"][1] != ta["crop_top_left"][1]
    assert odd > 0  # an odd excess: the mirrored cut starts one pixel off the stored one


def test_flip_in_a_bucket_sampler_loader_with_fork_workers(store):
    ds = shardkit.ShardDataset(store, fields=FIELDS, flip=0.5)
    plain = shardkit.ShardDataset(store, fields=FIELDS, output="numpy")
    sampler = BucketSampler(ds, 8, seed=3, num_replicas=1, rank=0)
    sampler.set_epoch(1)
    loader = ds.loader(batch_sampler=sampler, num_workers=2, multiprocessing_context="fork")
    seen, mirrored = 0, 0
    for batch, (images, target) in zip(sampler, loader):
        for j, i in enumerate(batch):
            image, t = plain[i]
            got = images[j].permute(1, 2, 0).numpy()
            flip = not np.array_equal(got, image)
            assert np.array_equal(got, image[:, ::-1] if flip else image)
            want = expected({k: v.tolist() for k, v in t.items()}, flip)
            assert {k: target[k][j].tolist() for k in want} == want
            seen, mirrored = seen + 1, mirrored + flip
    assert seen == len(plain) and 0 < mirrored < seen


def test_flip_without_crop_needs_a_bucketed_store(pack_photos):
    with pytest.raises(OptionError, match="flip needs crop .*only a store packed with buckets"):
        shardkit.ShardDataset(pack_photos("lmdb"), flip=0.5)
    with pytest.raises(OptionError, match="'crop_ltrb' is not a field of this store"):
        shardkit.ShardDataset(pack_photos("lmdb"), fields=["crop_ltrb"])


def test_flip_moves_boxes_with_the_whole_record(tmp_path):
    """Boxes of a flipped record are mirrored on its width (``W - x2, W - x1``: v2's
    ``RandomHorizontalFlip`` of the whole image), not clamped."""
    import json

    from PIL import Image

    src = tmp_path / "src"
    src.mkdir()
    rows = [[[0.125, 0.25, 0.5, 0.75], [0.0, 0.0, 1.0, 1.0]], [[0.0625, 0.125, 0.75, 1.0]]]
    for i, boxes in enumerate(rows):
        Image.fromarray(np.full((32, 48, 3), 40 * i, np.uint8)).save(src / f"{i}.png")
        with open(src / "metadata.jsonl", "a") as f:
            f.write(json.dumps({"file_name": f"{i}.png", "boxes": boxes}) + "\n")
    out = str(tmp_path / "boxes.lmdb")
    shardkit.pack(str(src), out, buckets=[(32, 48)], bucket_step=8, workers=0, progress=False,
                  metadata_file=str(src / "metadata.jsonl"),
                  schema=[shardkit.fields.Boxes("boxes", format="XYXY", normalized=True)])
    ds = shardkit.ShardDataset(out, fields=["boxes"], flip=1.0, tv_tensors=False)
    for i in range(len(ds)):
        image, target = ds[i]
        want = np.array(rows[int(ds.source_path(i)[0])], np.float32) * [48, 32, 48, 32]
        want[:, [0, 2]] = 48 - want[:, [2, 0]]
        assert image.shape == (3, 32, 48) and np.array_equal(target["boxes"].numpy(), want)
