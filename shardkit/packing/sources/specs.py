"""The sources ``shardkit.pack`` reads, as the records a user builds (``shardkit.sources``):
``pack(src, out, source=Coco("instances.json"))``.

Each record names one input and its options, checks its fields when it is built
(PackOptionError naming ``Class.field``) and says which :class:`.base.SourceOptions` it sets
(:meth:`SourceSpec.options`). A tuple of records combines them where the inputs combine (a
:class:`FileList` or a folder with :class:`Metadata` and :class:`Captions`, a
:class:`HFImageFolder` split with :class:`Captions`); two records setting the same option are
refused. The registry (:data:`shardkit.packing.sources.SOURCES`) then resolves and checks the
combination as it does for ``pack``'s keyword shortcuts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from ...errors import PackOptionError
from .frames import FORMS, Frames


class SourceSpec:
    """Base of the source records: :meth:`options` is what the record sets."""

    #: the ``source_format`` the record names (None: another record's, or detected)
    format: ClassVar[str | None] = None

    def options(self) -> dict[str, Any]:
        """The :class:`.base.SourceOptions` fields this record sets."""
        out: dict[str, Any] = {} if self.format is None else {"source_format": self.format}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                out[f.metadata.get("option", f.name)] = value
        return out

    def _refuse(self, name: str, message: str) -> None:
        raise PackOptionError(f"`{type(self).__name__}.{name}` {message}")

    def _path(self, name: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, (str, os.PathLike)):
            self._refuse(name, f"must be a path, not {value!r}")
        object.__setattr__(self, name, os.fspath(value))

    def _keys(self) -> None:
        for name in ("image_key", "label_key", "id_key"):
            value = getattr(self, name, None)
            if value is not None and not isinstance(value, str):
                self._refuse(name, f"must be a string, not {value!r}")


def _option(name: str) -> Any:
    return dataclasses.field(default=None, metadata={"option": name})


@dataclass(frozen=True)
class Detect(SourceSpec):
    """Whatever SRC is, detected from its content (docs/sources.md): the default. The keys
    choose a container's image and label members or columns (and ``id_key`` the one holding
    each record's key); ``split`` a Hugging Face imagefolder layout's split."""

    image_key: str | None = None
    label_key: str | None = None
    split: str | None = None
    id_key: str | None = None

    def __post_init__(self) -> None:
        self._keys()


@dataclass(frozen=True)
class ImageFolder(SourceSpec):
    """torchvision's ``ImageFolder`` layout: ``SRC/<class>/**/<image>``."""

    format: ClassVar[str | None] = "folder"


@dataclass(frozen=True)
class HFImageFolder(SourceSpec):
    """Hugging Face's ``imagefolder`` layout: images with ``metadata.jsonl``/``.csv``/
    ``.parquet`` (or none), split folders; ``split`` chooses one (default ``train``)."""

    format: ClassVar[str | None] = "imagefolder"
    split: str | None = None

    def __post_init__(self) -> None:
        if self.split is not None and not isinstance(self.split, str):
            self._refuse("split", f"must be a split's name, got {self.split!r}")


@dataclass(frozen=True)
class _Container(SourceSpec):
    image_key: str | None = None
    label_key: str | None = None

    def __post_init__(self) -> None:
        self._keys()


@dataclass(frozen=True)
class WebDataset(_Container):
    """WebDataset tar shards: a tar, a brace pattern, a folder of tars (also at a URL).
    ``image_key``: member suffixes, the first present (``'jpg;png'``); ``label_key``: the
    label's suffix (``'cls'``); ``id_key``: ``'__key__'`` (the sample's own key) or the suffix
    of a short text member whose content is the record's key (None: keys are
    ``tar#member`` paths)."""

    format: ClassVar[str | None] = "webdataset"
    id_key: str | None = None


@dataclass(frozen=True)
class Parquet(_Container):
    """Hugging Face parquet or Arrow files; the keys name the image and label columns, and
    ``id_key`` a column (integers or strings: ``'id'``) whose value is each record's key
    (None: keys are ``file#<row group>:<row>`` paths)."""

    format: ClassVar[str | None] = "parquet"
    id_key: str | None = None


@dataclass(frozen=True)
class MDS(_Container):
    """A MosaicML MDS folder (``index.json``); the keys name the image and label columns."""

    format: ClassVar[str | None] = "mds"


@dataclass(frozen=True)
class LitData(_Container):
    """A LitData ``optimize`` folder; the keys name the image and label leaves."""

    format: ClassVar[str | None] = "litdata"


@dataclass(frozen=True)
class Coco(SourceSpec):
    """A COCO instances JSON whose ``file_name`` s are relative to SRC: one record per image
    with boxes, labels, iscrowd, area, image_id and (``masks``; None: when the file has
    segmentations) instance masks as typed fields."""

    path: str = _option("coco")
    masks: bool | None = _option("coco_masks")

    def __post_init__(self) -> None:
        self._path("path")
        if self.masks is not None and not isinstance(self.masks, bool):
            self._refuse("masks", f"must be True, False or None, got {self.masks!r}")


@dataclass(frozen=True)
class Metadata(SourceSpec):
    """A JSON Lines or CSV/TSV table with a ``file_name`` column (paths relative to SRC): its
    other columns become typed fields of each image."""

    path: str = _option("metadata_file")

    def __post_init__(self) -> None:
        self._path("path")


@dataclass(frozen=True)
class Captions(SourceSpec):
    """The text of ``<stem>.txt`` (else ``<stem>.caption``) beside each image as the field
    ``caption``."""

    def options(self) -> dict[str, Any]:
        return {"captions": True}


@dataclass(frozen=True)
class FileList(SourceSpec):
    """A CSV/TSV file of ``path,label`` (or ``path,class-name``) lines, paths relative to SRC,
    instead of class folders; with a header row, further columns become typed fields."""

    path: str = _option("file_list")

    def __post_init__(self) -> None:
        self._path("path")


@dataclass(frozen=True)
class Video(SourceSpec):
    """Video files: a folder of them (flat, or class folders as ImageFolder), one file, or with
    :class:`FileList` a list of them; each frame ``frames`` picks (a :class:`Frames` or its
    string form: ``'fps=2'``, ``'every=N'``, ``'keyframes'``, ``'all'``) is a record with the
    fields ``video``, ``frame_index``, ``pts_seconds`` and ``video_fps`` (docs/video.md)."""

    frames: Any = None

    def __post_init__(self) -> None:
        if self.frames is None:
            self._refuse("frames", f"is needed: {FORMS}")
        try:
            parsed = Frames.parse(self.frames)
        except PackOptionError as exc:
            if str(exc).startswith("`frames` "):
                self._refuse("frames", str(exc)[len("`frames` "):])
            raise
        object.__setattr__(self, "frames", str(parsed))


@dataclass(frozen=True)
class LeRobot(SourceSpec):
    """A LeRobot dataset (v2.x or v3.0: ``meta/info.json``, parquet frame rows, one MP4 per
    camera): one record per frame row and camera, the frame nearest the row's timestamp within
    ``tolerance_s`` seconds (None: LeRobot's 1e-4), the row's columns and the task as typed
    fields (docs/sources.md). ``cameras``: the video features to pack (None: all)."""

    format: ClassVar[str | None] = "lerobot"
    cameras: Any = None
    tolerance_s: float | None = None

    def __post_init__(self) -> None:
        cams = self.cameras
        if cams is not None:
            names = (cams,) if isinstance(cams, str) else cams
            if not isinstance(names, (list, tuple)) or not names or not all(
                    isinstance(n, str) for n in names):
                self._refuse("cameras", f"must be a camera's name or a list of them, not "
                             f"{cams!r}")
            object.__setattr__(self, "cameras", tuple(names))
        tol = self.tolerance_s
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float))
                                or not tol > 0 or tol == float("inf")):
            self._refuse("tolerance_s", f"must be a number of seconds > 0, not {tol!r}")


#: the record of each ``source_format`` name
BY_FORMAT: dict[str, type[SourceSpec]] = {c.format: c for c in (  # type: ignore[misc]
    ImageFolder, HFImageFolder, WebDataset, Parquet, MDS, LitData, LeRobot)}

SourceChoice = Union[SourceSpec, tuple[SourceSpec, ...]]


def combined(source: SourceChoice | None) -> dict[str, Any]:
    """The options a record (or a tuple of records) sets; PackOptionError for a value that is
    not one, or for two records that set the same option."""
    specs = source if isinstance(source, tuple) else () if source is None else (source,)
    out: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for spec in specs:
        if not isinstance(spec, SourceSpec):
            raise PackOptionError("`source` must be a record of shardkit.sources (Coco, "
                                  f"WebDataset, ...) or a tuple of them, not {spec!r}")
        for key, value in spec.options().items():
            if key in out:
                raise PackOptionError(f"give `{owner[key]}` or `{type(spec).__name__}`, not "
                                      "both")
            out[key], owner[key] = value, type(spec).__name__
    return out
