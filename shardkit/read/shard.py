"""One shard of a store opened for reading: its reader, checked metadata and index arrays.

:class:`shardkit.read.store.Store` decides which file a shard is and when it opens or closes;
this module opens that file (through a pin when the store is a single file that may be
replaced, see :mod:`shardkit.swap`) and checks what it holds against the store's metadata, so a
shard that is truncated, damaged, or from another store is refused with ``StoreError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import fields as fieldstore
from .. import metadata, storemeta, swap
from ..errors import StoreError
from ..fileutil import file_size
from ..formats import ShardReader, open_reader


@dataclass(frozen=True)
class ShardEntry:
    """Where one shard lives and which global indices it holds."""

    path: str
    format: str | None
    start: int
    count: int
    bytes: int | None = None
    sha256: str | None = None
    #: the shard's own number, where a store's later version lists it at another place
    written: int | None = None
    #: how many of the store's classes it was written with, where a later version added
    #: classes after them (its labels index a prefix of the store's)
    classes: int | None = None

    @classmethod
    def of(cls, path: str, entry: dict[str, Any]) -> "ShardEntry":
        """From a manifest's shard entry."""
        return cls(path, entry["format"], entry["start"], entry["count"], entry["bytes"],
                   entry["sha256"], entry.get("index"), entry.get("classes"))


def _same_classes(written: Any, expect: dict[str, Any], count: int | None) -> bool:
    """Whether a shard written with class list ``written`` belongs to a store of ``expect``'s:
    the store's classes (their first ``count``, where later versions added classes after them).
    A version whose labels are all in ``labels.npy`` (``labels_set``) may have renumbered the
    classes (``update(relabel=True)``): there the shard's need only be ``count`` of the
    store's, in any order."""
    classes = expect.get("classes")
    if expect.get("labels_set") and written is not None and classes is not None:
        return set(written) <= set(classes) and (count is None or len(written) == count)
    if count is not None and classes is not None:
        classes = classes[:count]
    return written == classes


class OpenShard:
    """A shard opened in this process: its reader plus memory-mapped index arrays."""

    def __init__(self, entry: ShardEntry, index: int, expect: dict[str, Any],
                 pin: swap.Pin | None = None) -> None:
        if entry.bytes is not None:
            size = file_size(entry.path)
            if size != entry.bytes:
                raise StoreError(f"{entry.path}: shard is {size} bytes, manifest says "
                                 f"{entry.bytes} (truncated, replaced or damaged)")
        self.entry = entry
        self.reader: ShardReader = open_pinned(entry, pin)
        try:
            where = entry.path
            meta = storemeta.parse_shard_meta(self.reader.meta_json(), where)
            shard = meta["shard"]
            number = index if entry.written is None else entry.written
            if (shard["index"], shard["count"]) != (number, entry.count):
                raise StoreError(f"{where}: shard says it is #{shard['index']} holding "
                                 f"{shard['count']} records; the store expects #{number} "
                                 f"with {entry.count}")
            if not _same_classes(meta.get("classes"), expect, entry.classes):
                raise StoreError(f"{where}: shard classes differ from the store's (mixed stores)")
            for key in ("settings", "fields"):
                if meta.get(key) != expect.get(key):
                    raise StoreError(f"{where}: shard {key} differ from the store's (mixed stores)")
            self.meta = meta
            self.arrays = {name: checked_array(self.reader, name, desc, where)
                           for name, desc in meta["arrays"].items()}
            offsets = self.arrays["path_offsets"]
            if len(offsets) and (offsets[0] != 0 or offsets[-1] != len(self.arrays["path_blob"])):
                raise StoreError(f"{where}: source-path index is inconsistent (damaged store)")
            #: Each JPEG record's MCU row starts (``shardkit.jpegrows``; None: a store without).
            self.row_offsets = self.arrays.get("row_offsets")
            self.row_starts = self.arrays.get("row_starts")
            rows = self.row_offsets
            if rows is not None and len(rows) and (
                    rows[0] != 0 or rows[-1] != len(self.row_starts)
                    or (len(rows) > 1 and np.diff(rows).min() < 0)):
                raise StoreError(f"{where}: row index is inconsistent (damaged store)")
            #: The typed fields' columns (:class:`shardkit.fields.ShardFields`), or None.
            self.fields = (None if "fields" not in meta else fieldstore.ShardFields(
                fieldstore.Schema.from_json(meta["fields"]), self.arrays, self.arrays["heights"],
                self.arrays["widths"], where, self.reader))
            self.reader.release_library_handle()
        except BaseException:
            self.reader.close()
            raise
        self.labels = self.arrays["labels"]
        self.heights = self.arrays["heights"]
        self.widths = self.arrays["widths"]
        self.crc32 = self.arrays["crc32"]

    def source_path(self, local: int) -> str:
        offsets = self.arrays["path_offsets"]
        raw = bytes(self.arrays["path_blob"][offsets[local]:offsets[local + 1]])
        return raw.decode("utf-8", "surrogateescape")

    def close(self) -> None:
        self.arrays = {}
        self.fields = None
        self.labels = self.heights = self.widths = self.crc32 = None
        self.row_offsets = self.row_starts = None
        self.reader.close()


def open_pinned(entry: ShardEntry, pin: swap.Pin | None) -> ShardReader:
    """Open the shard file; with a ``pin``, exactly the file (inode) the Store validated.

    A single-file store replaced by ``pack --overwrite`` after it was pinned is read through the
    pin's descriptor (this process's, or one inherited over fork), or refused: never the new
    file's records under the old file's metadata.
    """
    if pin is None:
        return open_reader(entry.path, entry.format)

    def here() -> tuple[int, ...] | None:
        try:
            return swap.identity(entry.path)
        except OSError:
            return None

    if here() == pin.identity:
        try:
            reader = open_reader(entry.path, entry.format)
        except StoreError:
            # Replaced while the reader opened it by name (it opens the path more than once):
            # a mix of two files, not damage. Only the pinned file's own faults are errors.
            if here() == pin.identity:
                raise
        else:
            if here() == pin.identity:
                return reader
            reader.close()
    inherited = pin.proc_path()
    if inherited is not None:
        return open_reader(inherited, entry.format)
    raise StoreError(f"{entry.path} was replaced (e.g. re-packed with --overwrite) after this "
                     "dataset was opened; create the dataset again to read the new store")


def checked_array(reader: ShardReader, name: str, desc: dict[str, Any], where: str) -> np.ndarray:
    """Index array ``name`` as the metadata describes it, refused unless its CRC32 matches."""
    arr = reader.array(name, desc["dtype"], tuple(desc["shape"]))
    if metadata.array_crc32(arr) != desc["crc32"]:
        raise StoreError(f"{where}: index array {name!r} is damaged (checksum mismatch)")
    return arr
