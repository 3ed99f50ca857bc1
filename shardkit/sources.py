"""The sources ``shardkit.pack`` reads, as records: ``pack(src, out, source=Coco("ann.json"))``.

:class:`Detect` (the default: SRC's format from its content), :class:`ImageFolder`
(torchvision's layout), :class:`HFImageFolder` (Hugging Face's imagefolder layout),
:class:`WebDataset`, :class:`Parquet`, :class:`MDS`, :class:`LitData`, :class:`Video` (the
frames of video files, :class:`Frames` choosing which), :class:`LeRobot` (a LeRobot dataset's
camera frames with their rows' columns), and the inputs over an
image folder: :class:`Coco`, :class:`Metadata`, :class:`Captions`, :class:`FileList`. A tuple
of records combines inputs that combine (``(FileList("list.csv"), Captions())``). Each checks
its fields when built (``OptionError`` naming ``Class.field``); docs/sources.md describes what
each reads.
"""

from __future__ import annotations

from .packing.sources.frames import Frames
from .packing.sources.specs import (MDS, Captions, Coco, Detect, FileList, HFImageFolder,
                                    ImageFolder, LeRobot, LitData, Metadata, Parquet,
                                    SourceSpec, Video, WebDataset)

__all__ = ["Captions", "Coco", "Detect", "FileList", "Frames", "HFImageFolder", "ImageFolder",
           "LeRobot", "LitData", "MDS", "Metadata", "Parquet", "SourceSpec", "Video", "WebDataset"]
