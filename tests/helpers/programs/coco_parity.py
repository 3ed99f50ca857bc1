"""Run under the torchvision environment (``.venv-tv``) by tests/fields/test_coco_torchvision.py.

argv: IMAGES_DIR INSTANCES_JSON STORE. Compares the COCO-packed store's stored targets with
torchvision's own ``wrap_dataset_for_transforms_v2(CocoDetection(...))`` followed by
``v2.Resize(256)``, image by image (the store holds CocoDetection's images in its order; EXIF
photos, which CocoDetection does not transpose, are reported separately). Prints JSON.
"""

from __future__ import annotations

import json
import sys

import torch
from torchvision import datasets, tv_tensors
from torchvision.transforms import v2

from shardkit import ShardDataset

KEYS = ("boxes", "labels", "masks", "image_id", "iscrowd", "area")


def main() -> None:
    images, annotations, store = sys.argv[1:4]
    ref = datasets.wrap_dataset_for_transforms_v2(
        datasets.CocoDetection(images, annotations), target_keys=KEYS)
    ours = ShardDataset(store, fields=list(KEYS))
    by_id = {ours[i][1]["image_id"]: i for i in range(len(ours))}
    resize = v2.Resize(256)
    out = {"compared": 0, "boxes": 0, "masks_pixels": 0, "differing": [], "order": [],
           "empty": 0, "missing": []}
    for j in range(len(ref)):
        image_id = ref.ids[j] if hasattr(ref, "ids") else ref._dataset.ids[j]
        out["order"].append(image_id)
        name = ref._dataset.coco.imgs[image_id]["file_name"]
        if name.startswith("exif_"):
            continue
        if image_id not in by_id:
            out["missing"].append(image_id)
            continue
        img, target = resize(*ref[j])
        got = ours[by_id[image_id]][1]
        out["compared"] += 1
        if "boxes" not in target:  # torchvision: only image_id for an image without annotations
            out["empty"] += 1
            if len(got["boxes"]) or got["masks"].shape[0] or got["image_id"] != image_id:
                out["differing"].append([image_id, "empty"])
            continue
        checks = {
            "boxes": type(got["boxes"]) is tv_tensors.BoundingBoxes
            and torch.equal(got["boxes"].as_subclass(torch.Tensor),
                            target["boxes"].as_subclass(torch.Tensor))
            and tuple(got["boxes"].canvas_size) == tuple(target["boxes"].canvas_size),
            "masks": type(got["masks"]) is tv_tensors.Mask
            and torch.equal(got["masks"].as_subclass(torch.Tensor),
                            target["masks"].as_subclass(torch.Tensor)),
            "labels": torch.equal(got["labels"], target["labels"]),
            "iscrowd": got["iscrowd"].tolist() == target["iscrowd"],
            "area": got["area"].tolist() == torch.tensor(target["area"]).tolist(),
            "image_id": got["image_id"] == target["image_id"],
            "image_size": tuple(ours[by_id[image_id]][0].shape[-2:]) == tuple(img.size[::-1]),
        }
        out["boxes"] += len(target["boxes"])
        out["masks_pixels"] += int(target["masks"].sum())
        for key, ok in checks.items():
            if not ok:
                out["differing"].append([image_id, key])
    out["store_order"] = [ours[i][1]["image_id"] for i in range(len(ours))]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
