"""The one interface every store backend implements, so packer and Dataset never see a format.

A *shard* is one file holding, in order, records ``0..count-1`` (encoded image bytes), a few
named numpy index arrays (labels, heights, widths, checksums, source paths) and one JSON metadata
object, written last. A writer produces a shard; a reader opens one read-only, in one process.

A shard may also hold named *side record streams* beside its records: record ``i`` of stream
``S`` belongs to record ``i`` (a typed field's instance masks, say). The writer stores them with
``append_side(S, data)`` right after ``append`` of their record; every record of a shard carries
the same streams (the first record's). The reader serves them with ``side_records(S)``, a
context like ``records()``. A backend lays them out beside the records (its module docstring).

The base classes own the steps every backend shares: refusing what is not a regular file, the
"missing" errors for metadata, arrays and records, checking arrays against the metadata, and
turning the backend library's exceptions into ``StoreError``. A backend fills the ``_hooks``.
"""

from __future__ import annotations

import glob
import os
import re
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import numpy as np

from ..errors import StoreError
from ..fileutil import file_size, unlink

RecordGetter = Callable[[int], "bytes | memoryview | np.ndarray"]
#: A backend's record fetch inside one read context: the record, or None when it is missing.
RecordFetch = Callable[[int], Any]
#: Names a side record stream may have: a backend stores them in keys and group names as is.
SIDE_STREAM = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,65}")  # "f." + a 64-character field name


class ShardWriter(ABC):
    """Appends records in index order, then ``finish`` writes arrays and metadata and closes.

    Backends implement ``_append``, ``_append_side``, ``_finish`` and ``abort``; the base keeps
    the count and checks that every record carries the same side streams.
    """

    format_name: ClassVar[str]

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        #: The side streams every record carries (fixed by the first record), sorted.
        self.side_streams: tuple[str, ...] | None = None
        self._side_given: list[str] = []  # streams given so far for record ``count - 1``

    def append(self, data: bytes) -> None:
        """Store ``data`` as record ``self.count``."""
        self._close_record()
        self._append(data)
        self.count += 1

    def append_side(self, stream: str, data: bytes) -> None:
        """Store ``data`` as the record of side stream ``stream`` belonging to the record just
        appended (``count - 1``); each stream once per record, the same streams for every record."""
        if not isinstance(stream, str) or not SIDE_STREAM.fullmatch(stream):
            raise ValueError(f"side stream name must match {SIDE_STREAM.pattern}, got {stream!r}")
        if not self.count:
            raise ValueError(f"{self.path}: append_side({stream!r}) before any record")
        if stream in self._side_given:
            raise ValueError(f"{self.path}: record {self.count - 1} already has a side record "
                             f"in stream {stream!r}")
        if self.side_streams is not None and stream not in self.side_streams:
            raise ValueError(f"{self.path}: stream {stream!r} is not one of this shard's side "
                             f"streams {list(self.side_streams)}")
        self._append_side(stream, data)
        self._side_given.append(stream)

    def finish(self, arrays: dict[str, np.ndarray], meta_json: bytes) -> None:
        """Write the index arrays, then the metadata, flush to disk and close."""
        self._close_record()
        self._finish(arrays, meta_json)

    def _close_record(self) -> None:
        """Check that record ``count - 1`` got exactly the shard's side streams."""
        if not self.count:
            return
        given = tuple(sorted(self._side_given))
        if self.side_streams is None:
            self.side_streams = given
        elif given != self.side_streams:
            missing = sorted(set(self.side_streams) - set(given))
            raise ValueError(f"{self.path}: record {self.count - 1} lacks its side record in "
                             f"stream {missing[0]!r}")
        self._side_given = []

    # -- hooks --------------------------------------------------------------------------------

    @abstractmethod
    def _append(self, data: bytes) -> None:
        """Store ``data`` as record ``self.count`` (the base counts it afterwards)."""

    @abstractmethod
    def _append_side(self, stream: str, data: bytes) -> None:
        """Store ``data`` as record ``self.count - 1`` of side stream ``stream``."""

    @abstractmethod
    def _finish(self, arrays: dict[str, np.ndarray], meta_json: bytes) -> None:
        """Write the index arrays, then the metadata, flush to disk and close."""

    @abstractmethod
    def abort(self) -> None:
        """Close without finishing; the caller deletes the file (see ``discard``)."""

    @classmethod
    def side_files(cls, path: str) -> list[str]:
        """Files besides ``path`` that a writer of ``path`` (even a killed one) may leave."""
        return []

    def discard(self) -> None:
        """Abort and delete the file and its side files."""
        try:
            self.abort()
        finally:
            remove_shard(self.path, type(self))


def remove_shard(path: str, writer: type[ShardWriter]) -> None:
    """Delete a shard file written by ``writer`` and any side files it may have left."""
    for p in [path, *writer.side_files(path)]:
        unlink(p)


def side_files_matching(path: str, pattern: str) -> list[str]:
    """Existing files next to ``path`` named ``<basename><pattern>`` (a glob)."""
    folder, name = os.path.split(path)
    return glob.glob(os.path.join(glob.escape(folder or "."), glob.escape(name) + pattern))


class ShardReader(ABC):
    """A read-only view of one shard file, opened in the current process.

    Backends implement ``_open``, ``_meta``, ``_array``, ``_records``, ``_side_records`` and
    ``close``; every exception in ``library_errors`` they raise becomes a ``StoreError`` naming the file.
    """

    format_name: ClassVar[str]
    #: Exceptions of the backend's library that mean "this file cannot be read as a store".
    library_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(self, path: str) -> None:
        self.path = path
        self.file_size = file_size(path)
        try:
            self._open()
        except BaseException as exc:
            self.close()
            if isinstance(exc, self.library_errors) and not isinstance(exc, StoreError):
                raise StoreError(f"{path}: cannot open {self.format_name.upper()} store: "
                                 f"{exc}") from None
            raise

    @contextmanager
    def _library_call(self, what: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except self.library_errors as exc:
            raise StoreError(f"{self.path}: {self.format_name.upper()} read failed for {what}: "
                             f"{exc}") from None

    # -- hooks --------------------------------------------------------------------------------

    @abstractmethod
    def _open(self) -> None:
        """Open the file and check what must hold before anything is read."""

    @abstractmethod
    def _meta(self) -> bytes | None:
        """The raw metadata JSON, or None when the file has none."""

    @abstractmethod
    def _array(self, name: str, dtype: str, shape: tuple[int, ...]) -> Any:
        """Index array ``name`` as an ndarray or its raw bytes; None when missing."""

    @abstractmethod
    def _records(self) -> AbstractContextManager[RecordFetch]:
        """One read transaction: a fetch returning record ``i`` or None when missing."""

    @abstractmethod
    def _side_records(self, stream: str) -> AbstractContextManager[RecordFetch]:
        """One read transaction of side stream ``stream``: a fetch returning record ``i`` of
        it, or None when it is missing (also when the shard has no such stream)."""

    @abstractmethod
    def close(self) -> None:
        """Release the file handle / memory map (also called on a half-opened reader)."""

    def release_library_handle(self) -> None:
        """The caller has read the metadata and index arrays: drop what only they needed."""

    # -- shared steps -------------------------------------------------------------------------

    def meta_json(self) -> bytes:
        """The raw metadata JSON (parsed and validated by :mod:`shardkit.metadata`)."""
        with self._library_call("metadata"):
            raw = self._meta()
        if raw is None:
            raise StoreError(f"{self.path}: metadata is missing (incomplete or foreign store)")
        return raw

    def array(self, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        """Index array ``name``, checked against the dtype and shape the metadata promises."""
        with self._library_call(f"index array {name!r}"):
            arr = self._array(name, dtype, shape)
        if arr is None:
            raise StoreError(f"{self.path}: index array {name!r} is missing (damaged store)")
        if not isinstance(arr, np.ndarray):
            nbytes = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
            if len(arr) != nbytes:
                raise StoreError(f"{self.path}: index array {name!r} has {len(arr)} bytes, "
                                 f"metadata promises {dtype}{list(shape)} (damaged store)")
            arr = np.frombuffer(arr, dtype=dtype).reshape(shape)
        return check_array(self.path, name, arr, dtype, shape)

    @contextmanager
    def records(self) -> Iterator[RecordGetter]:
        """A context in which ``get(i)`` returns record ``i``'s bytes (valid only inside it).

        One context is one read transaction: a whole batch is fetched inside one.
        """
        with self._fetching(self._records, "records", "record {i}") as get:
            yield get

    @contextmanager
    def side_records(self, stream: str) -> Iterator[RecordGetter]:
        """Like :meth:`records`, for side stream ``stream``: ``get(i)`` is the side record of
        record ``i`` (``StoreError`` naming the shard, stream and record when it is missing)."""
        if not isinstance(stream, str) or not SIDE_STREAM.fullmatch(stream):
            raise ValueError(f"side stream name must match {SIDE_STREAM.pattern}, got {stream!r}")
        with self._fetching(lambda: self._side_records(stream), f"side stream {stream!r}",
                            f"record {{i}}'s side record in stream {stream!r}") as get:
            yield get

    def side_record(self, stream: str, i: int) -> bytes:
        """Record ``i``'s side record in ``stream``, copied: :meth:`side_records` for one
        record, in one read transaction of its own, without the per-context set-up."""
        item = f"record {i}'s side record in stream {stream!r}"
        if not isinstance(stream, str) or not SIDE_STREAM.fullmatch(stream):
            raise ValueError(f"side stream name must match {SIDE_STREAM.pattern}, got {stream!r}")
        try:
            with self._side_records(stream) as fetch:
                value = fetch(i)
                value = None if value is None else bytes(value)
        except StoreError:
            raise
        except self.library_errors as exc:
            raise StoreError(f"{self.path}: read of {item} failed: {exc}") from None
        if value is None:
            raise StoreError(f"{self.path}: {item} is missing (damaged store)")
        return value

    @contextmanager
    def _fetching(self, open_fetch: Callable[[], AbstractContextManager[RecordFetch]],
                  what: str, item: str) -> Iterator[RecordGetter]:
        path, errors = self.path, self.library_errors
        with ExitStack() as stack:
            with self._library_call(what):
                fetch = stack.enter_context(open_fetch())

            def get(i: int):
                try:
                    value = fetch(i)
                except errors as exc:
                    raise StoreError(f"{path}: read of {item.format(i=i)} failed: {exc}") from None
                if value is None:
                    raise StoreError(f"{path}: {item.format(i=i)} is missing (damaged store)")
                return value

            yield get


def check_array(path: str, name: str, arr: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if arr.dtype != np.dtype(dtype) or tuple(arr.shape) != tuple(shape):
        raise StoreError(
            f"{path}: index array {name!r} is {arr.dtype}{list(arr.shape)}, "
            f"metadata promises {np.dtype(dtype)}{list(shape)} (damaged store)")
    return arr


# A record's entries in the index arrays (label, height, width, CRC32, path offset) and its
# source path, about: the same for every backend.
RECORD_INDEX_BYTES = 64


@dataclass(frozen=True)
class Backend:
    """One entry of the format registry (:mod:`shardkit.formats`)."""

    name: str
    label: str  # how messages name it ("LMDB")
    suffixes: tuple[str, ...]  # output-name suffixes that choose it; the first is the default
    sniff: Callable[[bytes], bool]  # from a file's first 64 bytes: written by this backend?
    reader: type[ShardReader]
    writer: type[ShardWriter]
    #: Bytes a record of n bytes and its side records (stream -> bytes) take in a shard file
    #: (page rounding, per-record overhead): what ``shard_size`` plans with.
    record_bytes: Callable[..., int] = lambda n, side=None: plain_record_bytes(n, side)


# A side record's entries in the index: its offset (HDF5) and a typed field's byte count and
# CRC32 (:mod:`shardkit.fields`).
SIDE_INDEX_BYTES = 8 + 8 + 4


def plain_record_bytes(n: int, side: "dict[str, int] | None" = None) -> int:
    """Bytes of a record stored back to back with its side records (no page rounding)."""
    side = side or {}
    return n + RECORD_INDEX_BYTES + sum(side.values()) + SIDE_INDEX_BYTES * len(side)


__all__ = ["SIDE_INDEX_BYTES", "SIDE_STREAM", "Backend", "RecordGetter", "ShardReader",
           "ShardWriter", "check_array", "file_size", "plain_record_bytes", "remove_shard"]
