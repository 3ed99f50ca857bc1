"""The one interface every store backend implements, so packer and Dataset never see a format.

A *shard* is one file holding, in order, records ``0..count-1`` (encoded image bytes), a few
named numpy index arrays (labels, heights, widths, checksums, source paths) and one JSON metadata
object, written last. A writer produces a shard; a reader opens one read-only, in one process.
"""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import Callable, ClassVar

import numpy as np

from ..errors import StoreError

RecordGetter = Callable[[int], "bytes | memoryview | np.ndarray"]


class ShardWriter(ABC):
    """Appends records in index order, then ``finish`` writes arrays and metadata and closes."""

    format_name: ClassVar[str]

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0

    @abstractmethod
    def append(self, data: bytes) -> None:
        """Store ``data`` as record ``self.count``."""

    @abstractmethod
    def finish(self, arrays: dict[str, np.ndarray], meta_json: bytes) -> None:
        """Write the index arrays, then the metadata, flush to disk and close."""

    @abstractmethod
    def abort(self) -> None:
        """Close without finishing; the caller deletes the file."""


class ShardReader(ABC):
    """A read-only view of one shard file, opened in the current process."""

    format_name: ClassVar[str]

    def __init__(self, path: str) -> None:
        self.path = path
        self.file_size = file_size(path)

    @abstractmethod
    def meta_json(self) -> bytes:
        """The raw metadata JSON (parsed and validated by :mod:`shardkit.metadata`)."""

    @abstractmethod
    def array(self, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        """Index array ``name``, checked against the dtype and shape the metadata promises."""

    @abstractmethod
    def records(self) -> AbstractContextManager[RecordGetter]:
        """A context in which ``get(i)`` returns record ``i``'s bytes (valid only inside it).

        One context is one read transaction: a whole batch is fetched inside one.
        """

    def release_library_handle(self) -> None:
        """The caller has read the metadata and index arrays: drop what only they needed."""

    @abstractmethod
    def close(self) -> None:
        """Release the file handle / memory map."""


def file_size(path: str) -> int:
    """Size of the regular file at ``path``; anything else (a FIFO, a device, a folder) is refused.

    Opening a FIFO blocks forever and a device has no size, so neither may reach a reader.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise StoreError(f"store file not found: {path}") from None
    except OSError as exc:
        raise StoreError(f"cannot stat {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise StoreError(f"{path} is {kind}, not a store file")
    return st.st_size


def check_array(path: str, name: str, arr: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if arr.dtype != np.dtype(dtype) or tuple(arr.shape) != tuple(shape):
        raise StoreError(
            f"{path}: index array {name!r} is {arr.dtype}{list(arr.shape)}, "
            f"metadata promises {np.dtype(dtype)}{list(shape)} (damaged store)")
    return arr
