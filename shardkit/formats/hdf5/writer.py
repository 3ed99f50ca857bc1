"""Writes one shard as an HDF5 file of plain contiguous datasets (layout: :mod:`.reader`)."""

from __future__ import annotations

import os
import tempfile

import h5py
import numpy as np

from ..base import ShardWriter, side_files_matching

META_ATTR = "shardkit_meta"
SIDE_GROUP = "side"  # /side/<stream>/data and /side/<stream>/offsets
COPY_CHUNK = 64 << 20


class _Spool:
    """Bytes of one dataset spooled to a side file, with the offsets that delimit them."""

    def __init__(self, path: str, tag: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix=os.path.basename(path) + ".",
                                         suffix=f".{tag}.spool", dir=os.path.dirname(path) or ".")
        self.file = os.fdopen(fd, "w+b")
        self.offsets = [0]

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.offsets.append(self.offsets[-1] + len(data))

    def lay_out(self, group: h5py.Group) -> None:
        """``group/data`` (contiguous uint8, copied in chunks) and ``group/offsets``."""
        total = self.offsets[-1]
        data = group.create_dataset("data", shape=(total,), dtype=np.uint8)
        self.file.flush()
        self.file.seek(0)
        pos = 0
        while pos < total:
            chunk = self.file.read(min(COPY_CHUNK, total - pos))
            data[pos:pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
            pos += len(chunk)
        group.create_dataset("offsets", data=np.asarray(self.offsets, dtype=np.int64))

    def drop(self) -> None:
        self.file.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Hdf5ShardWriter(ShardWriter):
    """Spools record bytes (and each side stream's) to side files, then lays them out as
    contiguous datasets.

    A contiguous dataset needs its size at creation, which is known only at the end.
    """

    format_name = "hdf5"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._spool = _Spool(path, "data")
        self._sides: dict[str, _Spool] = {}

    def _append(self, data: bytes) -> None:
        self._spool.write(data)

    def _append_side(self, stream: str, data: bytes) -> None:
        spool = self._sides.get(stream)
        if spool is None:  # only during the first record: later ones carry the same streams
            spool = self._sides[stream] = _Spool(self.path, "side")
        spool.write(data)

    def _finish(self, arrays: dict[str, np.ndarray], meta_json: bytes) -> None:
        try:
            with h5py.File(self.path, "w", libver="earliest", track_order=False) as f:
                self._spool.lay_out(f)
                for stream in sorted(self._sides):
                    self._sides[stream].lay_out(f.create_group(f"{SIDE_GROUP}/{stream}"))
                group = f.create_group("index")
                for name, arr in arrays.items():
                    group.create_dataset(name, data=np.ascontiguousarray(arr))
                f.attrs[META_ATTR] = np.bytes_(meta_json)
                f.flush()
        finally:
            self._drop_spools()
        with open(self.path, "rb+") as f:
            os.fsync(f.fileno())

    def abort(self) -> None:
        self._drop_spools()

    @classmethod
    def side_files(cls, path: str) -> list[str]:
        return side_files_matching(path, ".*.spool")  # mkstemp's names for the spools

    def _drop_spools(self) -> None:
        for spool in [self._spool, *self._sides.values()]:
            spool.drop()
        self._sides = {}
