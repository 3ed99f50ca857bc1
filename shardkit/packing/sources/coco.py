"""COCO instances JSON (``coco``) over the image folder SRC its ``file_name`` s are relative to:
one record per COCO image, in ``CocoDetection``'s order, with boxes, labels, iscrowd, area,
image_id and masks as typed fields (the file and its geometry: :mod:`shardkit.packing.coco`)."""

from __future__ import annotations

import os

from ...errors import PackError, PackOptionError
from ..coco import CocoAnnotations
from .base import ImageFilesSource, Scan, SourceOptions


class CocoSource(ImageFilesSource):
    name = "coco"
    summary = "a COCO instances JSON (`coco`) over the image folder SRC: boxes, masks as fields"
    option = "coco"

    def check(self, options: SourceOptions) -> None:
        super().check(options)
        for other, given in (("file_list", options.file_list is not None),
                             ("metadata_file", options.metadata_file is not None),
                             ("captions", options.captions), ("schema", options.schema is not None)):
            if given:
                raise PackOptionError(f"give `coco` or `{other}`, not both")
        if options.coco_masks is not None and not isinstance(options.coco_masks, bool):
            raise PackOptionError("`coco_masks` must be True, False or None, got "
                                  f"{options.coco_masks!r}")

    def scan(self, options: SourceOptions) -> Scan:
        if not os.path.isdir(options.src):
            raise PackError(f"source folder not found: {options.src} (the folder COCO "
                            "file_names are in)")
        annotations = CocoAnnotations(options.coco, options.src, options.coco_masks)
        return Scan.of(annotations.discovery(), annotations)
