"""A packed store opened for reading: one shard file, or a folder of shards with a manifest.

The store reads only metadata when it is created and holds no file handle afterwards. Shard files
are opened lazily, once per process (the owning pid is checked, so a handle inherited over fork is
never used), and their index arrays are memory-mapped views of the file, never Python objects:
a worker's private memory does not grow with the number of records.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import metadata
from .errors import StoreError
from .formats import ShardReader, open_reader
from .formats.base import file_size
from . import swap


@dataclass(frozen=True)
class ShardEntry:
    """Where one shard lives and which global indices it holds."""

    path: str
    format: str | None
    start: int
    count: int
    bytes: int | None = None
    sha256: str | None = None


class OpenShard:
    """A shard opened in this process: its reader plus memory-mapped index arrays."""

    def __init__(self, entry: ShardEntry, index: int, expect: dict[str, Any],
                 pin: swap.Pin | None = None) -> None:
        if entry.bytes is not None:
            size = _file_size(entry.path)
            if size != entry.bytes:
                raise StoreError(f"{entry.path}: shard is {size} bytes, manifest says "
                                 f"{entry.bytes} (truncated, replaced or damaged)")
        self.entry = entry
        self.reader: ShardReader = _open_pinned(entry, pin)
        try:
            where = entry.path
            meta = metadata.parse_shard_meta(self.reader.meta_json(), where)
            shard = meta["shard"]
            if (shard["index"], shard["count"]) != (index, entry.count):
                raise StoreError(f"{where}: shard says it is #{shard['index']} holding "
                                 f"{shard['count']} records; the store expects #{index} "
                                 f"with {entry.count}")
            for key in ("classes", "settings"):
                if meta[key] != expect[key]:
                    raise StoreError(f"{where}: shard {key} differ from the store's (mixed stores)")
            self.meta = meta
            self.arrays = {name: checked_array(self.reader, name, desc, where)
                           for name, desc in meta["arrays"].items()}
            offsets = self.arrays["path_offsets"]
            if len(offsets) and (offsets[0] != 0 or offsets[-1] != len(self.arrays["path_blob"])):
                raise StoreError(f"{where}: source-path index is inconsistent (damaged store)")
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
        self.reader.close()


def _open_pinned(entry: ShardEntry, pin: swap.Pin | None) -> ShardReader:
    """Open the shard file; with a ``pin``, exactly the file (inode) the Store validated.

    A single-file store replaced by ``pack --overwrite`` after the Store was created is read
    through the descriptor this process inherited, or refused: never the new file's records
    under the old file's metadata.
    """
    if pin is None:
        return open_reader(entry.path, entry.format)

    def here() -> tuple[int, int] | None:
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


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        raise StoreError(f"shard file missing: {path}") from None
    except OSError as exc:
        raise StoreError(f"cannot stat {path}: {exc.strerror}") from None


def sha256_file(path: str, chunk: int = 8 << 20) -> str:
    """SHA-256 of a regular file (a FIFO or device is refused: reading it could block)."""
    file_size(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class Store:
    """Metadata of a store plus lazy, per-process access to its shards.

    Picklable: pickling drops every open shard; the receiving process reopens on first use.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            self._init_sharded()
        elif os.path.exists(self.path):
            self._init_single()
        else:
            raise StoreError(f"store not found: {self.path}")
        self.count: int = self.meta["count"]
        self.classes: list[str] = self.meta["classes"]
        self.class_to_idx: dict[str, int] = self.meta["class_to_idx"]
        self.settings: dict[str, Any] = self.meta["settings"]
        self.encoding: str = self.settings["encoding"]
        self.skipped: list[dict[str, str]] = self.meta.get("skipped", [])
        self.starts = np.array([e.start for e in self.shards] + [self.count], dtype=np.int64)
        self._pid: int | None = None
        self._open: dict[int, OpenShard] = {}

    def _init_single(self) -> None:
        try:
            self._pin: swap.Pin | None = swap.open_identity(self.path)
        except OSError as exc:
            raise StoreError(f"cannot open {self.path}: {exc.strerror}") from None
        reader = _open_pinned(ShardEntry(self.path, None, 0, 0), self._pin)
        try:
            meta = metadata.parse_shard_meta(reader.meta_json(), self.path)
            self._labels = np.array(checked_array(reader, "labels", meta["arrays"]["labels"],
                                                  self.path))
        finally:
            reader.close()
        if meta["kind"] != "single":
            raise StoreError(f"{self.path} is one shard of a multi-shard store; open the folder "
                             "that holds its manifest.json")
        self.meta = meta
        self.shards = [ShardEntry(self.path, None, 0, meta["count"])]
        self._labels_file: str | None = None

    def _init_sharded(self) -> None:
        manifest_path = os.path.join(self.path, metadata.MANIFEST_NAME)
        try:
            file_size(manifest_path)
        except StoreError:
            if not os.path.lexists(manifest_path):
                raise StoreError(f"{self.path} is a folder without {metadata.MANIFEST_NAME}: "
                                 "not a shardkit store, or a pack that did not finish") from None
            raise
        try:
            # Held while this Store lives: `pack --overwrite` keeps the files it names meanwhile.
            raw, self._pin = swap.read_manifest_pinned(manifest_path, metadata.MAX_META_BYTES)
        except FileNotFoundError:
            raise StoreError(f"{self.path} is a folder without {metadata.MANIFEST_NAME}: not a "
                             "shardkit store, or a pack that did not finish") from None
        except OSError as exc:
            raise StoreError(f"cannot read {manifest_path}: {exc.strerror}") from None
        self.meta = metadata.parse_manifest(raw, manifest_path)
        self.shards = [ShardEntry(os.path.join(self.path, e["file"]), e["format"], e["start"],
                                  e["count"], e["bytes"], e["sha256"])
                       for e in self.meta["shards"]]
        self._labels_file = os.path.join(self.path, self.meta["labels"]["file"])

    # -- labels -------------------------------------------------------------------------------

    @property
    def labels(self) -> np.ndarray:
        """All labels (int64), without opening shards of a multi-shard store."""
        labels = getattr(self, "_labels", None)
        if labels is None:
            labels = self._load_labels()
            self._labels = labels
        return labels

    def _load_labels(self) -> np.ndarray:
        if self._labels_file is None:
            return np.array(self.shard(0).labels)
        expected = self.meta["labels"]["sha256"]
        try:
            # Checked against the manifest first: a damaged label would be silently wrong data.
            if sha256_file(self._labels_file) != expected:
                raise StoreError(f"{self._labels_file}: labels file is damaged or replaced "
                                 "(checksum differs from the manifest)")
            labels = np.load(self._labels_file, mmap_mode="r", allow_pickle=False)
        except StoreError:
            raise
        except FileNotFoundError:
            raise StoreError(f"{self._labels_file}: labels file is missing") from None
        except Exception as exc:  # noqa: BLE001 - numpy reports a bad header as many types
            raise StoreError(f"{self._labels_file}: cannot load labels: {exc}") from None
        if labels.dtype != np.int64 or labels.shape != (self.count,):
            raise StoreError(f"{self._labels_file}: labels are {labels.dtype}{list(labels.shape)}, "
                             f"expected int64[{self.count}]")
        return labels

    # -- shards -------------------------------------------------------------------------------

    def locate(self, index: int) -> tuple[int, int]:
        """Global record index -> (shard number, index within the shard)."""
        if not -self.count <= index < self.count:
            raise IndexError(f"index {index} out of range for a store of {self.count} records")
        if index < 0:
            index += self.count
        k = int(np.searchsorted(self.starts, index, side="right")) - 1
        return k, index - int(self.starts[k])

    def _claim(self) -> None:
        """Make this process the owner; handles from another (inherited over fork) are dropped."""
        pid = os.getpid()
        if self._pid != pid:
            self._open = {}
            self._pid = pid

    def shard(self, k: int) -> OpenShard:
        """Shard ``k`` opened in this process (opened now if needed)."""
        self._claim()
        shard = self._open.get(k)
        if shard is None:
            shard = OpenShard(self.shards[k], k, self.meta,
                              self._pin if self._labels_file is None else None)
            self._open[k] = shard
        return shard

    def open(self) -> None:
        """Open in this process: a single-file store's file now; a multi-shard store's lazily."""
        self._claim()
        if len(self.shards) == 1:
            self.shard(0)

    def close(self) -> None:
        if self._pid == os.getpid():
            for shard in self._open.values():
                shard.close()
        self._open = {}
        self._pid = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = {}
        state["_pid"] = None
        state.pop("_labels", None)
        return state

    def __len__(self) -> int:
        return self.count
