"""Store backends, chosen by name when writing and by file content when reading."""

from __future__ import annotations

import os

from ..errors import StoreError
from . import hdf5_format, lmdb_format
from .base import RecordGetter, ShardReader, ShardWriter, file_size

WRITERS: dict[str, type[ShardWriter]] = {
    "lmdb": lmdb_format.LmdbShardWriter,
    "hdf5": hdf5_format.Hdf5ShardWriter,
}
READERS: dict[str, type[ShardReader]] = {
    "lmdb": lmdb_format.LmdbShardReader,
    "hdf5": hdf5_format.Hdf5ShardReader,
}
FORMATS: tuple[str, ...] = tuple(WRITERS)
SUFFIXES: dict[str, str] = {"lmdb": ".lmdb", "hdf5": ".h5"}


def format_for_path(path: str) -> str:
    """Default format from an output name: ``.h5``/``.hdf5`` is HDF5, anything else LMDB."""
    return "hdf5" if str(path).lower().endswith((".h5", ".hdf5")) else "lmdb"


def detect_format(path: str) -> str:
    """Which backend wrote the shard file at ``path``, from its first bytes."""
    if os.path.isdir(path):
        raise StoreError(f"{path} is a folder without a manifest.json")
    file_size(path)  # refuses FIFOs and devices before open() could block on them
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except FileNotFoundError:
        raise StoreError(f"store not found: {path}") from None
    except IsADirectoryError:
        raise StoreError(f"{path} is a folder without a manifest.json") from None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}") from None
    if hdf5_format.sniff(head):
        return "hdf5"
    if lmdb_format.sniff(head):
        return "lmdb"
    raise StoreError(f"{path} is not a shardkit store (neither LMDB nor HDF5)")


def open_reader(path: str, fmt: str | None = None) -> ShardReader:
    fmt = fmt or detect_format(path)
    if fmt not in READERS:
        raise StoreError(f"{path}: unknown shard format {fmt!r}")
    return READERS[fmt](path)


def open_writer(path: str, fmt: str) -> ShardWriter:
    return WRITERS[fmt](path)


__all__ = ["FORMATS", "SUFFIXES", "RecordGetter", "ShardReader", "ShardWriter",
           "detect_format", "format_for_path", "open_reader", "open_writer"]
