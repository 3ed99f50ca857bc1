"""HDF5 shards written by someone else: offsets datasets are checked before anything is read."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from shardkit import formats
from shardkit.errors import StoreError


def _shard(path: str) -> None:
    writer = formats.WRITERS["hdf5"](path)
    for i in range(3):
        writer.append(bytes([i]) * 10)
        writer.append_side("f.masks", bytes([i]) * 4)
    writer.finish({}, b'{"format": "test"}')


@pytest.mark.parametrize("where", ["", "side/f.masks/"])
def test_a_billion_declared_offsets_are_refused_unread(tmp_path, where):
    """A chunked /offsets of 10**9 entries takes a few KB on disk (nothing allocated); reading
    it would make an 8 GB array."""
    path = str(tmp_path / "hostile.h5")
    _shard(path)
    with h5py.File(path, "r+") as f:
        del f[f"{where}offsets"]
        f.create_dataset(f"{where}offsets", shape=(10**9,), dtype=np.int64, chunks=(1024,))
    with pytest.raises(StoreError, match="offsets is not a contiguous int64 vector"):
        formats.open_reader(path)


def test_a_side_stream_with_another_record_count_is_refused(tmp_path):
    path = str(tmp_path / "short.h5")
    _shard(path)
    with h5py.File(path, "r+") as f:
        del f["side/f.masks/offsets"]
        f.create_dataset("side/f.masks/offsets", data=np.array([0, 4, 8], np.int64))
        del f["side/f.masks/data"]
        f.create_dataset("side/f.masks/data", data=np.zeros(8, np.uint8))
    with pytest.raises(StoreError, match="holds 2 records, the shard 3"):
        formats.open_reader(path)
