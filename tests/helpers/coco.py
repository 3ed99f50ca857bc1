"""COCO-style test data: real images and an instances JSON with polygons, RLE (list and string
counts), crowd boxes, boxes on the borders, tiny boxes, images without annotations, unsorted
image ids, non-contiguous category ids, and EXIF-oriented photos."""

from __future__ import annotations

import io
import json
import os

import numpy as np
from PIL import Image

CATEGORIES = [{"id": 1, "name": "cat", "supercategory": "animal"},
              {"id": 5, "name": "dog", "supercategory": "animal"},
              {"id": 90, "name": "toothbrush", "supercategory": "indoor"}]


def _image(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """Smooth photo-like pixels (JPEG-friendly) with a little noise."""
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)),
                     ((xx + yy) * 127 // max(w + h, 1))], axis=2)
    return np.clip(base + rng.integers(-8, 8, (h, w, 3)), 0, 255).astype(np.uint8)


def _rle_counts(mask: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE (column-major runs, starting with zeros)."""
    flat = mask.flatten(order="F")
    counts, last, run = [], 0, 0
    for v in flat:
        if v != last:
            counts.append(run)
            run, last = 0, v
        run += 1
    counts.append(run)
    return counts


def _annotations(rng, image_id: int, w: int, h: int, start_id: int) -> list[dict]:
    from pycocotools import mask as coco_mask

    anns = []
    kinds = ["polygon", "polygon", "rle_list", "rle_string", "border", "tiny", "far_corner"]
    for n, kind in enumerate(kinds[:int(rng.integers(1, len(kinds) + 1))]):
        cat = CATEGORIES[int(rng.integers(0, len(CATEGORIES)))]["id"]
        ann = {"id": start_id + n, "image_id": image_id, "category_id": cat, "iscrowd": 0}
        if kind in ("polygon", "border", "tiny", "far_corner"):
            if kind == "border":
                x0, y0, x1, y1 = 0.0, 0.0, float(w), float(h) * 0.4
            elif kind == "tiny":
                x0, y0 = float(rng.uniform(5, w - 10)), float(rng.uniform(5, h - 10))
                x1, y1 = x0 + 0.6, y0 + 0.6
            elif kind == "far_corner":
                x0, y0, x1, y1 = w - 20.5, h - 15.25, float(w), float(h)
            else:
                x0, y0 = float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2))
                x1, y1 = float(rng.uniform(x0 + 5, w)), float(rng.uniform(y0 + 5, h))
            poly = [x0, y0, x1, y0, x1, y1, (x0 + x1) / 2, (y0 + y1) / 2 + 1, x0, y1]
            ann["segmentation"] = [poly]
            ann["bbox"] = [x0, y0, x1 - x0, y1 - y0]
            ann["area"] = float((x1 - x0) * (y1 - y0))
        else:
            mask = np.zeros((h, w), np.uint8)
            x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
            x1, y1 = int(rng.integers(x0 + 3, w)), int(rng.integers(y0 + 3, h))
            mask[y0:y1, x0:x1] = 1
            mask[y0:y0 + 2, x0:x1] = 0  # not a plain rectangle
            ann["iscrowd"] = 1 if kind == "rle_list" else 0
            if kind == "rle_list":
                ann["segmentation"] = {"size": [h, w], "counts": _rle_counts(mask)}
            else:
                rle = coco_mask.encode(np.asfortranarray(mask))
                ann["segmentation"] = {"size": [h, w], "counts": rle["counts"].decode("ascii")}
            ann["bbox"] = [float(x0), float(y0 + 2), float(x1 - x0), float(y1 - y0 - 2)]
            ann["area"] = float(mask.sum())
        anns.append(ann)
    return anns


def make_coco(root: str, count: int = 12, seed: int = 0, *, empty_every: int = 4,
              exif: bool = False, large: bool = False) -> tuple[str, str]:
    """Images under ``root/images`` and ``root/instances.json``; returns (images dir, json).

    With ``exif``: three more JPEGs with EXIF orientation 6, annotated at the raw size
    (transposed by the packer), at the oriented size (kept), and at neither (refused).
    With ``large``: a 671x625 JPEG (decoded DCT-scaled at size 256; stored 274x256) under two
    image ids, each with its own annotations (as CocoDetection serves both).
    """
    rng = np.random.default_rng(seed)
    images_dir = os.path.join(root, "images")
    os.makedirs(images_dir, exist_ok=True)
    ids = [int(v) for v in rng.permutation(np.arange(1, 4 * count + 1))[:count] * 7]
    images, anns = [], []
    for n, image_id in enumerate(ids):
        w, h = int(rng.integers(300, 480)), int(rng.integers(280, 470))
        name = f"img_{n:03d}.{'png' if n % 3 == 2 else 'jpg'}"
        Image.fromarray(_image(rng, w, h)).save(os.path.join(images_dir, name),
                                                quality=92)
        images.append({"id": image_id, "file_name": name, "width": w, "height": h})
        if empty_every and n % empty_every == 1:
            continue  # an image without annotations
        anns += _annotations(rng, image_id, w, h, 1000 * (n + 1))
    if exif:
        for n, mode in enumerate(("raw", "oriented", "neither")):
            w, h = 400, 300  # raw (as stored in the file); orientation 6 shows it 300x400
            pixels = np.full((h, w, 3), 128, np.uint8)  # grey: only the object is red
            pixels[40:100, 250:350] = (255, 0, 0)  # the annotated object, in raw coordinates
            exif_data = Image.Exif()
            exif_data[0x0112] = 6
            name = f"exif_{mode}.jpg"
            Image.fromarray(pixels).save(os.path.join(images_dir, name), quality=95,
                                         exif=exif_data.tobytes())
            image_id = 100000 + n
            size = {"raw": (w, h), "oriented": (h, w), "neither": (w + 1, h)}[mode]
            images.append({"id": image_id, "file_name": name, "width": size[0],
                           "height": size[1]})
            box = [250.0, 40.0, 100.0, 60.0] if mode != "oriented" else [200.0, 250.0, 60.0, 100.0]
            x, y, bw, bh = box
            anns.append({"id": 900000 + n, "image_id": image_id, "category_id": 1, "iscrowd": 0,
                         "bbox": box, "area": bw * bh,
                         "segmentation": [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]})
    if large:
        w, h = 671, 625
        name = "large.jpg"
        Image.fromarray(_image(rng, w, h)).save(os.path.join(images_dir, name), quality=92)
        for n in range(2):
            image_id = 200000 + n
            images.append({"id": image_id, "file_name": name, "width": w, "height": h})
            anns += _annotations(rng, image_id, w, h, 2000000 + 1000 * n)
    path = os.path.join(root, "instances.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": anns, "categories": CATEGORIES}, f)
    return images_dir, path


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=92)
    return buf.getvalue()
