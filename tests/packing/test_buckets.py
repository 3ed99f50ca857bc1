"""Aspect-ratio buckets at pack time (store side): the bucket set, the nearest-aspect
rule, resize-to-cover + v2 CenterCrop's anchor, no upscaling unless asked, EXIF orientation,
the per-record fields, the metadata's histogram (and a forged one refused), COCO boxes and masks
(against torchvision v2 in ``.venv-tv``), a WebDataset source, the CLI and its option errors.

Expectations are worked out here from the rule's text (fractions, brute force), not with
:mod:`shardkit.packing.buckets`; small areas keep the packs fast (one module fixture packs the
shared images once per store kind)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import tarfile
from fractions import Fraction

import numpy as np
import pytest
from helpers import jpeg_bytes, run_program
from helpers.coco import make_coco
from PIL import Image

import shardkit
from shardkit import cli
from shardkit.errors import PackOptionError, StoreError
from shardkit.metadata import MANIFEST_NAME, seal
from shardkit.packing.buckets import make_spec
from shardkit.packing.resize import resize_rgb
from shardkit.read.store import Store

SIDE, STEP = 256, 32
FIELDS = ["original_size", "crop_top_left", "target_size"]
# (width, height) of the shared PNG sources: landscape, portrait, wide, tall, square, exactly a
# bucket, small (its own size in steps), smaller than its bucket on one side only (its own size
# too), under the step (skipped)
SOURCES = {"a/land.png": (400, 300), "a/port.png": (300, 400), "a/wide.png": (700, 210),
           "b/tall.png": (230, 690), "b/square.png": (333, 333), "b/exact.png": (288, 224),
           "b/small.png": (150, 100), "a/half.png": (340, 170), "b/thin.png": (20, 300)}
OWN_SIZE = ("b/small.png", "a/half.png")  # not resized without bucket_upscale
DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
EXIF_RAW = (400, 200)  # b/exif.jpg: raw 400x200 with orientation 6, shown 200 wide, 400 tall


def kohya(side: int, step: int) -> list[tuple[int, int]]:
    """The rule's text: widths in steps from a minimum side to twice the side, the largest height
    in steps with w * h <= side^2, both orientations, aspect ratios within 1:4..4:1."""
    out = set()
    for w in range(step, 2 * side + 1, step):
        fits = [h for h in range(step, 16 * side + 1, step) if w * h <= side * side]
        if fits and Fraction(1, 4) <= Fraction(max(fits), w) <= 4:
            out |= {(max(fits), w), (w, max(fits))}
    return sorted(out)


def nearest(sizes: list[tuple[int, int]], height: int, width: int) -> tuple[int, int]:
    """kohya's measure: |bucket w/h - image w/h|; a tie to the first (h, w)."""
    return min(sizes, key=lambda s: (abs(Fraction(s[1], s[0]) - Fraction(width, height)), s))


def expected(height: int, width: int, upscale: bool = False, side: int = SIDE, step: int = STEP):
    """(resized, bucket, (top, left)) of an oriented height x width source."""
    bh, bw = nearest(kohya(side, step), height, width)
    if not upscale and (height < bh or width < bw):
        resized, bucket = (height, width), (min(height // step * step, bh),
                                            min(width // step * step, bw))
    else:
        scale = max(Fraction(bh, height), Fraction(bw, width))
        resized, bucket = (math.ceil(height * scale), math.ceil(width * scale)), (bh, bw)
    # torchvision's _center_crop_compute_crop_anchor
    anchor = tuple(int(round((r - b) / 2.0)) for r, b in zip(resized, bucket))
    return resized, bucket, anchor


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("buckets") / "src"
    rng = np.random.default_rng(27)
    for rel, (w, h) in SOURCES.items():
        os.makedirs(root / os.path.dirname(rel), exist_ok=True)
        yy, xx = np.mgrid[0:h, 0:w]
        pixels = np.stack([xx * 255 // w, yy * 255 // h, (xx * 7 + yy * 3) % 256], axis=2)
        pixels = (pixels + rng.integers(0, 20, (h, w, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / rel)
        (root / rel).with_suffix(".txt").write_text(f"caption of {rel}")
    raw = rng.integers(0, 255, (EXIF_RAW[1], EXIF_RAW[0], 3), dtype=np.uint8)
    (root / "b" / "exif.jpg").write_bytes(jpeg_bytes(raw, exif_orientation=6))
    (root / "b" / "exif.txt").write_text("rotated")
    return str(root)


@pytest.fixture(scope="module")
def stores(src, tmp_path_factory) -> dict[str, str]:
    """The shared sources packed raw (pixels compared exactly): single-file, sharded, upscaled."""
    base = tmp_path_factory.mktemp("bucket-stores")
    out = {"single": str(base / "b.lmdb"), "sharded": str(base / "sharded"),
           "upscale": str(base / "up.lmdb")}
    common = dict(buckets=SIDE, bucket_step=STEP, encoding="raw", workers=0, progress=False,
                  captions=True)
    shardkit.pack(src, out["single"], **common)
    shardkit.pack(src, out["sharded"], num_shards=3, **common)
    shardkit.pack(src, out["upscale"], bucket_upscale=True, **common)
    return out


def oriented_pixels(src: str, rel: str) -> np.ndarray:
    from PIL import ImageOps

    with Image.open(os.path.join(src, rel)) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


def records(store: str) -> dict[str, tuple[np.ndarray, dict]]:
    ds = shardkit.ShardDataset(store, fields=FIELDS + ["caption"], output="numpy")
    return {ds.source_path(i): (ds[i][0], {k: np.asarray(v).tolist() if k != "caption" else v
                        for k, v in ds[i][1].items()}) for i in range(len(ds))}


# SDXL's 40 training sizes, (height, width)
SDXL = [(2048, 512), (1984, 512), (1920, 512), (1856, 512), (1792, 576), (1728, 576), (1664, 576),
        (1600, 640), (1536, 640), (1472, 704), (1408, 704), (1344, 704), (1344, 768), (1280, 768),
        (1216, 832), (1152, 832), (1152, 896), (1088, 896), (1088, 960), (1024, 960),
        (1024, 1024), (960, 1024), (960, 1088), (896, 1088), (896, 1152), (832, 1152),
        (832, 1216), (768, 1280), (768, 1344), (704, 1408), (704, 1472), (640, 1536),
        (640, 1600), (576, 1664), (576, 1728), (576, 1792), (512, 1856), (512, 1920),
        (512, 1984), (512, 2048)]


def kohya_resolutions(side: int, min_size: int, max_size: int, step: int) -> set[tuple[int, int]]:
    """kohya sd-scripts' ``make_bucket_resolutions((side, side), min_size, max_size, step)``
    restated from its text, as (height, width): the square of the area's side cut down to the
    step; then for each width from ``min_size`` in steps up to ``max_size``, the height is
    ``area // width`` cut down to the step and capped at ``max_size``, kept (both turns) if it
    is at least ``min_size``."""
    area = side * side
    out = {(math.isqrt(area) // step * step,) * 2}
    for w in range(min_size, max_size + 1, step):
        h = min(max_size, area // w // step * step)
        if h >= min_size:
            out |= {(h, w), (w, h)}
    return out


def buckets_doc() -> str:
    from shardkit.packing import buckets

    return buckets.__doc__


def kohya_no_upscale_bucket(height: int, width: int, side: int, step: int) -> tuple[int, int]:
    """The bucket kohya's ``bucket_no_upscale`` gives a source of at most ``side * side``
    pixels: its own size, each side cut down to the step (a larger one is resized to the area
    first, which this does not restate)."""
    assert height * width <= side * side
    return height - height % step, width - width % step


def test_the_1024_set_is_kohyas_rule_at_min_512_max_2048_and_not_sdxls_list():
    spec = make_spec(1024, 64, False)
    assert set(spec.sizes) == kohya_resolutions(1024, 512, 2048, 64) and len(spec.sizes) == 33
    assert list(spec.sizes) == kohya(1024, 64)
    # not kohya's defaults (256 and 1024), and not SDXL's list: 33 of its 40 sizes
    assert set(spec.sizes) != kohya_resolutions(1024, 256, 1024, 64)
    assert len(SDXL) == len(set(SDXL)) == 40 and set(spec.sizes) < set(SDXL)
    missing = sorted(set(SDXL) - set(spec.sizes))
    assert len(set(SDXL) & set(spec.sizes)) == 33 and missing == [
        (832, 1152), (896, 1088), (960, 1024), (1024, 960), (1088, 896), (1152, 832),
        (1344, 704)]
    # any side that is a multiple of twice the step: kohya's rule at N/2 and 2N
    for step in (16, 32, 64):
        for side in range(2 * step, 2049, 2 * step):
            assert set(make_spec(side, step, False).sizes) == kohya_resolutions(
                side, side // 2, 2 * side, step), (side, step)
    # what the docs and the CLI's help say is exactly this
    pages = {name: open(os.path.join(DOCS, name)).read() for name in ("packing.md", "buckets.md")}
    for name, text in pages.items():
        flat = " ".join(text.split())
        assert ("`make_bucket_resolutions((1024, 1024), min_size=512, max_size=2048, "
                "divisible=64)`") in flat, name
        assert "33 of the 40 sizes SDXL lists" in flat, name
        listed = re.search(r"also has ([0-9x, and]+) \(height x width\)", flat)
        assert listed, name
        sizes = re.findall(r"(\d+)x(\d+)", listed.group(1))
        assert sorted((int(h), int(w)) for h, w in sizes) == missing, name
        assert "SDXL's list" not in flat and "SDXL's buckets" not in flat, name
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["pack"]
    assert "kohya's make_bucket_resolutions with min 512, max 2048, step 64; 33 of SDXL's 40 " \
        "sizes" in " ".join(sub.format_help().split())


def test_no_upscale_is_kohyas_only_for_sources_smaller_than_their_bucket():
    """kohya's ``bucket_no_upscale`` never resizes a source of at most the area: it cuts each
    side down to the step. shardkit's default record has that size where it fits inside the
    source's nearest bucket (not resized where the source is smaller than the bucket on a
    side), and another size elsewhere; over the area kohya resizes to the area at the source's
    own ratio, shardkit to cover the nearest bucket of the set. As the docs say."""
    spec = make_spec(SIDE, STEP, False)
    other = 0
    for height in range(STEP, 4 * SIDE + 1):
        for width in range(max(STEP, -(-height // 4)), min(4 * height, SIDE * SIDE // height) + 1):
            place = spec.place(height, width)
            (bh, bw), (ch, cw) = spec.nearest(height, width), kohya_no_upscale_bucket(
                height, width, SIDE, STEP)
            if ch <= bh and cw <= bw:
                assert place.size == (ch, cw), (height, width)
                assert place.resized == (height, width) or (height >= bh and width >= bw)
            else:
                other += 1
                assert place.size != (ch, cw)
    assert other > 0  # the rules differ there
    # 1100 wide, 1000 tall at 1024: kohya resizes it to 1056 x 960 and cuts a bucket of its own,
    # 960 tall and 1024 wide (not in the set); shardkit covers the set's nearest, 960 x 1088
    assert make_spec(1024, 64, False).place(1000, 1100).size == (960, 1088)
    for name in ("packing.md", "buckets.md"):
        flat = " ".join(open(os.path.join(DOCS, name)).read().split())
        assert "not kohya's `bucket_no_upscale`" in flat, name
    assert "not kohya's ``bucket_no_upscale``" in " ".join(buckets_doc().split())


def test_crop_top_left_is_diffusers_crop_offset_not_kohyas_fit_offset():
    """``crop_top_left`` is where the crop starts in the resized image, as diffusers' SDXL
    script computes it (``int(round((resized - size) / 2.0))`` per side); kohya's
    ``get_crop_ltrb`` gives the offset of the source fitted inside the bucket, another value."""
    place = make_spec(1024, 64, False).place(3000, 4000)
    (rh, rw), (bh, bw) = place.resized, place.size
    assert (place.top, place.left) == (max(0, int(round((rh - bh) / 2.0))),
                                       max(0, int(round((rw - bw) / 2.0)))) == (0, 22)
    # kohya: the source's ratio is wider than the bucket's, so it is fitted to the bucket's
    # width and centred vertically: left 0, top half the height it leaves over
    fitted_height = bw * 3000 / 4000
    assert (int((bh - fitted_height) // 2), 0) == (16, 0) != (place.top, place.left)
    flat = " ".join(open(os.path.join(DOCS, "packing.md")).read().split())
    assert "as diffusers' SDXL training script computes it for its centre crop; kohya's " \
        "`get_crop_ltrb` gives other values" in flat


def test_nearest_aspect_ratio_is_kohyas_measure():
    spec = make_spec(1024, 64, False)
    sizes = list(spec.sizes)
    for width, height in [(4000, 3000), (3000, 4000), (1920, 1080), (1080, 1920), (1000, 1000),
                          (535, 1000), (10000, 1000), (1000, 10000), (1237, 911)]:
        assert spec.nearest(height, width) == nearest(sizes, height, width), (width, height)
    # 535 wide, 1000 tall: |w/h| difference picks 704x1408's 0.5 over 768x1344's 0.571 (the
    # log ratio would pick the latter): kohya's measure, as documented
    assert spec.nearest(1000, 535) == (1408, 704)
    assert spec.nearest(3000, 4000) == (896, 1152) and spec.nearest(1080, 1920) == (768, 1344)


def test_every_record_is_its_bucket_and_its_pixels_are_resize_then_center_crop(src, stores):
    got = records(stores["single"])
    assert sorted(got) == sorted([r for r in SOURCES if r != "b/thin.png"] + ["b/exif.jpg"])
    meta = Store(stores["single"]).meta
    skipped = {os.path.relpath(s["path"], src): s["reason"] for s in meta["skipped"]}
    assert list(skipped) == ["b/thin.png"] and "under the bucket step 32" in skipped["b/thin.png"]
    sizes = kohya(SIDE, STEP)
    for rel, (pixels, fields) in got.items():
        source = oriented_pixels(src, rel)
        height, width = source.shape[:2]
        resized, bucket, (top, left) = expected(height, width)
        assert pixels.shape == (*bucket, 3), rel
        assert fields["original_size"] == [height, width]
        assert fields["target_size"] == list(bucket)
        assert fields["crop_top_left"] == [top, left]
        assert fields["caption"] == ("rotated" if rel == "b/exif.jpg" else f"caption of {rel}")
        if rel.endswith(".png"):  # exact: the packer's resize, then the crop
            want = resize_rgb(source, resized[1], resized[0]) if resized != (height, width) \
                else source
            assert np.array_equal(pixels, want[top:top + bucket[0], left:left + bucket[1]]), rel
        if rel not in OWN_SIZE:
            assert bucket in sizes and min(b / s for b, s in zip(bucket, (height, width))) <= 1
    # the odd excess anchors as v2's CenterCrop does (round half to even)
    assert got["b/square.png"][1]["target_size"] == [256, 256]
    assert got["a/land.png"][1]["crop_top_left"] == [0, 6]  # 299 - 288 = 11: round(5.5) = 6
    assert got["b/exact.png"][1]["crop_top_left"] == [0, 0]
    # the histogram: every bucket that holds a record, sorted, counts in that order
    held = sorted({tuple(f["target_size"]) for _, f in got.values()})
    assert meta["buckets"]["sizes"] == [list(s) for s in held]
    assert meta["buckets"]["counts"] == [
        sum(f["target_size"] == list(s) for _, f in got.values()) for s in held]
    assert {k: meta["buckets"][k] for k in ("area", "step", "upscale", "rule")} == {
        "area": SIDE * SIDE, "step": STEP, "upscale": False, "rule": "area"}
    # a sharded pack's manifest sums its shards' histograms; the records are the same
    assert Store(stores["sharded"]).meta["buckets"] == meta["buckets"]
    sharded = records(stores["sharded"])
    assert all(np.array_equal(sharded[r][0], got[r][0]) and sharded[r][1] == got[r][1]
               for r in got)


def test_exif_rotated_source_buckets_by_its_oriented_size(stores):
    pixels, fields = records(stores["single"])["b/exif.jpg"]
    assert fields["original_size"] == [400, 200]  # raw 400 wide 200 tall, orientation 6
    assert fields["target_size"] == list(expected(400, 200)[1]) == [352, 160]
    assert pixels.shape == (352, 160, 3)  # w/h 0.5: 352x160 (0.45) beats 384x160 (0.42)


def test_small_sources_are_not_upscaled_unless_asked(src, stores):
    own = records(stores["single"])["b/small.png"][1]  # 150 wide, 100 tall
    nearest_bucket = nearest(kohya(SIDE, STEP), 100, 150)
    assert nearest_bucket == (192, 320)  # larger than the source on both sides
    assert own["target_size"] == [96, 128] and own["crop_top_left"] == [2, 11]
    up = records(stores["upscale"])
    assert "b/thin.png" in up  # 20x300: upscaled to cover its bucket, not skipped
    for rel, (pixels, fields) in up.items():
        h, w = fields["original_size"]
        resized, bucket, anchor = expected(h, w, upscale=True)
        assert fields["target_size"] == list(bucket) and pixels.shape[:2] == bucket
        assert fields["crop_top_left"] == list(anchor)
    assert up["b/small.png"][1]["target_size"] == [192, 320]
    assert up["b/small.png"][1]["crop_top_left"] == [11, 0]  # 150 -> 320 wide, 100 -> 214 tall
    # 340 wide, 170 tall: its nearest bucket, 160x352, is lower than the source and wider.
    # Without upscaling the source keeps its size, cut to 160x320 (its width in steps); with
    # it, resized to 176x352 to cover the bucket.
    assert nearest(kohya(SIDE, STEP), 170, 340) == (160, 352)
    half = records(stores["single"])["a/half.png"]
    assert half[1]["target_size"] == [160, 320] and half[1]["crop_top_left"] == [5, 10]
    assert np.array_equal(half[0], oriented_pixels(src, "a/half.png")[5:165, 10:330])
    assert up["a/half.png"][1]["target_size"] == [160, 352]
    assert up["a/half.png"][1]["crop_top_left"] == [8, 0]
    assert Store(stores["upscale"]).meta["buckets"]["upscale"] is True


def test_forged_buckets_metadata_is_refused(stores, tmp_path):
    import shutil

    folder = str(tmp_path / "forged")
    with open(os.path.join(stores["sharded"], MANIFEST_NAME)) as f:
        good = json.load(f)

    def forged(edit) -> str:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(stores["sharded"], folder)
        meta = json.loads(json.dumps(good))
        edit(meta)
        with open(os.path.join(folder, MANIFEST_NAME), "w") as f:
            json.dump(seal(meta), f)
        return folder

    def more(m):
        m["buckets"]["counts"][0] += 1

    def swapped(m):
        m["buckets"]["sizes"].reverse()

    def off_step(m):
        m["buckets"]["sizes"][0][0] += 1

    def settings(m):
        m["settings"]["buckets"]["step"] = 64

    def dropped(m):
        del m["buckets"]

    def too_large(m):
        m["buckets"]["sizes"][-1] = [SIDE * 4, SIDE * 4]

    shardkit.ShardDataset(forged(lambda m: None))  # the copy itself opens
    for edit in (more, swapped, off_step, settings, dropped, too_large):
        with pytest.raises(StoreError, match="buckets"):
            shardkit.ShardDataset(forged(edit))


def test_info_shows_the_histogram_and_cli_packs_buckets(src, stores, tmp_path, capsys):
    assert cli.main(["info", stores["single"]]) == 0
    shown = capsys.readouterr().out
    meta = Store(stores["single"]).meta["buckets"]
    assert f"buckets:    {len(meta['sizes'])} (area 256x256, step 32, no upscaling)" in shown
    assert "(bucketed, quality" in shown  # not "size 0": a bucketed store has no one size
    for (h, w), n in zip(meta["sizes"], meta["counts"]):
        assert f"\n  {h}x{w}: {n}\n" in shown
    assert shardkit.info(stores["single"])["buckets"] == meta
    out = str(tmp_path / "cli.lmdb")
    assert cli.main(["pack", src, out, "--buckets", "128x96,96x128,128x128", "--bucket-step",
                     "32", "--bucket-upscale", "--workers", "0", "-q"]) == 0
    capsys.readouterr()
    meta = Store(out).meta
    assert meta["buckets"]["rule"] == "list" and meta["buckets"]["upscale"] is True
    assert {tuple(s) for s in meta["buckets"]["sizes"]} <= {(128, 96), (96, 128), (128, 128)}
    assert sum(meta["buckets"]["counts"]) == meta["count"] == len(SOURCES) + 1


def test_option_errors(src, tmp_path, capsys):
    out = str(tmp_path / "x.lmdb")
    bad = [({"buckets": 256, "size": 128}, r"`buckets` or `size`"),
           ({"buckets": 256, "bucket_step": 0}, r"`bucket_step` must be a positive"),
           ({"buckets": 16, "bucket_step": 32}, r"`buckets` must be a side of at least"),
           ({"buckets": [(0, 64)]}, r"`buckets` sizes must be"),
           ({"buckets": "1024"}, r"`buckets` must be a side"),
           ({"buckets": []}, r"at least one"),
           ({"bucket_step": 64}, r"`bucket_step` needs `buckets`"),
           ({"bucket_upscale": True}, r"`bucket_upscale` needs `buckets`")]
    for kwargs, message in bad:
        with pytest.raises(PackOptionError, match=message):
            shardkit.pack(src, out, progress=False, **kwargs)
    assert not os.path.exists(out)
    assert cli.main(["pack", src, out, "--buckets", "256", "--size", "128", "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("shardkit pack: error: give --buckets or --size, not both (a bucketed pack "
                   "sizes each image to its bucket)")


def test_webdataset_source_is_bucketed(src, tmp_path):
    tar = str(tmp_path / "shard-000.tar")
    with tarfile.open(tar, "w") as t:
        for n, rel in enumerate(["a/land.png", "b/tall.png", "b/small.png"]):
            for suffix, data in (("png", open(os.path.join(src, rel), "rb").read()),
                                 ("cls", str(n % 2).encode()), ("txt", rel.encode())):
                info = tarfile.TarInfo(f"s{n:03d}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    out = str(tmp_path / "wds.lmdb")
    shardkit.pack(tar, out, buckets=SIDE, bucket_step=STEP, encoding="raw", workers=0,
                  progress=False)
    ds = shardkit.ShardDataset(out, fields=FIELDS + ["txt"], output="numpy")
    assert len(ds) == 3
    for i in range(3):
        pixels, fields = ds[i]
        rel = fields["txt"]
        w, h = SOURCES[rel]
        resized, bucket, (top, left) = expected(h, w)
        assert pixels.shape[:2] == bucket and fields["target_size"].tolist() == list(bucket)
        assert fields["crop_top_left"].tolist() == [top, left]
        want = oriented_pixels(src, rel)
        if resized != (h, w):
            want = resize_rgb(want, resized[1], resized[0])
        assert np.array_equal(pixels, want[top:top + bucket[0], left:left + bucket[1]])


def test_normalized_metadata_boxes_are_cropped_with_the_pixels(src, tmp_path):
    from shardkit import fields as F

    rows = {"a/land.png": [[0.0, 0.0, 1.0, 1.0], [0.01, 0.25, 0.2, 0.5]],
            "a/port.png": [[0.5, 0.0, 0.5, 0.02]]}
    meta_file = tmp_path / "metadata.jsonl"
    names = [r for r in SOURCES if r != "b/thin.png"] + ["b/exif.jpg"]
    meta_file.write_text("".join(json.dumps({"file_name": r, "boxes": rows.get(r, [])}) + "\n"
                                 for r in names))
    folder = tmp_path / "src"
    import shutil

    shutil.copytree(src, folder, ignore=shutil.ignore_patterns("thin.*"))
    out = str(tmp_path / "meta.lmdb")
    shardkit.pack(str(folder), out, buckets=SIDE, bucket_step=STEP, workers=0, progress=False,
                  metadata_file=str(meta_file),
                  schema=[F.Boxes("boxes", format="XYWH", normalized=True)])
    ds = shardkit.ShardDataset(out, fields=["boxes", *FIELDS], output="numpy")
    for i in range(len(ds)):
        rel = ds.source_path(i)
        pixels, fields = ds[i]
        (h, w), (bh, bw) = fields["original_size"].tolist(), fields["target_size"].tolist()
        resized, bucket, (top, left) = expected(h, w)
        xywh = np.array(rows.get(rel, []), np.float32).reshape(-1, 4)
        xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
        want = xyxy * np.array([resized[1], resized[0]] * 2, np.float32)
        want = want - np.array([left, top, left, top], np.float32)
        want[:, 0::2] = want[:, 0::2].clip(0, bw)
        want[:, 1::2] = want[:, 1::2].clip(0, bh)
        assert np.array_equal(np.asarray(fields["boxes"]), want), rel
    assert Store(out).meta["fields"][0] == {"name": "boxes", "kind": "boxes", "format": "XYXY",
                                            "normalized": False}


@pytest.fixture(scope="module")
def coco_stores(tmp_path_factory) -> tuple[str, str, list[str]]:
    """COCO images (300-480 px) packed at side 384 (larger ones resized and cropped, smaller
    ones kept at their own size in steps) and at side 512 upscaled (every one resized up)."""
    base = tmp_path_factory.mktemp("coco-buckets")
    images, annotations = make_coco(str(base), 8, seed=27, exif=True)
    out = [str(base / "c384.lmdb"), str(base / "c512")]
    shardkit.pack(images, out[0], coco=annotations, buckets=384, bucket_step=32, workers=0,
                  progress=False)
    shardkit.pack(images, out[1], coco=annotations, buckets=512, bucket_upscale=True,
                  num_shards=2, workers=0, progress=False)
    return images, annotations, out


def test_coco_boxes_and_masks_follow_the_bucket(coco_stores):
    images, annotations, out = coco_stores
    kinds = set()
    for store, upscale, side, step in ((out[0], False, 384, 32), (out[1], True, 512, 64)):
        ds = shardkit.ShardDataset(store, fields=["boxes", "masks", *FIELDS], output="numpy")
        assert len(ds) == 10  # 8, and two of the EXIF photos (the third is refused)
        for i in range(len(ds)):
            pixels, t = ds[i]
            h, w = t["original_size"].tolist()
            resized, bucket, anchor = expected(h, w, upscale, side, step)
            kinds.add(resized == (h, w))
            assert pixels.shape[:2] == bucket == tuple(t["target_size"].tolist())
            assert t["masks"].shape[1:] == bucket and len(t["masks"]) == len(t["boxes"])
            boxes = np.asarray(t["boxes"])
            assert (boxes >= 0).all() and (boxes[:, 0::2] <= bucket[1]).all()
            assert (boxes[:, 1::2] <= bucket[0]).all()
    assert kinds == {True, False}  # both resized and own-size records were compared


def test_coco_buckets_against_torchvision_v2(tv_python, coco_stores):
    images, annotations, out = coco_stores
    config = {"images": images, "annotations": annotations, "stores": out}
    done = run_program("bucket_parity", json.dumps(config), python=tv_python,
                       capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])  # pycocotools prints its progress first
    assert result["differing"] == [], result["differing"][:10]
    assert result["compared"] == 2 * 8 and result["own_size"] >= 2 and result["resized"] >= 8
    assert result["boxes"] >= 20 and result["mask_pixels"] > 0
