"""Bucket rules by name at pack time: ``sdxl`` and ``kohya`` stores hold each record where the
rule places it (pixels: the packer's resize, then the rule's cut), the metadata records the
rule by name and parameters; ``min_bucket_count`` merges a small bucket into its nearest at
pack time and ``info`` counts what stays small; the options' errors.

Expected sizes are worked out here from sd-scripts' arithmetic as the docs state it (the rules
themselves are compared with sd-scripts' own code in ``test_bucket_peers.py``)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit import cli
from shardkit.bucketing import SDXL_SIZES, KohyaRule
from shardkit.errors import PackOptionError
from shardkit.packing.resize import resize_rgb
from shardkit.read.store import Store

FIELDS = ["original_size", "crop_top_left", "target_size"]
# (width, height): three in one kohya no-upscale bucket (192 x 128 at step 32), one in a
# bucket of its own that holds the first inside it (224 x 160), one too small for any other
# bucket to fit inside it (96 x 64)
SOURCES = {"a/0.png": (200, 150), "a/1.png": (210, 140), "a/2.png": (220, 155),
           "b/3.png": (240, 170), "b/4.png": (100, 70)}
SMALL_KOHYA = dict(resolution=256, min_bucket_reso=128, max_bucket_reso=512,
                   bucket_reso_steps=32, bucket_no_upscale=True)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("rules") / "src"
    rng = np.random.default_rng(5)
    for rel, (w, h) in SOURCES.items():
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / rel)
    return str(root)


def pixels(src: str, rel: str) -> np.ndarray:
    with Image.open(os.path.join(src, rel)) as im:
        return np.asarray(im.convert("RGB"))


def records(store: str) -> dict:
    ds = shardkit.ShardDataset(store, fields=FIELDS, output="numpy")
    return {ds.source_path(i): (ds[i][0], {k: v.tolist() for k, v in ds[i][1].items()})
            for i in range(len(ds))}


def kohya_cover(width: int, height: int, bw: int, bh: int) -> tuple[int, int, int, int]:
    """sd-scripts' resize to a bucket and centre trim: (resized w, h, left, top)."""
    scale = bh / height if width / height > bw / bh else bw / width
    rw, rh = int(width * scale + 0.5), int(height * scale + 0.5)
    return rw, rh, (rw - bw) // 2, (rh - bh) // 2


def test_sdxl_store_resizes_every_image_to_its_nearest_sdxl_size(src, tmp_path):
    out = str(tmp_path / "sdxl.lmdb")
    assert cli.main(["pack", src, out, "--buckets", "sdxl", "--encoding", "raw", "--workers",
                     "0", "-q"]) == 0
    meta = Store(out).meta
    assert meta["settings"]["buckets"] == {"rule": "sdxl"}
    for rel, (image, f) in records(out).items():
        w, h = SOURCES[rel]
        # the nearest w / h of the 40 sizes (their list is checked in test_bucket_peers.py)
        bh, bw = min(SDXL_SIZES, key=lambda s: abs(s[1] / s[0] - w / h))
        rw, rh, left, top = kohya_cover(w, h, bw, bh)
        assert f == {"original_size": [h, w], "crop_top_left": [top, left],
                     "target_size": [bh, bw]}, rel
        want = resize_rgb(pixels(src, rel), rw, rh)[top:top + bh, left:left + bw]
        assert np.array_equal(image, want), rel


def test_kohya_no_upscale_and_min_bucket_count(src, tmp_path, capsys):
    out, merged_out = str(tmp_path / "k.lmdb"), str(tmp_path / "km.lmdb")
    common = dict(encoding="raw", workers=0, progress=False)
    shardkit.pack(src, out, buckets=KohyaRule(**SMALL_KOHYA), **common)
    plain = records(out)
    # bucket_no_upscale: at most 256 * 256 pixels, each side cut down to 32, not resized
    for rel, (image, f) in plain.items():
        w, h = SOURCES[rel]
        assert f["target_size"] == [h - h % 32, w - w % 32] and f["original_size"] == [h, w]
        top, left = (h % 32) // 2, (w % 32) // 2
        assert f["crop_top_left"] == [top, left]
        assert np.array_equal(image, pixels(src, rel)[top:top + h - h % 32,
                                                      left:left + w - w % 32])
    meta = Store(out).meta["buckets"]
    assert meta["sizes"] == [[64, 96], [128, 192], [160, 224]] and meta["counts"] == [1, 3, 1]
    assert shardkit.info(out)["small_buckets"] == {"under": 3, "buckets": 2, "records": 2,
                                                   "merged": 0}

    shardkit.pack(src, merged_out, buckets=KohyaRule(**SMALL_KOHYA), min_bucket_count=2,
                  **common)
    got = records(merged_out)
    meta = Store(merged_out).meta
    # 160x224 (one record) goes to 128x192, which fits inside it and holds three; 64x96 has
    # no neighbour that fits inside it and stays
    assert meta["buckets"]["merged"] == [[[160, 224], [128, 192]]]
    assert meta["buckets"]["min_bucket_count"] == 2
    assert meta["buckets"]["sizes"] == [[64, 96], [128, 192]]
    assert meta["buckets"]["counts"] == [1, 4]
    image, f = got["b/3.png"]
    rw, rh, left, top = kohya_cover(240, 170, 192, 128)
    assert (rw, rh, left, top) == (192, 136, 0, 4)
    assert f == {"original_size": [170, 240], "crop_top_left": [top, left],
                 "target_size": [128, 192]}
    assert np.array_equal(image, resize_rgb(pixels(src, "b/3.png"), rw, rh)[top:top + 128])
    assert all(np.array_equal(got[r][0], plain[r][0]) for r in got if r != "b/3.png")
    assert shardkit.info(merged_out)["small_buckets"] == {"under": 2, "buckets": 1,
                                                          "records": 1, "merged": 1}
    assert cli.main(["info", merged_out]) == 0
    shown = capsys.readouterr().out
    assert "buckets:    2 (sd-scripts' BucketManager, resolution 256x256, bucket_no_upscale, " \
        "step 32, no upscaling)" in shown
    assert "small:      1 records in 1 buckets of fewer than 2; 1 merged into their nearest " \
        "at pack time" in shown


def test_cli_kohya_defaults_and_option_errors(src, tmp_path, capsys):
    out = str(tmp_path / "kd.lmdb")
    assert cli.main(["pack", src, out, "--buckets", "kohya", "--bucket-no-upscale",
                     "--workers", "0", "-q"]) == 0
    assert Store(out).meta["settings"]["buckets"] == {
        "rule": "kohya", "resolution": [1024, 1024], "min_bucket_reso": 256,
        "max_bucket_reso": 1024, "bucket_reso_steps": 64, "bucket_no_upscale": True}
    bad = [({"buckets": "sdxl", "bucket_upscale": False}, r"`buckets='sdxl'`.*bucket_upscale"),
           ({"buckets": "sdxl", "bucket_step": 32}, r"takes no `bucket_step`"),
           ({"buckets": "kohya2"}, r"`buckets` must be a side.*'sdxl', 'kohya'"),
           ({"buckets": KohyaRule(), "bucket_step": 32}, r"parameters of the rule object"),
           ({"min_bucket_count": 2}, r"`min_bucket_count` needs `buckets`"),
           ({"buckets": 256, "min_bucket_count": 0}, r"`min_bucket_count` must be an integer")]
    for kwargs, message in bad:
        with pytest.raises(PackOptionError, match=message):
            shardkit.pack(src, str(tmp_path / "x.lmdb"), progress=False, **kwargs)
    capsys.readouterr()
    with pytest.raises(PackOptionError, match=r"`min_bucket_reso` \(512\) and "
                                              r"`max_bucket_reso` \(1024\) must bound"):
        KohyaRule(resolution=384, min_bucket_reso=512)
    assert cli.main(["pack", src, str(tmp_path / "y.lmdb"), "--min-bucket-count", "2",
                     "-q"]) == 1
    assert capsys.readouterr().err.strip() == ("shardkit pack: error: --min-bucket-count "
                                               "needs --buckets")
    assert not os.path.exists(tmp_path / "x.lmdb") and not os.path.exists(tmp_path / "y.lmdb")
    json.dumps(Store(out).meta)  # plain JSON throughout
