"""COCO packs on real files: CocoDetection's order, images without annotations kept, metadata,
EXIF geometry, sharded packs, and hostile annotation files (one line, never a traceback or an
unbounded allocation)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import run_cli, sources_of
from helpers.coco import CATEGORIES, make_coco

import shardkit
from shardkit.errors import PackError
from shardkit.read.store import Store

FIELDS = ["boxes", "labels", "masks", "image_id", "iscrowd", "area"]


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    base = tmp_path_factory.mktemp("coco")
    images, annotations = make_coco(str(base), 10, seed=5, exif=True)
    store = str(base / "coco.lmdb")
    result = shardkit.pack(images, store, coco=annotations, workers=1, progress=False)
    return images, annotations, store, result


def test_order_empty_images_and_metadata(coco):
    images, annotations, store, result = coco
    with open(annotations) as f:
        data = json.load(f)
    ids = sorted(img["id"] for img in data["images"])
    refused = [i for i in ids if i == 100002]  # annotated at a size matching neither
    ds = shardkit.ShardDataset(store, fields=FIELDS)
    assert [ds[i][1]["image_id"] for i in range(len(ds))] == [i for i in ids if i not in refused]
    assert [s["reason"] for s in result.skipped] == [
        "annotation: annotation size 401x300 matches neither the file's 400x300 nor its "
        "EXIF-oriented 300x400"]
    annotated = {a["image_id"] for a in data["annotations"]}
    empty = [i for i in range(len(ds)) if ds[i][1]["image_id"] not in annotated]
    assert len(empty) >= 2
    for i in empty:
        target = ds[i][1]
        assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
        assert target["masks"].shape == (0, *ds[i][0].shape[1:])
    meta = Store(store).meta
    assert meta["annotations"]["categories"] == sorted(CATEGORIES, key=lambda c: c["id"])
    assert meta["classes"] == [] and set(ds.targets.tolist()) == {-1}
    for i in range(len(ds)):  # labels are the raw category ids; iscrowd and area as annotated
        target = ds[i][1]
        want = [a for a in data["annotations"] if a["image_id"] == target["image_id"]]
        assert target["labels"].tolist() == [a["category_id"] for a in want]
        assert target["iscrowd"].tolist() == [a["iscrowd"] for a in want]
        assert target["area"].tolist() == np.float32([a["area"] for a in want]).tolist()
    assert shardkit.verify(store).ok


def test_info_shows_the_categories_of_a_coco_store(coco, capsys):
    """No empty ``classes: 0:`` line: a COCO store's category ids and names instead."""
    from shardkit.cli import main as cli_main

    store = coco[2]
    assert cli_main(["info", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "categories: 3: 1 cat, 5 dog, 90 toothbrush" in lines
    assert not any(line.startswith("classes:") for line in lines)
    assert shardkit.info(store)["categories"] == [{"id": 1, "name": "cat"},
                                                  {"id": 5, "name": "dog"},
                                                  {"id": 90, "name": "toothbrush"}]


def test_exif_photo_boxes_and_masks_follow_the_pixels(coco):
    """The annotated red object: the stored box and mask lie where the oriented pixels show
    it, whether the annotation was made on the raw or the oriented image."""
    ds = shardkit.ShardDataset(store := coco[2], fields=FIELDS)
    found = 0
    for i in range(len(ds)):
        img, target = ds[i]
        if target["image_id"] not in (100000, 100001):
            continue
        found += 1
        rgb = img.permute(1, 2, 0).numpy().astype(int)
        red = (rgb[..., 0] > 180) & (rgb[..., 1] < 90) & (rgb[..., 2] < 90)
        ys, xs = np.nonzero(red)
        x1, y1, x2, y2 = target["boxes"][0].tolist()
        assert img.shape[1:] == (341, 256)  # 300x400 oriented, shorter side 256
        assert abs(xs.min() - x1) <= 2 and abs(xs.max() + 1 - x2) <= 2
        assert abs(ys.min() - y1) <= 2 and abs(ys.max() + 1 - y2) <= 2
        mask = target["masks"][0].numpy().astype(bool)
        assert (mask & red).sum() >= 0.9 * red.sum() and (mask & ~red).sum() <= 0.1 * red.sum()
    assert found == 2
    assert os.path.exists(store)


def test_sharded_pack_and_cli(coco, tmp_path):
    images, annotations, store, _ = coco
    folder = str(tmp_path / "shards")
    done = run_cli("pack", images, folder, "--coco", annotations, "--num-shards", "3",
                   "--workers", "2", "-q")
    assert done.returncode == 0, done.stderr
    single = shardkit.ShardDataset(store, fields=FIELDS)
    sharded = shardkit.ShardDataset(folder, fields=FIELDS)
    assert len(sharded) == len(single)
    assert [sharded[i][1]["image_id"] for i in range(len(sharded))] == [
        single[i][1]["image_id"] for i in range(len(single))]  # CocoDetection's order
    by_id = {sharded[i][1]["image_id"]: sharded[i][1] for i in range(len(sharded))}
    for i in range(len(single)):
        a, b = single[i][1], by_id[single[i][1]["image_id"]]
        for key in ("boxes", "labels", "masks", "iscrowd", "area"):
            assert np.array_equal(a[key].numpy(), b[key].numpy())
    info = run_cli("info", folder, "--json")
    assert [f["name"] for f in json.loads(info.stdout)["fields"]] == [
        "boxes", "labels", "iscrowd", "area", "image_id", "masks"]
    assert run_cli("verify", folder).returncode == 0


def _coco_file(tmp_path, images_dir, data) -> str:
    path = str(tmp_path / "bad.json")
    with open(path, "w") as f:
        f.write(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("data, message", [
    ({"annotations": []}, "'images' is missing"),
    ({"images": [{"id": 1, "width": 10, "height": 10}]}, "'file_name' is missing"),
    ({"images": [{"id": 1, "file_name": "a.jpg", "width": 10, "height": 10},
                 {"id": 1, "file_name": "b.jpg", "width": 10, "height": 10}]}, "appears twice"),
    ("[1, 2", "not valid JSON"),
    ("[" * 100000 + "]" * 100000, "nests too deeply"),
])
def test_malformed_files_are_one_line_errors(tmp_path, coco, data, message):
    path = _coco_file(tmp_path, coco[0], data)
    with pytest.raises(PackError, match=message) as info:
        shardkit.pack(coco[0], str(tmp_path / "out.lmdb"), coco=path, workers=1,
                      progress=False)
    assert "\n" not in str(info.value)
    done = run_cli("pack", coco[0], str(tmp_path / "out2.lmdb"), "--coco", path, "-q")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_hostile_annotations_skip_their_image(tmp_path, coco):
    images = coco[0]
    with open(coco[1]) as f:
        data = json.load(f)
    imgs = sorted(data["images"], key=lambda i: i["id"])[:6]
    first = {"id": 1, "category_id": 1, "iscrowd": 0, "area": 1.0,
             "segmentation": [[0, 0, 5, 0, 5, 5]]}
    bad = [
        dict(first, image_id=imgs[0]["id"], bbox=[0, 0, float("nan"), 4]),
        dict(first, image_id=imgs[1]["id"], bbox=[0, 0, -3, 4]),
        dict(first, image_id=imgs[2]["id"], bbox=[0, 0, 4, 4], category_id=12345),
        dict(first, image_id=imgs[3]["id"], bbox=[0, 0, 4]),
        dict(first, image_id=imgs[4]["id"], bbox=[0, 0, 1e6, 4]),
        dict(first, image_id=imgs[5]["id"], bbox=[0, 0, 4, 4], segmentation=[[0, 1]]),
        dict(first, image_id=999999, bbox=[0, 0, 4, 4]),
    ]
    # NaN is written the way Python's json module writes it (the file is not strict JSON).
    path = _coco_file(tmp_path, images, {"images": imgs, "annotations": bad,
                                         "categories": CATEGORIES})
    result = shardkit.pack(images, str(tmp_path / "h.lmdb"), coco=path, workers=1,
                           progress=False, allow_empty=True)
    reasons = [s["reason"] for s in result.skipped]
    assert result.count == 0 and len(reasons) == 7
    for needle in ("unknown image id 999999", "not finite or has a negative size",
                   "unknown category id 12345", "not 4 numbers", "lies outside",
                   "at least 3 finite"):
        assert any(needle in r for r in reasons), (needle, reasons)
    assert sum("negative size" in r for r in reasons) == 2
    with pytest.raises(PackError, match="strict"):
        shardkit.pack(images, str(tmp_path / "s.lmdb"), coco=path, workers=1, progress=False,
                      strict=True)


def test_huge_file_refused_before_reading(tmp_path, coco):
    path = str(tmp_path / "huge.json")
    with open(path, "wb") as f:  # sparse: a 2 GiB JSON string, never written out or read
        f.write(b'{"images": [], "x": "')
        f.truncate((2 << 30) + 1)
    with pytest.raises(PackError, match="larger than") as info:
        shardkit.pack(coco[0], str(tmp_path / "x.lmdb"), coco=path, workers=1, progress=False)
    assert "\n" not in str(info.value)
    meta = str(tmp_path / "huge.jsonl")
    os.link(path, meta)
    with pytest.raises(PackError, match="larger than"):
        shardkit.pack(coco[0], str(tmp_path / "y.lmdb"), metadata_file=meta, workers=1,
                      progress=False)


def test_many_boxes_one_image(tmp_path, coco):
    """100,000 boxes on one image pack (boxes only); with masks they would need 100k planes:
    refused with the reason before any is allocated."""
    images = coco[0]
    with open(coco[1]) as f:
        data = json.load(f)
    img = sorted(data["images"], key=lambda i: i["id"])[0]
    anns = [{"id": n, "image_id": img["id"], "category_id": 5, "iscrowd": 0, "area": 4.0,
             "bbox": [n % 50, n % 40, 4, 4], "segmentation": [[0, 0, 4, 0, 4, 4]]}
            for n in range(100_000)]
    path = _coco_file(tmp_path, images, {"images": [img], "annotations": anns,
                                         "categories": CATEGORIES})
    result = shardkit.pack(images, str(tmp_path / "m.lmdb"), coco=path, workers=1,
                           progress=False, allow_empty=True)
    assert result.count == 0 and "exceed" in result.skipped[0]["reason"]
    out = str(tmp_path / "b.lmdb")
    result = shardkit.pack(images, out, coco=path, workers=1, progress=False, coco_masks=False)
    assert result.count == 1
    target = shardkit.ShardDataset(out, fields=["boxes", "labels"])[0][1]
    assert target["boxes"].shape == (100_000, 4) and target["labels"].unique().tolist() == [5]


def _images_and_ids(coco, n):
    with open(coco[1]) as f:
        data = json.load(f)
    return [img for img in sorted(data["images"], key=lambda i: i["id"])
            if img["file_name"].startswith("img_")][:n]


def test_box_past_the_border_within_a_pixel_is_clamped_and_counted(tmp_path, coco):
    """Exported files overshoot by rounding (x + w = W + 0.004): torchvision keeps the image, so
    does the pack, with the box clamped and counted in the metadata; 1.5 px out skips the image."""
    a, b = _images_and_ids(coco, 2)
    ann = {"category_id": 1, "iscrowd": 0, "area": 1.0}
    W, H = a["width"], a["height"]
    anns = [dict(ann, id=1, image_id=a["id"], bbox=[W - 10.0, 5.0, 10.004, 20.0]),
            dict(ann, id=2, image_id=a["id"], bbox=[-0.5, H - 30.0, 20.0, 30.5]),
            dict(ann, id=3, image_id=a["id"], bbox=[3.0, 4.0, 5.0, 6.0]),
            dict(ann, id=4, image_id=b["id"], bbox=[b["width"] - 10.0, 5.0, 11.5, 20.0])]
    path = _coco_file(tmp_path, coco[0], {"images": [a, b], "annotations": anns,
                                          "categories": CATEGORIES})
    out = str(tmp_path / "c.lmdb")
    result = shardkit.pack(coco[0], out, coco=path, workers=1, progress=False, size=0)
    assert result.count == 1 and len(result.skipped) == 1
    assert "lies outside" in result.skipped[0]["reason"]
    assert b["file_name"] in result.skipped[0]["path"]
    target = shardkit.ShardDataset(out, fields=["boxes", "image_id"])[0][1]
    assert target["image_id"] == a["id"]
    assert target["boxes"].tolist() == [[W - 10.0, 5.0, W, 25.0], [0.0, H - 30.0, 19.5, H],
                                        [3.0, 4.0, 8.0, 10.0]]
    annotations = Store(out).meta["annotations"]
    assert annotations["clamped_boxes"] == 2 and annotations["box_tolerance"] == 1.0


def test_one_file_under_two_image_ids_packs_both(tmp_path, coco):
    """CocoDetection serves both ids of a shared file_name: so does the pack, each record with
    its own annotations (sharded and mixed, so records move away from the file's order)."""
    a, b, c = _images_and_ids(coco, 3)
    twin = dict(a, id=max(i["id"] for i in (a, b, c)) + 1)  # a's file under a new id
    ann = {"category_id": 1, "iscrowd": 0, "area": 1.0}
    anns = [dict(ann, id=1, image_id=a["id"], bbox=[1.0, 2.0, 3.0, 4.0]),
            dict(ann, id=2, image_id=twin["id"], bbox=[10.0, 20.0, 5.0, 5.0], category_id=5),
            dict(ann, id=3, image_id=twin["id"], bbox=[0.0, 0.0, 7.0, 8.0]),
            dict(ann, id=4, image_id=c["id"], bbox=[4.0, 4.0, 4.0, 4.0])]
    path = _coco_file(tmp_path, coco[0], {"images": [twin, a, b, c], "annotations": anns,
                                          "categories": CATEGORIES})
    out = str(tmp_path / "t")
    result = shardkit.pack(coco[0], out, coco=path, workers=1, progress=False, size=0,
                           num_shards=2)
    assert result.count == 4 and result.skipped == []
    ds = shardkit.ShardDataset(out, fields=["boxes", "labels", "image_id"])
    got = {t["image_id"]: (t["boxes"].tolist(), t["labels"].tolist()) for _, t in ds}
    assert got == {a["id"]: ([[1.0, 2.0, 4.0, 6.0]], [1]),
                   twin["id"]: ([[10.0, 20.0, 15.0, 25.0], [0.0, 0.0, 7.0, 8.0]], [5, 1]),
                   b["id"]: ([], []),
                   c["id"]: ([[4.0, 4.0, 8.0, 8.0]], [1])}
    assert sorted(sources_of(out)).count(a["file_name"]) == 2
