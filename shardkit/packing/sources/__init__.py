"""Sources other than image folders: WebDataset tars, Hugging Face parquet/Arrow, MosaicML MDS.

:data:`SOURCE_FORMATS` is the one list of source formats: detection, ``source_format``'s
choices (``--source-format``) and the docs derive from it. ``folder`` is the ImageFolder layout
(:mod:`shardkit.packing.discovery`); the others scan their container into the same plan, and
their images go through the same pipeline as a folder's files (:func:`encode_item`).

* :mod:`.base`        options, the scan's records, the label rules, the format base class
* :mod:`.files`       source files kept open in each encoding worker, read at an offset
* :mod:`.webdataset`  tar shards · :mod:`.parquet` parquet and Arrow · :mod:`.mds` MDS
"""

from __future__ import annotations

import os

from ...errors import PackError, PackOptionError
from .base import ContainerFormat, ContainerIndex, Item, MemberError, SourceOptions
from .mds import MDSFormat
from .parquet import ParquetFormat
from .webdataset import WebDatasetFormat, is_tar_url

FOLDER = "folder"
_CONTAINERS: dict[str, ContainerFormat] = {f.name: f for f in (
    WebDatasetFormat(), ParquetFormat(), MDSFormat())}
#: every source format, in detection order after the folder layout: name -> one-line summary
SOURCE_FORMATS: dict[str, str] = {
    FOLDER: "an ImageFolder-layout folder (SRC/<class>/<image>), or a --file-list root",
    **{name: f.summary for name, f in _CONTAINERS.items()}}

__all__ = ["SOURCE_FORMATS", "ContainerIndex", "Item", "MemberError", "SourceOptions",
           "check_source", "detect", "is_tar_url", "read_item", "scan"]


def detect(src: str) -> str:
    """The format of ``src`` from its content: MDS (an ``index.json``), a ``save_to_disk``
    folder or parquet files, tars (a file, a brace pattern, a folder holding tars), else an
    image folder."""
    for name in ("mds", "parquet", "webdataset"):
        if _CONTAINERS[name].detect(src):
            return name
    return FOLDER


def check_source(source_format: str | None, options: SourceOptions, file_list: str | None) -> None:
    """Refuse a ``source_format`` that does not exist or options it cannot use."""
    if source_format is not None and source_format not in SOURCE_FORMATS:
        raise PackOptionError(f"`source_format` must be one of {', '.join(SOURCE_FORMATS)}, "
                              f"not {source_format!r}")
    if file_list is not None and source_format not in (None, FOLDER):
        raise PackOptionError("`file_list` lists image files: it needs "
                              "`source_format='folder'`")
    if source_format == FOLDER and (options.image_key or options.label_key):
        raise PackOptionError("`image_key` and `label_key` name members of a container "
                              "source, not of an image folder")


def scan(src: str, source_format: str, options: SourceOptions):
    """Scan a container source: (root, classes, class_to_idx, samples, skipped, index)."""
    try:
        fmt = _CONTAINERS[source_format]
    except KeyError:
        raise PackError(f"{source_format!r} is not a container source format") from None
    return fmt.index(os.fspath(src), options)


def read_item(item: Item, limit: int | None) -> bytes:
    """The encoded image of one container sample (MemberError with the reason)."""
    return _CONTAINERS[item.format].read(item.file, item.a, item.b, limit)
