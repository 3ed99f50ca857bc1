"""COCO instances JSON (the fields of the COCO source, :mod:`shardkit.packing.sources.coco`): one record per COCO image, in ``CocoDetection``'s order
(``sorted`` image ids), images without annotations kept (zero boxes).

Each record's fields are what ``wrap_dataset_for_transforms_v2(CocoDetection(...))`` returns,
moved onto the stored image: ``boxes`` (XYXY float32: ``x + w`` in float32, as torchvision
converts), ``labels`` (the raw ``category_id`` s), ``iscrowd``, ``area`` (as annotated),
``image_id``, and, when the file has segmentations, ``masks`` (polygons and RLE decoded with
pycocotools exactly as torchvision does, one per box). Category names go into the metadata.

Geometry: the annotation's ``width``/``height`` is compared with the file. Equal to its raw size
with an EXIF orientation: boxes and masks get the pixels' transpose. Equal to the oriented size:
kept. Neither: the image is refused with the reason. Then boxes scale to the stored size as
``v2.Resize`` scales ``BoundingBoxes`` and masks as it scales ``Mask`` (nearest).

Keypoints are not packed: torchvision's COCO wrapper does not return them either, and their
per-keypoint visibility flags need a kind of their own (a follow-up); use a ``json`` field.

Boxes past the border: exported files often overshoot by a rounding error (``x + w`` a few
thousandths past ``width``), which torchvision serves as is. A box that leaves the annotated image
by at most ``BOX_TOLERANCE`` (1 pixel) is clamped to it, and the metadata's ``annotations``
records how many were (``clamped_boxes``, with ``box_tolerance``); one further out skips its image
with the reason.

One ``file_name`` under two image ids: both are packed, one record each with its own
annotations (as ``CocoDetection`` serves both).

Hostile files: a JSON file over ``max_bytes`` is refused before it is read; malformed entries
give one-line errors naming the entry; an annotation naming an unknown image is listed as
skipped; a bad annotation (unknown category, NaN or negative box, box more than
``BOX_TOLERANCE`` outside the image, broken segmentation, masks over ``MAX_MASK_PIXELS``) skips
its image with the reason.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import PackError
from ..fields import Boxes, FieldError, Int, Masks, PerBox, Schema
from ..fields.kinds import check_boxes
from ..fileutil import read_bounded
from .discovery import Discovery
from .record_fields import RecordFields

MAX_COCO_BYTES = 2 << 30  # the 2017 train instances file is 448 MB; LVIS v1 train 1.1 GB
MAX_MASK_PIXELS = 1 << 30  # boxes x height x width of one image's masks, before packing
MAX_BOXES = 1 << 20
#: Pixels a box may overshoot the annotated image and be clamped to it (beyond: image skipped).
BOX_TOLERANCE = 1.0


@dataclass
class CocoImage:
    id: int
    file_name: str
    width: int
    height: int
    anns: list[dict[str, Any]] = field(default_factory=list)


class CocoAnnotations(RecordFields):
    """A parsed COCO instances file: images (sorted by id) with their annotations, categories,
    the schema of the fields it packs, and :meth:`fields` for one image."""

    def __init__(self, path: str | os.PathLike, root: str, masks: bool | None = None,
                 max_bytes: int = MAX_COCO_BYTES) -> None:
        self.path, self.root = os.fspath(path), root
        raw = read_bounded(self.path, max_bytes, "COCO",
                           folder="the COCO annotations must be a JSON file")
        self.sha256 = hashlib.sha256(raw).hexdigest()
        data = _parse(raw, self.path)
        where = self.path
        images = _need_list(data, "images", where)
        self.categories = _categories(data.get("categories", []), where)
        ids = {c["id"] for c in self.categories}
        by_id: dict[int, CocoImage] = {}
        for n, img in enumerate(images):
            if not isinstance(img, dict):
                raise PackError(f"{where}: images[{n}] is not an object")
            entry = CocoImage(_int(img, "id", f"{where}: images[{n}]"),
                              _str(img, "file_name", f"{where}: images[{n}]"),
                              _int(img, "width", f"{where}: images[{n}]", 1),
                              _int(img, "height", f"{where}: images[{n}]", 1))
            if entry.id in by_id:
                raise PackError(f"{where}: image id {entry.id} appears twice")
            by_id[entry.id] = entry
        #: Annotations left out at load: (where, reason), listed in the store's skipped list.
        self.skipped: list[dict[str, str]] = []
        anns = data.get("annotations", [])
        if not isinstance(anns, list):
            raise PackError(f"{where}: 'annotations' is not a list")
        segmented = False
        for n, ann in enumerate(anns):
            if not isinstance(ann, dict):
                raise PackError(f"{where}: annotations[{n}] is not an object")
            image_id = ann.get("image_id")
            target = by_id.get(image_id) if isinstance(image_id, int) else None
            if target is None:
                self.skipped.append({"path": f"{where}#annotations[{n}]",
                                     "reason": f"unknown image id {image_id!r}"})
                continue
            if ann.get("category_id") not in ids:
                ann = {**ann, "_bad": f"annotation {ann.get('id', n)!r}: unknown category id "
                                      f"{ann.get('category_id')!r}"}
            segmented |= "segmentation" in ann
            target.anns.append(ann)
        self.images = [by_id[k] for k in sorted(by_id)]
        self.masks = segmented if masks is None else bool(masks)
        if self.masks:
            try:
                import pycocotools.mask  # noqa: F401
            except ImportError:
                raise PackError("COCO segmentations need pycocotools: pip install "
                                "'shardkit[coco]' (or pass `coco_masks=False`)") from None
        fields = [Boxes("boxes", max_rows=MAX_BOXES), PerBox("labels", "int64"),
                  PerBox("iscrowd", "int64"), PerBox("area", "float32"), Int("image_id")]
        if self.masks:
            fields.append(Masks("masks", max_bytes=MAX_MASK_PIXELS // 8 + 64))
        self.schema = Schema(fields)

    # -- what the packer asks (see ``PackPlan.fields``) ----------------------------------------------

    def discovery(self) -> Discovery:
        """The sources: every image's file, label -1 (a COCO store has no class-folder label).

        A file under two image ids is two sources with the same path: :meth:`fields_at` tells
        them apart by their position here."""
        paths = [os.path.join(self.root, img.file_name) for img in self.images]
        self._index: dict[str, int] = {}
        for i, p in enumerate(paths):
            self._index.setdefault(p, i)
        return Discovery(self.root, [], {}, [(p, -1) for p in paths], list(self.skipped))

    def plan_key(self) -> str:
        return f"coco:{self.sha256}:masks={self.masks}"

    def meta(self) -> dict[str, Any]:
        return {"annotations": {"kind": "coco", "file": os.path.basename(self.path),
                                "sha256": self.sha256, "categories": self.categories,
                                "box_tolerance": BOX_TOLERANCE,
                                "clamped_boxes": self.clamped_boxes()}}

    def clamped_boxes(self) -> int:
        """Boxes clamped to their image (within ``BOX_TOLERANCE``) in the images whose boxes are
        otherwise good (an image skipped for a box further out counts none)."""
        if not hasattr(self, "_clamped_count"):
            count = 0
            for img in self.images:
                try:
                    count += _clamped(_boxes(img), img.width, img.height)[1]
                except FieldError:
                    pass
            self._clamped_count = count
        return self._clamped_count

    def fields(self, path: str, height: int, width: int) -> dict[str, Any]:
        """The fields of the image at ``path`` on its stored ``height`` x ``width`` pixels
        (FieldError: the reason it is skipped); a file under two ids: the first id's."""
        if not hasattr(self, "_index"):
            self.discovery()
        return self.fields_at(self._index[path], path, height, width)

    def fields_at(self, index: int, path: str, height: int, width: int) -> dict[str, Any]:
        """The fields of source ``index`` (its position in :meth:`discovery`'s samples), whose
        file is at ``path``."""
        import torch

        from ..fields import geometry

        img = self.images[index]
        if os.path.isabs(img.file_name) or ".." in img.file_name.replace("\\", "/").split("/"):
            raise FieldError(f"file_name {img.file_name!r} lies outside the image folder")
        bad = next((a["_bad"] for a in img.anns if "_bad" in a), None)
        if bad:
            raise FieldError(bad)
        orientation, canvas = _canvas(path, img)
        boxes = _clamped(_boxes(img), img.width, img.height)[0]
        check_boxes(boxes, img.height, img.width, "boxes")
        masks = _masks(img) if self.masks else None
        if orientation != 1:
            boxes = orient_boxes(boxes, orientation, img.width, img.height)
            masks = None if masks is None else np.ascontiguousarray(orient(masks, orientation))
        t_boxes = geometry.resize_boxes(torch.from_numpy(boxes), canvas, (height, width))
        out: dict[str, Any] = {
            "boxes": t_boxes.numpy(),
            "labels": [a["category_id"] for a in img.anns],
            "iscrowd": [_flag(a) for a in img.anns],
            "area": [_area(a) for a in img.anns],
            "image_id": img.id,
        }
        if masks is not None:
            out["masks"] = geometry.resize_masks(torch.from_numpy(masks), (height, width)).numpy()
        return out


def _parse(raw: bytes, where: str) -> dict[str, Any]:
    import json

    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PackError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise PackError(f"{where}: JSON nests too deeply") from None
    if not isinstance(data, dict):
        raise PackError(f"{where}: a COCO file is a JSON object with 'images' and 'annotations'")
    return data


def _need_list(data: dict, key: str, where: str) -> list:
    value = data.get(key)
    if not isinstance(value, list):
        raise PackError(f"{where}: {key!r} is missing or not a list")
    return value


def _int(obj: dict, key: str, where: str, minimum: int | None = None) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or (
            minimum is not None and value < minimum):
        raise PackError(f"{where}: {key!r} is missing or not a valid integer ({value!r})")
    return value


def _str(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value or "\0" in value:
        raise PackError(f"{where}: {key!r} is missing or not a file name")
    return value


def _categories(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise PackError(f"{where}: 'categories' is not a list")
    out, seen = [], set()
    for n, cat in enumerate(raw):
        if not isinstance(cat, dict):
            raise PackError(f"{where}: categories[{n}] is not an object")
        cid = _int(cat, "id", f"{where}: categories[{n}]")
        if cid in seen:
            raise PackError(f"{where}: category id {cid} appears twice")
        seen.add(cid)
        name = cat.get("name", str(cid))
        out.append({"id": cid, "name": str(name)[:1000],
                    "supercategory": str(cat.get("supercategory", ""))[:1000]})
    return sorted(out, key=lambda c: c["id"])


def _canvas(path: str, img: CocoImage) -> tuple[int, tuple[int, int]]:
    """(EXIF orientation to apply to the annotations, their (height, width) after it)."""
    from PIL import Image

    from .imaging import exif_orientation

    try:
        with Image.open(path) as im:
            raw_w, raw_h = im.size
            orientation = exif_orientation(im)
    except Exception as exc:  # noqa: BLE001 - the image itself is rejected by the encoder too
        raise FieldError(f"cannot read the image header: {exc}") from None
    swapped = orientation in (5, 6, 7, 8)
    oriented = (raw_h, raw_w) if swapped else (raw_w, raw_h)
    given = (img.width, img.height)
    if orientation != 1 and given == (raw_w, raw_h):
        return orientation, ((raw_w, raw_h)[::-1] if not swapped else (raw_w, raw_h))
    if given == oriented:
        return 1, (img.height, img.width)
    raise FieldError(f"annotation size {img.width}x{img.height} matches neither the file's "
                     f"{raw_w}x{raw_h} nor its EXIF-oriented {oriented[0]}x{oriented[1]}")


def _boxes(img: CocoImage) -> np.ndarray:
    rows = []
    for n, a in enumerate(img.anns):
        bbox = a.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)):
            raise FieldError(f"annotation {a.get('id', n)!r}: 'bbox' is missing or not 4 numbers")
        if not all(math.isfinite(v) for v in bbox) or bbox[2] < 0 or bbox[3] < 0:
            raise FieldError(f"annotation {a.get('id', n)!r}: bbox {bbox} is not finite or has "
                             "a negative size")
        rows.append(bbox)
    xywh = np.array(rows, dtype=np.float32).reshape(-1, 4)
    # torchvision: BoundingBoxes(XYWH) in float32, then x2 = x + w, y2 = y + h in float32.
    return np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)


def _clamped(boxes: np.ndarray, width: int, height: int) -> tuple[np.ndarray, int]:
    """XYXY boxes clamped to the ``width`` x ``height`` image where they leave it by at most
    ``BOX_TOLERANCE``, and how many were; FieldError for a box further out."""
    limits = np.array([width, height, width, height], dtype=np.float32)
    over = (boxes < 0) | (boxes > limits)
    if not over.any():
        return boxes, 0
    far = (boxes < -BOX_TOLERANCE) | (boxes > limits + BOX_TOLERANCE)
    if far.any():
        n = int(np.flatnonzero(far.any(axis=1))[0])
        raise FieldError(f"box {n} {boxes[n].tolist()} lies outside the {width}x{height} image "
                         f"by more than {BOX_TOLERANCE:g} pixel")
    return np.clip(boxes, 0, limits), int(over.any(axis=1).sum())


def _flag(a: dict) -> int:
    value = a.get("iscrowd", 0)
    if value not in (0, 1):
        raise FieldError(f"annotation {a.get('id')!r}: iscrowd must be 0 or 1, got {value!r}")
    return int(value)


def _area(a: dict) -> float:
    value = a.get("area", 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError(f"annotation {a.get('id')!r}: area {value!r} is not a finite number")
    return float(value)


def _masks(img: CocoImage) -> np.ndarray:
    """One (height, width) uint8 mask per annotation, decoded as torchvision's wrapper does."""
    from pycocotools import mask as coco_mask

    h, w = img.height, img.width
    if len(img.anns) * h * w > MAX_MASK_PIXELS:
        raise FieldError(f"{len(img.anns)} masks of {w}x{h} exceed {MAX_MASK_PIXELS} mask pixels")
    out = np.zeros((len(img.anns), h, w), dtype=np.uint8)
    for n, a in enumerate(img.anns):
        seg = a.get("segmentation")
        what = f"annotation {a.get('id', n)!r}: segmentation"
        if isinstance(seg, dict):
            counts, size = seg.get("counts"), seg.get("size")
            if size != [h, w]:
                raise FieldError(f"{what} RLE size {size!r} is not the image's [{h}, {w}]")
            if isinstance(counts, list):
                if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                           for c in counts) or sum(counts) != h * w:
                    raise FieldError(f"{what} RLE counts do not cover the {w}x{h} image")
                seg = coco_mask.frPyObjects(seg, h, w)
            elif isinstance(counts, str):
                seg = {"size": size, "counts": counts.encode("ascii", "replace")}
            else:
                raise FieldError(f"{what} RLE counts are neither a list nor a string")
        elif isinstance(seg, list):
            if not seg or not all(
                    isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 and all(
                        isinstance(v, (int, float)) and not isinstance(v, bool)
                        and math.isfinite(v) for v in p) for p in seg):
                raise FieldError(f"{what} polygons must be lists of at least 3 finite (x, y) "
                                 "points")
            seg = coco_mask.merge(coco_mask.frPyObjects(seg, h, w))
        else:
            raise FieldError(f"{what} is missing or neither polygons nor RLE")
        try:
            decoded = coco_mask.decode(seg)
        except Exception as exc:  # noqa: BLE001 - pycocotools reports a bad RLE string so
            raise FieldError(f"{what} does not decode: {exc}") from None
        if decoded.shape != (h, w):
            raise FieldError(f"{what} decodes to {decoded.shape}, not the image's ({h}, {w})")
        out[n] = decoded
    return out


def orient(masks: np.ndarray, orientation: int) -> np.ndarray:
    """(..., H, W) planes transposed as EXIF ``orientation`` transposes the pixels
    (``ImageOps.exif_transpose``; the packer's ``imaging`` applies the same to the image)."""
    t = np.swapaxes
    return {2: lambda m: m[..., ::-1],
            3: lambda m: m[..., ::-1, ::-1],
            4: lambda m: m[..., ::-1, :],
            5: lambda m: t(m, -1, -2),
            6: lambda m: t(m, -1, -2)[..., ::-1],
            7: lambda m: t(m[..., ::-1, ::-1], -1, -2),
            8: lambda m: t(m, -1, -2)[..., ::-1, :]}[orientation](masks)


def orient_boxes(boxes: np.ndarray, orientation: int, width: int, height: int) -> np.ndarray:
    """XYXY boxes on a ``width`` x ``height`` raw image moved as :func:`orient` moves pixels."""
    x1, y1, x2, y2 = boxes.T
    W, H = np.float32(width), np.float32(height)
    new = {2: (W - x2, y1, W - x1, y2),
           3: (W - x2, H - y2, W - x1, H - y1),
           4: (x1, H - y2, x2, H - y1),
           5: (y1, x1, y2, x2),
           6: (H - y2, x1, H - y1, x2),
           7: (H - y2, W - x2, H - y1, W - x1),
           8: (y1, W - x2, y2, W - x1)}[orientation]
    return np.stack(new, axis=1).astype(np.float32)


__all__ = ["BOX_TOLERANCE", "CocoAnnotations", "MAX_COCO_BYTES", "orient", "orient_boxes"]
