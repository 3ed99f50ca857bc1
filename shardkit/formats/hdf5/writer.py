"""Writes one shard as an HDF5 file of plain contiguous datasets (layout: :mod:`.reader`)."""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np

from ..base import ShardWriter, side_files_matching

META_ATTR = "shardkit_meta"
COPY_CHUNK = 64 << 20


class Hdf5ShardWriter(ShardWriter):
    """Spools record bytes to a side file, then lays them out as one contiguous dataset.

    A contiguous dataset needs its size at creation, which is known only at the end.
    """

    format_name = "hdf5"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        fd, self._spool_path = tempfile.mkstemp(prefix=os.path.basename(path) + ".",
                                                suffix=".spool", dir=os.path.dirname(path) or ".")
        self._spool = os.fdopen(fd, "w+b")
        self._offsets = [0]

    def append(self, data: bytes) -> None:
        self._spool.write(data)
        self._offsets.append(self._offsets[-1] + len(data))
        self.count += 1

    def finish(self, arrays: dict[str, np.ndarray], meta_json: bytes) -> None:
        total = self._offsets[-1]
        try:
            with h5py.File(self.path, "w", libver="earliest", track_order=False) as f:
                data = f.create_dataset("data", shape=(total,), dtype=np.uint8)
                self._spool.flush()
                self._spool.seek(0)
                pos = 0
                while pos < total:
                    chunk = self._spool.read(min(COPY_CHUNK, total - pos))
                    data[pos:pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
                    pos += len(chunk)
                f.create_dataset("offsets", data=np.asarray(self._offsets, dtype=np.int64))
                group = f.create_group("index")
                for name, arr in arrays.items():
                    group.create_dataset(name, data=np.ascontiguousarray(arr))
                f.attrs[META_ATTR] = np.bytes_(meta_json)
                f.flush()
        finally:
            self._drop_spool()
        with open(self.path, "rb+") as f:
            os.fsync(f.fileno())

    def abort(self) -> None:
        self._drop_spool()

    @classmethod
    def side_files(cls, path: str) -> list[str]:
        return side_files_matching(path, ".*.spool")  # mkstemp's name for the spool

    def _drop_spool(self) -> None:
        self._spool.close()
        try:
            os.unlink(self._spool_path)
        except FileNotFoundError:
            pass
