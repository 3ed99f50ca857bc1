"""The sources whose images are members of container files (WebDataset, parquet, MDS, LitData).

* :class:`ContainerSource`   owns the shared steps (every shard scanned in order, labels to
  classes by :class:`Labels`, the plan's :class:`~.base.ContainerIndex`); a backend fills
  ``detect``, ``scan_shards`` and ``read``.
* :class:`IndexFolderSource` the container sources that are a folder with an ``index.json``
  (MDS, LitData): it detects and reads the index; a backend parses it.
* :class:`Shard`, :class:`Scanned`  what a backend's scan returns.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ...errors import PackError
from .base import ContainerIndex, MemberError, Scan, Source, SourceOptions
from .fields import ContainerFields
from .keyed import apply_keys

_INT = re.compile(r"\s*-?[0-9]+\s*")


@dataclass
class Shard:
    """One source shard (a tar, a parquet file, an MDS shard): its samples, fixed by the scan."""

    file: str                 # absolute path, what workers open
    name: str                 # relative to the source root, what the skip list names
    members: list[str] = field(default_factory=list)  # display name per sample
    refs: list[tuple[int, int]] = field(default_factory=list)
    labels: list[Any] = field(default_factory=list)   # raw: int, str or None
    fields: list[dict[str, Any]] = field(default_factory=list)  # typed field values, if any
    keys: list[Any] = field(default_factory=list)  # raw ``id_key`` values, if asked


@dataclass
class Scanned:
    """A whole source scanned: its shards in order, the class names it declares, refusals."""

    root: str
    shards: list[Shard]
    names: list[str] | None = None        # ClassLabel names, a `classes` list
    skipped: list[dict[str, str]] = field(default_factory=list)


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


def inside_folder(folder: str, name: Any, where: str) -> str:
    """``folder/name`` for a shard file an index names; PackError (one line) for a name that
    leads outside the folder (``../``, an absolute path, a symlink out)."""
    if not isinstance(name, str) or not name:
        raise PackError(f"{where}: a shard has no file name")
    path = os.path.normpath(os.path.join(folder, name))
    real = os.path.realpath(path)
    if os.path.isabs(name) or not path.startswith(folder + os.sep) or \
            (os.path.lexists(path) and not real.startswith(os.path.realpath(folder) + os.sep)):
        raise PackError(f"{where}: shard file {name!r} points outside its folder; refusing "
                        "this source")
    return path


def pil_as_file(value: bytes) -> bytes:
    """A ``pil`` value of MDS or LitData (u32 width, height, mode length; the mode; raw pixels)
    as an image file Pillow opens."""
    from PIL import Image

    if len(value) < 12:
        raise MemberError("pil value shorter than its header")
    width, height, mode_size = np.frombuffer(value[:12], "<u4").tolist()
    mode = value[12:12 + mode_size].decode("ascii", "replace")
    try:
        im = Image.frombytes(mode, (width, height), value[12 + mode_size:])
    except (ValueError, TypeError) as exc:
        raise MemberError(f"pil value does not hold a {mode} {width}x{height} image: {exc}"
                          ) from None
    out = io.BytesIO()
    im.save(out, "PPM" if mode in ("RGB", "L") else "TIFF")
    return out.getvalue()


class ContainerSource(Source):
    """A source whose images are members of container files (shards): a backend finds the
    shards and scans one (:meth:`scan_shards`) and reads one member (:meth:`read`); this class
    owns the rest (labels to classes, the plan's index, the fields).

    A backend whose samples are made of named parts (MDS columns, LitData leaves) picks the
    image and the label part with :meth:`pick_part` (filling :attr:`part`, :attr:`label_names`,
    :meth:`image_format` and :meth:`check_part`) and adds a shard's samples with
    :meth:`add_samples`."""

    #: what the format calls one part of a sample and several, as messages name them
    part: ClassVar[tuple[str, str]] = ("column", "columns")
    #: the label part's default names, the first present is the label
    label_names: ClassVar[tuple[str, ...]] = ()

    def scan_shards(self, src: str, options: SourceOptions) -> Scanned:
        raise NotImplementedError

    def image_format(self, fmt: str) -> bool:
        """Whether a part in format ``fmt`` holds an image (the image part's default)."""
        return False

    def check_part(self, what: str, name: str, fmt: str, where: str) -> None:
        """Refuse (PackError) the ``what`` (``image``/``label``) part ``name`` in format
        ``fmt`` that cannot serve as one."""

    def pick_part(self, names: list[str], formats: list[str], given: str | None, where: str,
                  image: bool) -> int:
        """The index of the image (``image``) or label part of samples whose parts are
        ``names`` in ``formats``: the first of ``given``'s ``;`` alternatives present, else the
        first image part or the first of :attr:`label_names`; PackError (one line) for none,
        or for one :meth:`check_part` refuses."""
        what = "image" if image else "label"
        one, several = self.part
        if given is not None:
            wanted = [n.strip() for n in given.split(";") if n.strip()]
            found = next((names.index(n) for n in wanted if n in names), None)
            if found is None:
                raise PackError(f"{where}: no {what} {one} {given!r} ({several}: "
                                f"{', '.join(names)})")
        elif image:
            found = next((i for i, f in enumerate(formats) if self.image_format(f)), None)
        else:
            found = next((names.index(n) for n in self.label_names if n in names), None)
        if found is None:
            raise PackError(f"{where}: no {what} {one} ({several}: {', '.join(names)}); name it "
                            f"with `{what}_key`")
        self.check_part(what, names[found], formats[found], where)
        return found

    @staticmethod
    def add_samples(scanned: Scanned, shard: Shard, data: bytes, offsets: np.ndarray,
                    sample: Callable[[memoryview], tuple[Any, dict[str, Any]]],
                    refused: tuple[type[Exception], ...] = (MemberError,)) -> None:
        """Add to ``shard`` each of its samples, the bytes of ``data`` between successive
        ``offsets`` (sample ``i``: member ``i``, refs ``(i, 0)``); ``sample`` gives one's raw
        label and typed fields, or raises one of ``refused`` to put it on the skip list."""
        view = memoryview(data)
        for i in range(len(offsets) - 1):
            member = member_name(shard.name, str(i))
            try:
                label, values = sample(view[offsets[i]:offsets[i + 1]])
            except refused as exc:
                scanned.skipped.append({"path": os.path.join(scanned.root, member),
                                        "reason": str(exc)})
                continue
            shard.members.append(member)
            shard.refs.append((i, 0))
            shard.labels.append(label)
            shard.fields.append(values)

    def scan(self, options: SourceOptions) -> Scan:
        src = os.fspath(options.src)
        scanned = self.scan_shards(src, options)
        if options.id_key is not None:
            apply_keys(scanned, options.id_key)
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
        if not samples:
            first = f"; first: {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
            raise PackError(f"{src}: no usable samples in this {self.name} source "
                            f"({len(skipped)} skipped{first})")
        index = ContainerIndex(self.name, [s.file for s in scanned.shards],
                               np.asarray(shard_col, dtype=np.int32),
                               np.asarray(refs, dtype=np.int64).reshape(-1, 2), starts)
        fields = ContainerFields(rows, scanned.root, len(samples)) if rows else None
        return Scan(scanned.root, labels.classes, dict(labels.index), samples, skipped,
                    fields=fields, index=index)


class IndexFolderSource(ContainerSource):
    """A container source that is a folder whose ``index.json`` lists its shards (MDS,
    LitData): this class detects and reads the index; a backend fills :attr:`kinds`,
    :meth:`is_index` and :meth:`parse_index`."""

    #: what messages call the folder and its index (``"an MDS folder"``, ``"an MDS v2 index"``)
    kinds: ClassVar[tuple[str, str]] = ("", "")

    def is_index(self, index: Any) -> bool:
        """Whether a parsed ``index.json`` is in this format (AttributeError: it is not)."""
        return False

    def parse_index(self, index: Any) -> Any:
        """What the scan needs of a parsed ``index.json`` (ValueError, KeyError, TypeError or
        AttributeError for one that is not this format's)."""
        return index

    def detect(self, src: str) -> bool:
        index = os.path.join(src, "index.json")
        if not os.path.isfile(index):
            return False
        try:
            with open(index, "rb") as f:
                return self.is_index(json.loads(f.read()))
        except (OSError, ValueError, AttributeError):
            return False

    def read_index(self, src: str) -> tuple[str, str, Any]:
        """SRC's absolute folder, its ``index.json`` path and :meth:`parse_index` of it;
        PackError (one line) for a missing or unreadable index."""
        folder = os.path.abspath(src)
        where = os.path.join(folder, "index.json")
        try:
            with open(where, "rb") as f:
                index = json.loads(f.read())
            parsed = self.parse_index(index)
        except FileNotFoundError:
            raise PackError(f"{src}: no index.json (not {self.kinds[0]})") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PackError(f"{where}: not {self.kinds[1]} ({exc})") from None
        return folder, where, parsed
