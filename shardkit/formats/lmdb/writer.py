"""Writes one shard as a single-file LMDB environment (layout: :mod:`.validate`)."""

from __future__ import annotations

import errno
import os

import lmdb
import numpy as np

from ...errors import StoreError
from ..base import ShardWriter
from .validate import ARRAY_PREFIX, META_KEY, record_key, side_key

INITIAL_MAP_SIZE = 64 << 20
TXN_BYTES = 8 << 20  # commit every ~8 MiB: written while encoders work, not all at the end


def _write_error(path: str, exc: lmdb.Error, pending: int) -> OSError:
    """The OSError behind a failed LMDB write. LMDB reports a short write on a full disk as
    EIO; when the filesystem is (nearly) out of space, say so."""
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
        full = st.f_bavail * st.f_frsize < pending + (4 << 20)
    except OSError:
        full = False
    if full or "No space left" in str(exc):
        return OSError(errno.ENOSPC, f"No space left on device (writing {path})")
    return OSError(errno.EIO, f"LMDB write to {path} failed: {exc}")


class LmdbShardWriter(ShardWriter):
    format_name = "lmdb"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._map_size = INITIAL_MAP_SIZE
        try:
            self._env = lmdb.open(path, subdir=False, map_size=self._map_size, lock=False,
                                  meminit=True, sync=False, metasync=False, readahead=False)
        except lmdb.Error as exc:  # the packer reports OSErrors as one line
            raise _write_error(path, exc, 0) from None
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._sides_pending = False

    def _append(self, data: bytes) -> None:
        # Committed before a record, never between it and its side records: a transaction's
        # keys are then put in order (``_commit`` sorts them), as ``append=True`` needs.
        if self._pending_bytes >= TXN_BYTES:
            self._commit()
        self._pending.append((record_key(self.count), data))
        self._pending_bytes += len(data)

    def _append_side(self, stream: str, data: bytes) -> None:
        self._pending.append((side_key(self.count - 1, stream), data))
        self._sides_pending = True
        self._pending_bytes += len(data)

    def _commit(self) -> None:
        """Write pending items in one transaction, doubling the map until they fit."""
        if self._sides_pending:  # a record, then its side records by name (given in any order)
            self._pending.sort(key=lambda item: item[0])
            self._sides_pending = False
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for key, value in self._pending:
                        if not txn.put(key, value, append=key[:2] != b"__", overwrite=True):
                            raise StoreError(f"{self.path}: duplicate key {key!r}")
                break
            except lmdb.MapFullError:
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
            except lmdb.Error as exc:  # e.g. ENOSPC: surface as the OSError it is
                raise _write_error(self.path, exc, self._pending_bytes) from None
        self._pending.clear()
        self._pending_bytes = 0

    def _finish(self, arrays: dict[str, np.ndarray], meta_json: bytes) -> None:
        self._commit()
        for name, arr in arrays.items():
            self._pending.append((ARRAY_PREFIX + name.encode(), np.ascontiguousarray(arr).tobytes()))
        self._commit()
        self._pending.append((META_KEY, meta_json))
        self._commit()
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise _write_error(self.path, exc, 0) from None
        self._env.close()

    def abort(self) -> None:
        self._env.close()
