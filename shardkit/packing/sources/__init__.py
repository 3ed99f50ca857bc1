"""Every input of ``pack`` is a source, and :data:`SOURCES` is the one list of them.

A source is one class in one module here, behind :class:`.base.Source`: it is asked for by a
``pack`` parameter (``coco``, ``metadata_file``/``captions``, ``file_list``) or is the format
SRC is in (``source_format``, else detected from SRC's content, in the registry's order); it
refuses options it cannot use (:meth:`~.base.Source.check`) and scans SRC into a
:class:`~.base.Scan`: the records (path, label), classes, skips, typed fields and, for a
container, the index encoding workers read members through (:func:`read_item`).
``pack`` resolves one source (:func:`resolve`), then plans, encodes and writes.

Adding an input is one module and one line below. :data:`SOURCE_FORMATS` (the formats of SRC:
``source_format``'s choices, ``--source-format``, the docs) derives from it.

* :mod:`.base`        the interface, the scan's records
* :mod:`.container`   the base of the container sources, the label rules
* :mod:`.specs`       the sources as the records a user builds (``shardkit.sources``)
* :mod:`.coco` COCO · :mod:`.metadata` metadata table and captions · :mod:`.file_list` file list
* :mod:`.litdata` LitData ``optimize`` folders · :mod:`.mds` MDS · :mod:`.parquet` parquet and
  Arrow · :mod:`.webdataset` tar shards · :mod:`.folder` ImageFolder layout (the fallback)
* :mod:`.imagefolder` Hugging Face's imagefolder layout (metadata files, splits)
* :mod:`.video` video files (``frames``): :mod:`.frames` which frames, :mod:`.video_decode`
  PyAV's demuxing and decoding
* :mod:`.lerobot` LeRobot datasets (frames aligned to their rows), :mod:`.lerobot_meta` their
  layout
* :mod:`.fields`      typed fields of container members · :mod:`.files` source files kept open
  in each encoding worker · :mod:`.encode` one container member through the image pipeline
"""

from __future__ import annotations

from ...errors import PackOptionError
from .base import ContainerIndex, Item, MemberError, Scan, Source, SourceOptions, TransferFailed
from .coco import CocoSource
from .file_list import FileListSource
from .folder import FolderSource
from .imagefolder import ImagefolderSource
from .lerobot import LeRobotSource
from .litdata import LitDataSource
from .mds import MDSSource
from .metadata import MetadataSource
from .parquet import ParquetSource
from .video import VideoSource, holds_videos
from .webdataset import WebDatasetSource, is_tar_url

#: Every source, by name, in the order they are tried: sources asked for by a parameter first,
#: then the formats SRC may be in, in detection order (the folder layout last: it takes any SRC).
SOURCES: dict[str, Source] = {s.name: s for s in (
    VideoSource(), CocoSource(), MetadataSource(), FileListSource(),
    MDSSource(), LitDataSource(), LeRobotSource(), ImagefolderSource(), ParquetSource(),
    WebDatasetSource(), FolderSource())}
#: the formats SRC may be in (``source_format``'s choices): name -> one-line summary
SOURCE_FORMATS: dict[str, str] = {n: s.summary for n, s in SOURCES.items() if s.option is None}

__all__ = ["SOURCES", "SOURCE_FORMATS", "ContainerIndex", "Item", "MemberError", "Scan",
           "Source", "SourceOptions", "TransferFailed", "detect", "is_tar_url", "read_item",
           "resolve"]


def detect(src: str) -> str:
    """The format of ``src`` from its content: the first of :data:`SOURCE_FORMATS` to claim it."""
    return next(n for n, s in SOURCES.items() if s.option is None and s.detect(src))


def resolve(options: SourceOptions) -> Source:
    """The source ``pack`` reads: the first asked for by a parameter, else the one named by
    ``source_format``, else the format detected from SRC; its options checked (one-line
    PackOptionError naming the parameter)."""
    if options.source_format is not None and options.source_format not in SOURCE_FORMATS:
        raise PackOptionError(f"`source_format` must be one of {', '.join(SOURCE_FORMATS)}, "
                              f"not {options.source_format!r}")
    source = next((s for s in SOURCES.values() if s.option is not None and s.asked(options)),
                  None)
    if source is None:
        source = SOURCES[options.source_format or detect(options.src)]
        if source.name == "folder" and holds_videos(options.src):
            raise PackOptionError(f"{options.src} holds video files: pass `frames` ('fps=2', "
                                  "'every=N', 'keyframes' or 'all') to pack their frames")
    if source.name != "lerobot":
        for name in ("cameras", "tolerance_s"):
            if getattr(options, name) is not None:
                raise PackOptionError(f"`{name}` applies to a LeRobot dataset, and SRC is read "
                                      f"as {source.name!r}")
    source.check(options)
    return source


def read_item(item: Item, limit: int | None) -> bytes:
    """The encoded image of one container sample (MemberError with the reason)."""
    return SOURCES[item.format].read(item.file, item.a, item.b, limit)
