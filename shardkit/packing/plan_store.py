"""The plan's per-source arrays on disk: what a pack of a billion sources keeps out of memory.

A listing writes its sources straight into a plan folder (:class:`SourceWriter`), chunk by chunk:

* ``paths.bin``    every source's path (as the source names it), UTF-8 with surrogate escapes
  (``os.fsencode``), one byte array;
* ``offsets.bin``  little-endian int64, ``n + 1``: path ``i`` is ``paths[offsets[i]:offsets[i+1]]``;
* ``labels.bin``   little-endian int32, ``n``: each source's class index;
* ``slots.bin`` / ``places.bin``  int64, the mixed layout (:mod:`.layout`): the source written at
  each slot, and the slot of each source (its inverse); absent for the sources' order;
* ``index-shard.bin`` / ``index-refs.bin``  a container source's index (:class:`.sources.ContainerIndex`);
* ``header.json``  the rest, O(classes + shards): root, classes, bounds, settings, skips, and
  the plan's seal: the SHA-256 of each file above (``files``), the header's own CRC32.

All in the sources' own order. Raw little-endian arrays (``np.memmap``, no pickle): a process
maps only the slice it reads, so the pack's client holds O(shards) and a task O(its shard). The
fingerprint and the seal (:mod:`.plan_seal`) read the files in chunks, never all at once.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from ..errors import PackError

HEADER = "header.json"
PATHS, OFFSETS, LABELS = "paths.bin", "offsets.bin", "labels.bin"
SLOTS, PLACES = "slots.bin", "places.bin"
INDEX_SHARD, INDEX_REFS = "index-shard.bin", "index-refs.bin"
LABEL_DTYPE = np.dtype("<i4")
INDEX_DTYPE = np.dtype("<i8")
# Sources per chunk of a pass over the arrays: a few MB of temporaries at most, so a pass's memory
# does not grow with the plan (16 Ki: a billion sources are 61,000 chunks).
CHUNK = 1 << 14

START_OVER = "pack again with `overwrite=True` to start over"


class PlanError(PackError):
    """A pack's plan folder cannot be used: damaged, altered, or made from other sources. The
    same files fail the same way, so it is never retried; ``problem`` is the line without the
    advice."""

    def __init__(self, problem: str, advice: str = START_OVER) -> None:
        super().__init__(f"{problem}; {advice}")
        self.problem, self.advice = problem, advice

    def __reduce__(self) -> tuple[Any, ...]:  # a Dask worker's error, rebuilt on the client
        return PlanError, (self.problem, self.advice)


def damaged(folder: str, what: str) -> PlanError:
    return PlanError(f"the pack's plan in {folder} is damaged ({what})")


def encode_path(path: str) -> bytes:
    return os.fsencode(path)


def decode_path(data: bytes) -> str:
    return os.fsdecode(data)


class SourceWriter:
    """Appends ``(path, label)`` batches to the plan folder's arrays; ``close()`` ends them."""

    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self._paths = open(os.path.join(folder, PATHS), "wb")
        self._offsets = open(os.path.join(folder, OFFSETS), "wb")
        self._labels = open(os.path.join(folder, LABELS), "wb")
        self._offsets.write(np.zeros(1, INDEX_DTYPE).tobytes())
        self.count = 0
        self.bytes = 0

    def add(self, paths: Sequence[str], labels: Any) -> None:
        """Sources ``paths`` with ``labels`` (one int for all, or one per path)."""
        if not paths:
            return
        encoded = [encode_path(p) for p in paths]
        lengths = np.fromiter(map(len, encoded), INDEX_DTYPE, len(encoded))
        self.add_encoded(b"".join(encoded), lengths, labels)

    def add_encoded(self, blob: bytes, lengths: np.ndarray, labels: Any) -> None:
        """Sources already encoded: ``blob`` holds them back to back, ``lengths`` each's size."""
        n = len(lengths)
        if not n:
            return
        ends = np.cumsum(lengths, dtype=INDEX_DTYPE) + self.bytes
        labels = np.broadcast_to(np.asarray(labels, LABEL_DTYPE), (n,))
        self._paths.write(blob)
        self._offsets.write(ends.tobytes())
        self._labels.write(np.ascontiguousarray(labels, LABEL_DTYPE).tobytes())
        self.count += n
        self.bytes = int(ends[-1])

    def copy_from(self, path_file: str, offsets: np.ndarray, label: int) -> None:
        """Append sources whose paths are ``path_file[offsets[0]:offsets[-1]]`` (a listing task's
        part file), all of class ``label``, copying the bytes in chunks."""
        n = len(offsets) - 1
        if n <= 0:
            return
        first = int(offsets[0])
        with open(path_file, "rb") as f:
            f.seek(first)
            left = int(offsets[-1]) - first
            while left:
                data = f.read(min(left, 8 << 20))
                if not data:
                    raise OSError(f"{path_file}: shorter than its offsets")
                self._paths.write(data)
                left -= len(data)
        for a in range(0, n, CHUNK):
            b = min(n, a + CHUNK)
            ends = offsets[a + 1:b + 1].astype(INDEX_DTYPE) - first + self.bytes
            self._offsets.write(ends.tobytes())
            self._labels.write(np.full(b - a, label, LABEL_DTYPE).tobytes())
        self.count += n
        self.bytes += int(offsets[-1]) - first

    def close(self) -> None:
        for f in (self._paths, self._offsets, self._labels):
            f.close()


def _map(folder: str, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only map of one array file (an empty array for an empty one: mmap refuses those)."""
    if not int(np.prod(shape)):
        return np.zeros(shape, dtype)
    return np.memmap(os.path.join(folder, name), dtype=dtype, mode="r", shape=shape)


class Rows(NamedTuple):
    """Slots ``a:b`` of a plan, read together (:meth:`SourceTable.rows`): the source written at
    each slot (its index in the sources' order), its path and its label."""

    sources: list[int]
    paths: list[str]
    labels: list[int]


class SourceTable:
    """The sources of a plan folder, read where they are needed: ``path(i)``, ``label(i)``,
    ``slot(i)`` read a few bytes each (``pread``: the pages stay page cache, not this process's
    memory, however many sources a long-lived worker reads); ``read(name, a, b)`` a range."""

    def __init__(self, folder: str, count: int, mixed: bool, indexed: bool = False) -> None:
        self.folder, self.count, self.mixed, self.indexed = folder, count, mixed, indexed
        self._fds: dict[str, int] = {}

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            fd = self._fds[name] = os.open(os.path.join(self.folder, name),
                                           os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return fd

    def read(self, name: str, dtype: Any, a: int, b: int, width: int = 1) -> np.ndarray:
        """Items ``a:b`` of an array file (``width`` values an item)."""
        dtype = np.dtype(dtype)
        size = dtype.itemsize * width
        if b <= a:
            return np.zeros((0, width) if width > 1 else 0, dtype)
        data = os.pread(self._fd(name), (b - a) * size, a * size)
        if len(data) != (b - a) * size:
            raise damaged(self.folder, f"{name} is shorter than its header says")
        out = np.frombuffer(data, dtype)
        return out.reshape(-1, width) if width > 1 else out

    def path(self, i: int) -> str:
        a, b = self.read(OFFSETS, INDEX_DTYPE, i, i + 2).tolist()
        return decode_path(os.pread(self._fd(PATHS), b - a, a))

    def label(self, i: int) -> int:
        return int(self.read(LABELS, LABEL_DTYPE, i, i + 1)[0])

    def slot(self, i: int) -> int:
        """The source written at slot ``i``."""
        return int(self.read(SLOTS, INDEX_DTYPE, i, i + 1)[0]) if self.mixed else i

    def rows(self, a: int, b: int) -> Rows:
        """Slots ``a:b`` (a shard) in a few reads: ``path``/``label``/``slot`` per slot cost a
        tenth of a tiny image's packing time. In the sources' order the range is three
        contiguous reads; in the mixed layout the slots' sources are scattered over the files,
        so each is read where it lies (three small reads a source, no map: a long-lived worker's
        memory does not grow with the sources it packs)."""
        if not self.mixed:
            offsets = self.read(OFFSETS, INDEX_DTYPE, a, b + 1).tolist()
            base = offsets[0]
            blob = os.pread(self._fd(PATHS), offsets[-1] - base, base)
            paths = [decode_path(blob[s - base:e - base])
                     for s, e in zip(offsets[:-1], offsets[1:])]
            return Rows(list(range(a, b)), paths, self.read(LABELS, LABEL_DTYPE, a, b).tolist())
        sources = self.read(SLOTS, INDEX_DTYPE, a, b).tolist()
        fo, fp, fl = self._fd(OFFSETS), self._fd(PATHS), self._fd(LABELS)
        pair, one = struct.Struct("<qq"), struct.Struct("<i")
        paths, labels = [], []
        for i in sources:
            data = os.pread(fo, 16, 8 * i)
            label = os.pread(fl, 4, 4 * i)
            if len(data) != 16 or len(label) != 4:
                raise damaged(self.folder, f"{OFFSETS} or {LABELS} is shorter than its header "
                              "says")
            start, end = pair.unpack(data)
            paths.append(decode_path(os.pread(fp, end - start, start)))
            labels.append(one.unpack(label)[0])
        return Rows(sources, paths, labels)

    @property
    def slots(self) -> np.ndarray | None:
        """Every slot's source, in memory (a merge's or a test's view); None: identity."""
        return read_array(self.folder, SLOTS, INDEX_DTYPE, self.count) if self.mixed else None

    def index_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (_map(self.folder, INDEX_SHARD, np.dtype("<i4"), (self.count,)),
                _map(self.folder, INDEX_REFS, INDEX_DTYPE, (self.count, 2)))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __getstate__(self) -> dict[str, Any]:  # files are opened again where it is unpickled
        return {k: v for k, v in self.__dict__.items() if k != "_fds"} | {"_fds": {}}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def read_chunks(folder: str, name: str, dtype: Any, count: int,
                chunk: int = CHUNK) -> Iterable[np.ndarray]:
    """An array file in chunks of ``chunk`` items, read (not mapped: the pages stay page cache,
    not this process's memory)."""
    dtype = np.dtype(dtype)
    with open(os.path.join(folder, name), "rb") as f:
        for a in range(0, count, chunk):
            n = min(chunk, count - a)
            data = f.read(n * dtype.itemsize)
            if len(data) != n * dtype.itemsize:
                raise damaged(folder, f"{name} is shorter than its header says")
            yield np.frombuffer(data, dtype)


def read_array(folder: str, name: str, dtype: Any, count: int) -> np.ndarray:
    """A whole array file, into memory."""
    if not count:
        return np.zeros(0, dtype)
    return np.fromfile(os.path.join(folder, name), dtype=dtype, count=count)


def write_array(folder: str, name: str, array: np.ndarray, dtype: Any) -> None:
    with open(os.path.join(folder, name), "wb") as f:
        np.ascontiguousarray(array, dtype).tofile(f)


def remap_labels(folder: str, count: int, table: np.ndarray) -> None:
    """Replace each label ``l`` by ``table[l]`` in place, chunk by chunk."""
    path = os.path.join(folder, LABELS)
    with open(path, "r+b") as f:
        for a in range(0, count, CHUNK):
            n = min(CHUNK, count - a)
            f.seek(a * LABEL_DTYPE.itemsize)
            chunk = np.frombuffer(f.read(n * LABEL_DTYPE.itemsize), LABEL_DTYPE)
            f.seek(a * LABEL_DTYPE.itemsize)
            f.write(table[chunk].astype(LABEL_DTYPE).tobytes())


def relative_chunk(blob: bytes, offsets: np.ndarray, root: str) -> tuple[bytes, np.ndarray]:
    """The paths of one chunk relative to ``root`` (as :func:`.writer.relative_path` gives
    them): (their bytes back to back, each one's length). A plain prefix cut, vectorized, when
    every path starts with ``root/``; else path by path."""
    from .writer import relative_path

    prefix = np.frombuffer(encode_path(root.rstrip(os.sep) + os.sep), np.uint8)
    data = np.frombuffer(blob, np.uint8)
    starts = offsets[:-1] - offsets[0]
    lengths = np.diff(offsets)
    k = len(prefix)
    if len(starts) and (lengths > k).all() and all(
            (data[starts + j] == prefix[j]).all() for j in range(k)):
        inside = np.zeros(len(data) + 1, np.int8)  # +1 where a prefix starts, -1 past its end
        inside[starts] = 1
        inside[starts + k] -= 1
        rest = data[np.cumsum(inside[:-1], dtype=np.int8) == 0]
        rlengths = lengths - k
        ends = np.cumsum(rlengths)
        firsts, lasts = rest[ends - rlengths], rest[ends - 1]
        restb = rest.tobytes()
        # relative_path cuts the prefix only where what is left is normalised ('a//b',
        # 'a/./b', 'a/..', './a', 'a/' are not): chunks with any of those go path by path.
        if b"//" not in restb and b"/./" not in restb and b"/../" not in restb \
                and not (firsts == ord(".")).any() and not (lasts == ord("/")).any() \
                and not any(restb[e - 2:e] == b"/." or restb[e - 3:e] == b"/.."
                            for e in ends[lasts == ord(".")].tolist()):
            return restb, rlengths
    parts = [encode_path(relative_path(root, decode_path(blob[a:b])))
             for a, b in zip(starts.tolist(), (starts + lengths).tolist())]
    return b"".join(parts), np.fromiter(map(len, parts), INDEX_DTYPE, len(parts))
