"""Store backends: THE registry of formats, chosen by name when writing and by content when reading.

Each backend is one folder (``lmdb/``, ``hdf5/``) whose ``BACKEND`` names its suffixes, content
sniffer, reader and writer; ``base`` holds the classes they extend. Everything else (CLI choices,
suffixes, metadata checks, tests) derives from ``_formats``: adding a backend is a folder plus one
line there.
"""

from __future__ import annotations

import os

from ..errors import StoreError
from ..fileutil import file_size
from . import hdf5, lmdb
from .base import Backend, RecordGetter, ShardReader, ShardWriter, remove_shard

_formats: dict[str, Backend] = {
    "lmdb": lmdb.BACKEND,  # the first is the default
    "hdf5": hdf5.BACKEND,
}

FORMATS: tuple[str, ...] = tuple(_formats)
DEFAULT_FORMAT: str = FORMATS[0]
SUFFIXES: dict[str, str] = {name: b.suffixes[0] for name, b in _formats.items()}
WRITERS: dict[str, type[ShardWriter]] = {name: b.writer for name, b in _formats.items()}
READERS: dict[str, type[ShardReader]] = {name: b.reader for name, b in _formats.items()}


def backend(fmt: str) -> Backend:
    """The registry entry of format ``fmt`` (``ValueError`` naming the choices if unknown)."""
    try:
        return _formats[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}") from None


def format_for_path(path: str) -> str:
    """Default format from an output name's suffix (``.h5``/``.hdf5`` is HDF5); else the default."""
    lower = str(path).lower()
    return next((name for name, b in _formats.items() if lower.endswith(b.suffixes)),
                DEFAULT_FORMAT)


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
    for name, b in _formats.items():
        if b.sniff(head):
            return name
    labels = " nor ".join(b.label for b in _formats.values())
    raise StoreError(f"{path} is not a shardkit store (neither {labels})")


def open_reader(path: str, fmt: str | None = None) -> ShardReader:
    fmt = fmt or detect_format(path)
    if fmt not in _formats:
        raise StoreError(f"{path}: unknown shard format {fmt!r}")
    return _formats[fmt].reader(path)


def open_writer(path: str, fmt: str) -> ShardWriter:
    return backend(fmt).writer(path)


def remove_shard_file(path: str, fmt: str) -> None:
    """Delete a shard file of format ``fmt`` and the side files its writer may have left."""
    remove_shard(path, backend(fmt).writer)


__all__ = ["DEFAULT_FORMAT", "FORMATS", "READERS", "SUFFIXES", "WRITERS", "Backend",
           "RecordGetter", "ShardReader", "ShardWriter", "backend", "detect_format",
           "format_for_path", "open_reader", "open_writer", "remove_shard_file"]
