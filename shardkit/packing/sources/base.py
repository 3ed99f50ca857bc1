"""The source interface and what every source shares.

* :class:`SourceOptions`  what ``pack`` was asked to read (SRC and the parameters about it)
* :class:`Source`         one input: ``detect`` / ``asked``, ``check``, ``scan``; ``read`` (containers)
* :class:`Scan`           what a scan returns: records (path, label), classes, skips, fields, index
* :class:`~shardkit.packing.record_fields.RecordFields`  each record's typed fields (the interface)
* :class:`ImageFilesSource`  base of the sources whose records are image files (folder, file
  list, COCO, metadata): workers read the files themselves
* :class:`ContainerIndex`  the plan's view of a container source (:mod:`.container` holds the
  base of those sources: WebDataset, parquet, MDS, LitData)

A scan reads only what decides the plan (member names, offsets, labels); image bytes are read
later, by the encoding workers, through the small :data:`Item` tuples the plan hands out.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ...errors import PackOptionError, StoreError
from ...urls import is_url
from ..discovery import Discovery
from ..record_fields import RecordFields


class MemberError(Exception):
    """A member cannot be read; the message is the skip reason."""


class TransferFailed(StoreError):
    """A source's bytes at a URL could not be fetched: a request refused or failed after its
    retries (the message names the object and the cause). An error of the pack, never a skipped
    image; not a PackError, so the Dask engine runs the shard again (``retries``): the fault
    may pass."""


class Item(NamedTuple):
    """One sample's image, as an encoding worker reads it: ``read(file, a, b)`` of ``format``.

    ``a``/``b`` mean what the format says (a tar: data offset and size; parquet: row group and
    row; MDS: sample and column)."""

    format: str
    file: str
    a: int
    b: int


@dataclass(frozen=True)
class SourceOptions:
    """What ``pack`` was asked to read: SRC and the parameters that choose and shape its source
    (each as :func:`shardkit.pack` documents it)."""

    src: str = ""
    source_format: str | None = None
    #: which members/columns hold the image and the label (``None``: the format's defaults)
    image_key: str | None = None
    label_key: str | None = None
    #: the member/column whose value is each record's key (None: keys are source paths)
    id_key: str | None = None
    file_list: str | None = None
    coco: str | None = None
    coco_masks: bool | None = None
    metadata_file: str | None = None
    captions: bool = False
    schema: Any = None
    allow_empty: bool = False
    #: the split of a Hugging Face imagefolder layout to pack (None: its default, ``train``)
    split: str | None = None
    #: the frames of each video to pack (``'fps=2'`` or a :class:`.frames.Frames`); given: SRC
    #: holds videos (:mod:`.video`)
    frames: Any = None
    #: a LeRobot dataset's cameras to pack (None: every video camera) and the farthest a frame
    #: may be from its row's timestamp (None: LeRobot's 1e-4 s) (:mod:`.lerobot`)
    cameras: Any = None
    tolerance_s: float | None = None

    @staticmethod
    def keys(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
        """``'jpg;png'`` -> ``('jpg', 'png')`` (WebDataset's alternatives syntax)."""
        if text is None:
            return default
        keys = tuple(k.strip() for k in text.split(";") if k.strip())
        return keys or default


@dataclass
class ContainerIndex:
    """The plan's view of a container source: per sample, the shard and the two read numbers.

    numpy arrays, so a million-sample plan stays small (and cheap to send to Dask workers)."""

    format: str
    files: list[str]
    shard: np.ndarray   # int32, per sample
    refs: np.ndarray    # int64 (n, 2)
    shard_starts: list[int]  # first sample of each source shard, then n

    def item(self, i: int) -> Item:
        a, b = self.refs[i]
        return Item(self.format, self.files[int(self.shard[i])], int(a), int(b))

    def items(self) -> list[Item] | _Items:
        """Every sample's :class:`Item`, in order (a sequence built as it is indexed)."""
        return _Items(self)

    def snap(self, bounds: list[int]) -> list[int]:
        """Shard boundaries moved onto source-shard boundaries where one is near (within half
        a shard), so output shards hold whole source shards and one task reads each."""
        n, starts = bounds[-1], np.asarray(self.shard_starts[1:-1], dtype=np.int64)
        if len(bounds) <= 2 or not len(starts):
            return bounds
        half = max(1, n // (len(bounds) - 1)) / 2
        out = [0]
        for b in bounds[1:-1]:
            near = int(starts[np.abs(starts - b).argmin()])
            b = near if abs(near - b) <= half else b
            if out[-1] < b < n:
                out.append(b)
        return out + [n]


class _Items(Sequence):
    def __init__(self, index: ContainerIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index.refs)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.index.item(j) for j in range(*i.indices(len(self)))]
        return self.index.item(i)


@dataclass
class Scan(Discovery):
    """A source scanned: its records in order, ``(path, label)`` (a file's path, or a container
    member's display name), the classes, the sources skipped, and what else the plan needs."""

    #: the records' typed fields, or None
    fields: RecordFields | None = None
    #: where workers read each record's image; None: each record's path is an image file
    index: ContainerIndex | None = None

    @classmethod
    def of(cls, found: Discovery, fields: RecordFields | None = None) -> Scan:
        """The scan of image files listed by :mod:`shardkit.packing.discovery`."""
        return cls(found.root, found.classes, found.class_to_idx, found.samples, found.skipped,
                   found.count, fields=fields)


class Source:
    """One kind of input of ``pack``: a name in :data:`shardkit.packing.sources.SOURCES`.

    A source is chosen either by a ``pack`` parameter that asks for it (:attr:`option`:
    ``coco``, ``metadata_file``, ``file_list``...; :meth:`asked`) or, with none of those, as the
    format SRC is in (``source_format``, else :meth:`detect` from SRC's content). Then
    :meth:`check` refuses options it cannot use, before any work, and :meth:`scan` lists what it
    holds. Sources hold no state: each is one instance in the registry.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: the ``pack`` parameter that asks for this source; None: a format of SRC itself (one of
    #: ``source_format``'s choices, :data:`SOURCE_FORMATS`)
    option: ClassVar[str | None] = None
    #: whether SRC may be a URL (else it must be a local path)
    remote: ClassVar[bool] = False
    #: whether the source has splits (``split`` chooses one)
    splits: ClassVar[bool] = False
    #: whether a column or member of the source can key its records (``id_key``)
    keyed: ClassVar[bool] = False

    def asked(self, options: SourceOptions) -> bool:
        """Whether the options ask for this source (an :attr:`option` source)."""
        return self.option is not None and getattr(options, self.option) is not None

    def detect(self, src: str) -> bool:
        """Whether ``src`` (a path or pattern) is in this format, from its content."""
        return False

    def check(self, options: SourceOptions) -> None:
        """Refuse options this source cannot use (PackOptionError naming the parameter)."""
        if not self.remote and is_url(options.src):
            raise PackOptionError(f"{options.src}: the source folder must be a local path (only "
                                  "OUT may be a URL)")
        if options.id_key is not None and not self.keyed:
            raise PackOptionError(
                "`id_key` names the column or member holding each record's key in a parquet or "
                f"WebDataset source, and SRC is read as {self.name!r}")
        if options.split is not None and not self.splits:
            raise PackOptionError(
                "`split` chooses a split of a Hugging Face imagefolder layout, and SRC is read as "
                f"{self.name!r} (docs/sources.md says how the layout is detected); pass "
                "`source_format='imagefolder'` to read it as that layout")

    def scan(self, options: SourceOptions) -> Scan:
        """List the records (PackError, one line, for a source that cannot be used)."""
        raise NotImplementedError

    def scan_into(self, options: SourceOptions, folder: str, lister: Any = None) -> Scan:
        """:meth:`scan`, with the records written into the plan folder ``folder``
        (:mod:`..plan_store`; the Scan's ``count`` says how many) where the source can stream
        them there; by default they stay in ``samples`` (the plan writes them). ``lister``
        runs listing tasks (:data:`..discovery.Lister`), e.g. on a Dask cluster."""
        return self.scan(options)

    @staticmethod
    def read(file: str, a: int, b: int, limit: int | None) -> bytes:
        """The encoded image of one container sample (raise MemberError with the reason)."""
        raise NotImplementedError


class ImageFilesSource(Source):
    """A source whose records are image files under SRC (encoding workers read them)."""

    def parameter(self, options: SourceOptions) -> str:
        """The ``pack`` parameter that asked for this source, as errors name it."""
        return self.option or "source_format"

    def check(self, options: SourceOptions) -> None:
        super().check(options)
        if options.file_list is not None and is_url(options.file_list):
            raise PackOptionError(f"{options.file_list}: `file_list` must be a local path (only "
                                  "OUT may be a URL)")
        if options.source_format not in (None, "folder"):
            raise PackOptionError(f"`{self.parameter(options)}` reads image files: it needs "
                                  "`source_format='folder'`")
        if options.image_key or options.label_key:
            raise PackOptionError("`image_key` and `label_key` name members of a container "
                                  "source, not of an image folder")
