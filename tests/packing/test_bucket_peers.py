"""shardkit's bucket rules against the peers' own code, on 2,500 image sizes recorded by
``scripts/record_bucket_peers.py`` from kohya sd-scripts' ``BucketManager`` and diffusers' SDXL
``preprocess_train``, executed unchanged (``tests/packing/data/bucket_peers.json``: the commits
and the command are in it). Pure arithmetic: no image is packed here."""

from __future__ import annotations

import json
import os

import pytest

from shardkit.bucketing import (AreaRule, KohyaRule, SDXLRule, TooSmall, diffusers_crop_top_left,
                                kohya_crop_ltrb, kohya_crop_top_left)

DATA = os.path.join(os.path.dirname(__file__), "data", "bucket_peers.json")


@pytest.fixture(scope="module")
def peers() -> dict:
    with open(DATA) as f:
        return json.load(f)


def test_the_recording_names_its_sources(peers):
    assert len(peers["kohya_commit"]) == 40 and len(peers["diffusers_commit"]) == 40
    assert peers["command"].startswith("python scripts/record_bucket_peers.py --kohya ")
    for name, recorded in peers["kohya"].items():
        assert len(recorded["rows"]) >= 2000, name
        assert len({tuple(r[:2]) for r in recorded["rows"]}) == len(recorded["rows"])
    assert len(peers["diffusers"]["rows"]) >= 2000


@pytest.mark.parametrize("name, made", [
    ("kohya", KohyaRule()),
    ("kohya_no_upscale", KohyaRule(bucket_no_upscale=True)),
    ("sdxl", SDXLRule()),
], ids=["kohya", "kohya_no_upscale", "sdxl"])
def test_rule_equals_sd_scripts_bucket_manager(peers, name, made):
    """Bucket, resized size, centre trim and ``get_crop_ltrb`` of every recorded size."""
    recorded = peers["kohya"][name]
    if recorded["predefined"]:  # the candidate set is sd-scripts' (width, height) list
        assert made.predefined() == [tuple(r) for r in recorded["predefined"]]
        assert sorted((w, h) for h, w in made.sizes) == sorted(made.predefined())
    refused = 0
    for row in recorded["rows"]:
        width, height = row[:2]
        if len(row) == 3:  # sd-scripts makes an empty bucket or fails: shardkit refuses it
            refused += 1
            with pytest.raises(TooSmall):
                made.place(height, width)
            continue
        (bw, bh), (rw, rh), (left, top), ltrb = row[2:]
        place = made.place(height, width)
        assert (place.size, place.resized, place.top, place.left) == (
            (bh, bw), (rh, rw), top, left), (name, width, height)
        assert kohya_crop_ltrb(place.original, place.size) == tuple(ltrb), (name, width, height)
        # sd-scripts' SDXL conditioning: (int(top), int(left)); flipped, left = target_w - right
        assert kohya_crop_top_left(place.original, place.size) == (int(ltrb[1]), int(ltrb[0]))
        assert kohya_crop_top_left(place.original, place.size, flipped=True) == (
            int(ltrb[1]), int(bw - ltrb[2]))
    assert refused == (20 if name == "kohya_no_upscale" else 0)


def test_area_rule_picks_sd_scripts_bucket_and_crops_as_diffusers(peers):
    """The area rule at 1024 chooses the bucket sd-scripts chooses from the same set
    (``make_bucket_resolutions((1024, 1024), 512, 2048, 64)``) for every recorded size but the
    ties (two buckets equally near: sd-scripts takes the first in (width, height) order, the
    area rule the first in (height, width) order); its
    resize rounds the free side up and its crop starts where diffusers' centre crop does, so
    its ``crop_top_left`` is diffusers' (recorded) for every placement, and sd-scripts'
    rounding and trim give other sizes and offsets for some sizes."""
    rule = AreaRule(1024, upscale=True)
    recorded = peers["kohya"]["kohya_512_2048"]
    assert sorted((w, h) for h, w in rule.sizes) == [tuple(r) for r in recorded["predefined"]]
    offsets = {tuple(r[:4]): tuple(r[4:]) for r in peers["diffusers"]["rows"]}
    other_resize = other_trim = ties = 0
    for width, height, (bw, bh), (rw, rh), (left, top), _ in recorded["rows"]:
        place = rule.place(height, width)
        if place.size != (bh, bw):
            (h, w), aspect = place.size, width / height
            assert abs(w / h - aspect) == abs(bw / bh - aspect) and (w, h) > (bw, bh)
            ties += 1
        assert diffusers_crop_top_left(place) == offsets[(*place.resized, *place.size)]
        other_resize += place.resized != (rh, rw)
        other_trim += place.resized == (rh, rw) and (place.top, place.left) != (top, left)
    assert other_resize > 100 and other_trim > 100  # the documented differences are real
    assert 0 < ties < 20
    # a source kept at its own size (no upscaling) is cut where diffusers' crop would start
    own = AreaRule(1024)
    for (rh, rw, bh, bw), (y1, x1) in offsets.items():
        place = own.place(rh, rw)
        if place.resized == (rh, rw) and place.size == (bh, bw):
            assert diffusers_crop_top_left(place) == (y1, x1)


def test_diffusers_flipped_offset_is_the_mirrored_cut():
    """Flipped, diffusers' convention names where the same pixels start in the mirrored resized
    image: a record cut at ``left`` and mirrored is the mirror cut at ``rw - bw - left``."""
    import numpy as np

    for rule in (AreaRule(256, 32, True), KohyaRule(512, 128, 512, 32), SDXLRule()):
        for height, width in ((300, 411), (411, 300), (1000, 1733), (257, 257)):
            place = rule.place(height, width)
            (rh, rw), (bh, bw) = place.resized, place.size
            image = np.arange(rh * rw).reshape(rh, rw)
            record = image[place.top:place.top + bh, place.left:place.left + bw][:, ::-1]
            top, left = diffusers_crop_top_left(place, flipped=True)
            assert np.array_equal(record, image[:, ::-1][top:top + bh, left:left + bw])
