"""HDF5 shards: one HDF5 file per shard, plain datasets only.

``/data`` is one contiguous uint8 dataset of all encoded records back to back; ``/offsets``
(int64, count+1) delimits them; index arrays are datasets under ``/index/<name>``; the metadata
JSON is the string attribute ``shardkit_meta`` of the root group, written last. A side record
stream ``S`` (see :mod:`shardkit.formats.base`) is laid out the same way in the group
``/side/<S>``: ``/side/<S>/data`` (contiguous uint8, the side records back to back in record
order) and ``/side/<S>/offsets`` (int64, count+1). No variable-length objects, no pickle. Readers map the file (its datasets are contiguous), so a record read is a
slice of memory, not an HDF5 library call.
"""

from __future__ import annotations

import mmap
import os
from contextlib import contextmanager
from typing import Iterator

import h5py
import numpy as np

from ...errors import StoreError
from ..base import RecordFetch, ShardReader
from .writer import META_ATTR, SIDE_GROUP

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def sniff(head: bytes) -> bool:
    return head.startswith(HDF5_SIGNATURE)


class Hdf5ShardReader(ShardReader):
    """Reads metadata and index-array layouts with h5py, then serves everything from one memory
    map of the file.

    h5py and ``np.memmap`` would each hold a descriptor per array (Python's mmap duplicates the
    descriptor it maps): ~9 per shard, too many for a worker touching hundreds of shards. Here one
    ``mmap`` of the whole file (one descriptor) backs ``/data``, ``/offsets`` and every index
    array, and h5py is closed as soon as the owner has read the arrays
    (``release_library_handle``).
    """

    format_name = "hdf5"
    library_errors = (Exception,)  # h5py surfaces corruption as many types

    def _open(self) -> None:
        path = self.path
        self._file = self._fileobj = self._map = None
        try:
            # One open file for h5py and the map: both see the same inode even if ``path`` is
            # replaced meanwhile; a pinned, replaced file (``/proc/self/fd/N``, see
            # shardkit.swap) is only readable this way, as HDF5 cannot resolve its name.
            self._fileobj = open(path, "rb")
            self.file_size = os.fstat(self._fileobj.fileno()).st_size
            self._file = h5py.File(self._fileobj, "r")
        except (OSError, ValueError) as exc:
            raise StoreError(f"{path}: cannot open HDF5 store: {exc}") from None
        try:
            raw = self._file.attrs.get(META_ATTR)
            if raw is None:
                raise StoreError(f"{path}: HDF5 file has no shardkit metadata "
                                 "(incomplete or foreign store)")
            self._meta_raw = bytes(raw) if not isinstance(raw, str) else raw.encode()
            self._map = mmap.mmap(self._fileobj.fileno(), 0, access=mmap.ACCESS_READ)
            self._data, self._offsets = self._map_data(self._file, "")
            self._sides = self._map_sides(self._file, len(self._offsets) - 1)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - h5py surfaces corruption as many types
            raise StoreError(f"{path}: damaged HDF5 store: {exc}") from None

    def _map_data(self, f: h5py.Group, where: str, count: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
        """``<where>data`` and ``<where>offsets`` of group ``f`` (``count`` + 1 offsets when
        given), mapped and checked."""
        ds = f.get("data")
        offsets = f.get("offsets")
        if not isinstance(ds, h5py.Dataset) or not isinstance(offsets, h5py.Dataset):
            raise StoreError(f"{self.path}: HDF5 store lacks /{where}data or /{where}offsets")
        if ds.dtype != np.uint8 or ds.ndim != 1 or ds.chunks is not None or ds.compression:
            raise StoreError(f"{self.path}: /{where}data is not a contiguous uint8 dataset")
        # Checked before anything is read: a hostile file could declare billions of offsets.
        if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.chunks is not None \
                or offsets.compression or 8 * offsets.shape[0] > self.file_size:
            raise StoreError(f"{self.path}: /{where}offsets is not a contiguous int64 vector "
                             "within the file")
        if count is not None and offsets.shape[0] != count + 1:
            raise StoreError(f"{self.path}: side stream /{where[:-1]} holds "
                             f"{offsets.shape[0] - 1} records, the shard {count} (damaged store)")
        mapped = self._map_dataset(offsets)
        n = int(ds.shape[0])
        if len(mapped) == 0 or mapped[0] != 0 or mapped[-1] != n \
                or np.any(np.diff(mapped) < 0):
            raise StoreError(f"{self.path}: /{where}offsets do not describe /{where}data "
                             "(damaged store)")
        return self._map_dataset(ds), mapped

    def _map_sides(self, f: h5py.File, count: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every side stream's data and offsets (``count`` records each), mapped now: h5py is
        closed once the index arrays are read."""
        group = f.get(SIDE_GROUP)
        if group is None:
            return {}
        if not isinstance(group, h5py.Group):
            raise StoreError(f"{self.path}: /{SIDE_GROUP} is not a group (damaged store)")
        sides = {}
        for stream, sub in group.items():
            where = f"{SIDE_GROUP}/{stream}/"
            if not isinstance(sub, h5py.Group):
                raise StoreError(f"{self.path}: /{where[:-1]} is not a group (damaged store)")
            sides[stream] = self._map_data(sub, where, count)
        return sides

    def _meta(self) -> bytes:
        return self._meta_raw

    def _array(self, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray | None:
        if self._file is None:
            raise StoreError(f"{self.path}: index arrays must be read before release_library_handle()")
        ds = self._file.get(f"index/{name}")
        return self._map_dataset(ds) if isinstance(ds, h5py.Dataset) else None

    def _map_dataset(self, ds: h5py.Dataset) -> np.ndarray:
        """A contiguous dataset as a read-only view of the file's map (shared page cache)."""
        start = ds.id.get_offset()
        if ds.chunks is not None or ds.compression or start is None or ds.size == 0:
            return np.asarray(ds[()])
        if start + ds.nbytes > self.file_size:
            raise StoreError(f"{self.path}: dataset {ds.name} lies beyond the end of the file "
                             "(truncated store)")
        return np.frombuffer(self._map, dtype=ds.dtype, count=ds.size,
                             offset=start).reshape(ds.shape)

    @contextmanager
    def _records(self) -> Iterator[RecordFetch]:
        # A memoryview and a plain ndarray: slicing an ndarray per record costs ~5 us.
        data, offsets = memoryview(self._data), self._offsets
        count = len(offsets) - 1
        yield lambda i: data[offsets[i]:offsets[i + 1]] if 0 <= i < count else None

    @contextmanager
    def _side_records(self, stream: str) -> Iterator[RecordFetch]:
        side = self._sides.get(stream)
        if side is None:
            yield lambda i: None
            return
        data, offsets = memoryview(side[0]), side[1]
        count = len(offsets) - 1
        yield lambda i: data[offsets[i]:offsets[i + 1]] if 0 <= i < count else None

    def release_library_handle(self) -> None:
        """Close h5py and its file once the index arrays are read; records come from the map."""
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None
        if getattr(self, "_fileobj", None) is not None:
            self._fileobj.close()
            self._fileobj = None

    def close(self) -> None:
        self.release_library_handle()
        self._data = self._offsets = None
        self._sides = {}
        if getattr(self, "_map", None) is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds a view: unmapped when the last one goes
            self._map = None
