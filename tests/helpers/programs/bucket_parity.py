"""Run under the torchvision environment (``.venv-tv``) by tests/packing/test_buckets.py.

argv: CONFIG_JSON {"images", "annotations", "stores": [paths]}. Each store is the COCO images
packed with ``buckets``; for every image (CocoDetection's, EXIF photos aside: CocoDetection does
not transpose them) it applies ``v2.Resize(size=(rh, rw))`` + ``v2.CenterCrop((bh, bw))`` to
torchvision's own sample (``wrap_dataset_for_transforms_v2``) and compares the stored record:
image size, boxes (``torch.equal``, canvas), masks (``torch.equal``), labels, and the bucket
fields. The geometry is worked out here from the rule's text, not from shardkit: the kohya
bucket set of the store's side and step, the nearest ``w / h``, one scale factor that covers
(the other side rounded up), no resize of a source smaller than its bucket (cut to its own
size in steps, never past the bucket) unless ``upscale``. Prints one JSON object.
"""

from __future__ import annotations

import json
import math
import sys
from fractions import Fraction

import torch
from torchvision import datasets, tv_tensors
from torchvision.transforms import v2

from shardkit import ShardDataset
from shardkit.read.store import Store

KEYS = ("boxes", "labels", "masks", "image_id")
BUCKET = ("original_size", "crop_top_left", "target_size")


def bucket_set(side: int, step: int) -> list[tuple[int, int]]:
    out = set()
    for w in range(step, 2 * side + 1, step):
        fits = [h for h in range(step, 8 * side + 1, step) if w * h <= side * side]
        if fits and Fraction(1, 4) <= Fraction(max(fits), w) <= 4:
            out |= {(max(fits), w), (w, max(fits))}
    return sorted(out)


def geometry(spec: dict, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(resized (h, w), bucket (h, w)) of an oriented height x width source."""
    sizes = bucket_set(spec["side"], spec["step"])
    bh, bw = min(sizes, key=lambda s: (abs(Fraction(s[1], s[0]) - Fraction(width, height)), s))
    if not spec["upscale"] and (height < bh or width < bw):
        step = spec["step"]
        return (height, width), (min(height // step * step, bh), min(width // step * step, bw))
    scale = max(Fraction(bh, height), Fraction(bw, width))
    return (math.ceil(height * scale), math.ceil(width * scale)), (bh, bw)


def plain(x):
    return x.as_subclass(torch.Tensor)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    ref = datasets.wrap_dataset_for_transforms_v2(
        datasets.CocoDetection(cfg["images"], cfg["annotations"]), target_keys=KEYS)
    out = {"compared": 0, "resized": 0, "own_size": 0, "boxes": 0, "mask_pixels": 0,
           "differing": []}
    for store in cfg["stores"]:
        spec = Store(store).meta["settings"]["buckets"]
        ours = ShardDataset(store, fields=[*KEYS, *BUCKET])
        by_id = {ours[i][1]["image_id"]: i for i in range(len(ours))}
        for j in range(len(ref)):
            image_id = ref._dataset.ids[j]
            if ref._dataset.coco.imgs[image_id]["file_name"].startswith("exif_"):
                continue
            img, target = ref[j]
            height, width = img.height, img.width
            (rh, rw), (bh, bw) = geometry(spec, height, width)
            steps = [v2.Resize(size=[rh, rw], antialias=True)] if (rh, rw) != (height, width) \
                else []
            img, target = v2.Compose([*steps, v2.CenterCrop([bh, bw])])(img, target)
            got_img, got = ours[by_id[image_id]]
            out["compared"] += 1
            out["resized" if steps else "own_size"] += 1
            top, left = int(round((rh - bh) / 2.0)), int(round((rw - bw) / 2.0))
            checks = {
                "image_size": tuple(got_img.shape[-2:]) == (bh, bw) == (img.height, img.width),
                "original_size": got["original_size"].tolist() == [height, width],
                "crop_top_left": got["crop_top_left"].tolist() == [top, left],
                "target_size": got["target_size"].tolist() == [bh, bw],
            }
            if "boxes" in target:  # torchvision: only image_id for an image without annotations
                checks |= {
                    "boxes": type(got["boxes"]) is tv_tensors.BoundingBoxes
                    and torch.equal(plain(got["boxes"]), plain(target["boxes"]))
                    and tuple(got["boxes"].canvas_size) == tuple(target["boxes"].canvas_size)
                    == (bh, bw),
                    "masks": torch.equal(plain(got["masks"]), plain(target["masks"])),
                    "labels": torch.equal(got["labels"], target["labels"]),
                }
                out["boxes"] += len(target["boxes"])
                out["mask_pixels"] += int(target["masks"].sum())
            else:
                checks["empty"] = len(got["boxes"]) == 0 and got["masks"].shape[0] == 0
            out["differing"] += [[store, image_id, k] for k, ok in checks.items() if not ok]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
