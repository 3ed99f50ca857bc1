"""What every container source shares: the options, the index a scan builds, the label rules,
and the base class whose :meth:`ContainerFormat.scan` each format's reader plugs into.

A scan reads only what decides the plan (member names, offsets, labels); image bytes are read
later, by the encoding workers, through the small :data:`Item` tuples the plan hands out.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ...errors import PackError

_INT = re.compile(r"\s*-?[0-9]+\s*")


class MemberError(Exception):
    """A member cannot be read; the message is the skip reason."""


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
    """Which members/columns hold the image and the label (``None``: the format's defaults)."""

    image_key: str | None = None
    label_key: str | None = None

    @staticmethod
    def keys(text: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
        """``'jpg;png'`` -> ``('jpg', 'png')`` (WebDataset's alternatives syntax)."""
        if text is None:
            return default
        keys = tuple(k.strip() for k in text.split(";") if k.strip())
        return keys or default


@dataclass
class Shard:
    """One source shard (a tar, a parquet file, an MDS shard): its samples, fixed by the scan."""

    file: str                 # absolute path, what workers open
    name: str                 # relative to the source root, what the skip list names
    members: list[str] = field(default_factory=list)  # display name per sample
    refs: list[tuple[int, int]] = field(default_factory=list)
    labels: list[Any] = field(default_factory=list)   # raw: int, str or None
    fields: list[dict[str, Any]] = field(default_factory=list)  # typed field values, if any


@dataclass
class Scanned:
    """A whole source scanned: its shards in order, the class names it declares, refusals."""

    root: str
    shards: list[Shard]
    names: list[str] | None = None        # ClassLabel names, a `classes` list
    skipped: list[dict[str, str]] = field(default_factory=list)


@dataclass
class ContainerIndex:
    """The plan's view of a container source: per sample, the shard and the two read numbers.

    numpy arrays, so a million-sample plan stays small (and cheap to send to Dask workers)."""

    format: str
    files: list[str]
    shard: np.ndarray   # int32, per sample
    refs: np.ndarray    # int64 (n, 2)
    shard_starts: list[int]  # first sample of each source shard, then n
    fields: Any = None  # a :class:`.fields.ContainerFields` when the samples carry fields

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


def member_name(shard: str, member: str) -> str:
    """How a sample is named in the store and the skip list: ``shard#member``."""
    return f"{shard}#{member}"


class Labels:
    """Raw labels to class indices, by the rules of :func:`resolve_labels`."""

    def __init__(self, raw: list[Any], names: list[str] | None) -> None:
        self.names = names
        ints = [_as_int(v) for v in raw]
        present = [v for v in raw if v is not None]
        if names is not None:
            self.classes = list(names)
            self.mode = "names"
        elif present and all(_as_int(v) is not None for v in present):
            top = max(i for i in ints if i is not None)
            self.classes = [str(i) for i in range(max(top, -1) + 1)]
            self.mode = "ints"
        elif present and not any(_as_int(v) is not None for v in present):
            self.classes = sorted({str(v) for v in present})
            self.mode = "strings"
        else:
            self.mode = "ints"  # mixed: integers count, names are refused one by one
            top = max((i for i in ints if i is not None), default=-1)
            self.classes = [str(i) for i in range(top + 1)]
        self.index = {c: i for i, c in enumerate(self.classes)}

    def resolve(self, value: Any) -> tuple[int | None, str | None]:
        """(label, None) or (None, the reason the sample is skipped)."""
        if value is None:
            return None, "no label"
        as_int = _as_int(value)
        if self.mode == "strings":
            return self.index[str(value)], None
        if self.mode == "names" and as_int is None:
            if str(value) in self.index:
                return self.index[str(value)], None
            return None, f"label {str(value)!r} is not a known class"
        if as_int is None:
            return None, (f"label {str(value)!r} is not an integer (the source mixes integers "
                          "and names and declares no class names)")
        if as_int < 0 or (self.mode == "names" and as_int >= len(self.classes)):
            return None, (f"label {as_int} is not a class (0..{len(self.classes) - 1})"
                          if self.mode == "names" else f"label {as_int} is negative")
        return as_int, None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(value, str) and _INT.fullmatch(value):
        return int(value)
    return None


def read_classes_file(folder: str) -> list[str] | None:
    """A ``classes.json`` (a JSON list of names) or ``classes.txt`` (one a line) in ``folder``."""
    path = os.path.join(folder, "classes.json")
    if os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                names = json.loads(f.read())
        except (OSError, ValueError) as exc:
            raise PackError(f"{path}: not a JSON list of class names ({exc})") from None
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise PackError(f"{path}: not a JSON list of class names")
        return names
    path = os.path.join(folder, "classes.txt")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f if line.strip()]
    return None


class ContainerFormat:
    """A source format: subclasses find the shards, scan one, and read one member.

    The base class owns the shared steps: scanning every shard in order, turning labels into
    classes, and building the plan's index."""

    name: str = ""
    summary: str = ""

    def detect(self, src: str) -> bool:
        """Whether ``src`` (a path or pattern) is in this format, from its content."""
        raise NotImplementedError

    def scan(self, src: str, options: SourceOptions) -> Scanned:
        raise NotImplementedError

    @staticmethod
    def read(file: str, a: int, b: int, limit: int | None) -> bytes:
        """The encoded image of one sample (raise MemberError with the reason)."""
        raise NotImplementedError

    def index(self, src: str, options: SourceOptions):
        """Scan ``src``: (root, classes, class_to_idx, samples, skipped, ContainerIndex)."""
        scanned = self.scan(src, options)
        labels = Labels([v for s in scanned.shards for v in s.labels], scanned.names)
        samples: list[tuple[str, int]] = []
        shard_col: list[int] = []
        refs: list[tuple[int, int]] = []
        starts = [0]
        skipped = list(scanned.skipped)
        rows: dict[str, dict[str, Any]] = {}
        for k, shard in enumerate(scanned.shards):
            values = shard.fields if len(shard.fields) == len(shard.members) else \
                [{}] * len(shard.members)
            for name, ref, raw, row in zip(shard.members, shard.refs, shard.labels, values):
                path = os.path.join(scanned.root, name)
                label, reason = labels.resolve(raw)
                if reason is not None:
                    skipped.append({"path": path, "reason": reason})
                    continue
                samples.append((path, label))
                if row:
                    rows[path] = row
                shard_col.append(k)
                refs.append(ref)
            starts.append(len(samples))
        index = ContainerIndex(self.name, [s.file for s in scanned.shards],
                               np.asarray(shard_col, dtype=np.int32),
                               np.asarray(refs, dtype=np.int64).reshape(-1, 2), starts)
        if rows:
            from .fields import ContainerFields

            index.fields = ContainerFields(rows, scanned.root, len(samples))
        return (scanned.root, labels.classes, dict(labels.index), samples, skipped, index)

