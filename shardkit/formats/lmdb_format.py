"""LMDB backend: one single-file LMDB environment per shard.

Record ``i`` is under the 8-byte big-endian key ``i`` (so keys sort in index order and are written
with ``append=True``). Index arrays are raw little-endian bytes under ``__array__/<name>``; their
dtype and shape live in the metadata JSON under ``__meta__``. No pickle anywhere.
"""

from __future__ import annotations

import errno
import os
import struct
from contextlib import contextmanager
from typing import Iterator

import lmdb
import numpy as np

from ..errors import StoreError
from .base import RecordGetter, ShardReader, ShardWriter, check_array

META_KEY = b"__meta__"
ARRAY_PREFIX = b"__array__/"
LMDB_MAGIC = 0xBEEFC0DE
INITIAL_MAP_SIZE = 64 << 20
TXN_BYTES = 64 << 20  # commit a write transaction every ~64 MiB
MAX_READERS = 2048
# LMDB trusts the 16-bit node offsets, key sizes and key counts inside a page: a damaged page can
# make it read up to this far past the page's start. Past the end of the file that is SIGBUS, so
# readers check the pages that close to the end before LMDB sees them (``check_tail_pages``).
PAGE_REACH = 16 + 2 * 0xFFFF + 8 + 0xFFFF
P_BRANCH, P_LEAF, P_LEAF2 = 0x01, 0x02, 0x20


def record_key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def sniff(head: bytes) -> bool:
    return len(head) >= 24 and struct.unpack_from("<I", head, 16)[0] == LMDB_MAGIC


def expected_size(path: str) -> int:
    """Bytes of LMDB pages the file must hold, from its two meta pages (the larger claim).

    LMDB maps the whole file; reading a page past the end of a truncated file raises SIGBUS, so
    readers check this before opening.
    """
    return layout(path)[1]


def layout(path: str) -> tuple[int, int]:
    """(page size, bytes of pages) from the meta pages; refuses headers LMDB could crash on."""
    with open(path, "rb") as f:
        head = f.read(4096)
        if not sniff(head):
            raise StoreError(f"{path}: not an LMDB file (bad magic)")
        psize = struct.unpack_from("<I", head, 40)[0]
        if psize < 512 or psize > 65536 or psize & (psize - 1):
            raise StoreError(f"{path}: LMDB header has an invalid page size {psize}")
        f.seek(psize)
        second = f.read(psize)
    if len(second) < 152 or struct.unpack_from("<I", second, 16)[0] != LMDB_MAGIC:
        raise StoreError(f"{path}: LMDB file has a damaged second meta page")
    # Whichever meta page LMDB picks, every page it may visit must lie inside the file.
    last_pg = max(struct.unpack_from("<Q", m, 136)[0] for m in (head, second))
    if last_pg >= 1 << 40:
        raise StoreError(f"{path}: LMDB header claims {last_pg} pages (damaged store)")
    return psize, (last_pg + 1) * psize


def check_tail_pages(path: str, psize: int, used: int, file_size: int) -> None:
    """Refuse a file whose B-tree pages near its end point LMDB past the end (SIGBUS otherwise).

    Only pages within ``PAGE_REACH`` of the end can do that. Which pages are B-tree pages (and
    not the middle of a large record) is learnt by walking the tree's branch pages from the root
    (few: a branch page indexes hundreds of pages); leaf pages are read only near the end.
    """
    last = used // psize  # pages LMDB may visit: 0 .. last - 1
    with open(path, "rb") as f:
        head = f.read(2 * psize)
        metas = [head[:psize], head[psize:]]
        newest = max(metas, key=lambda m: struct.unpack_from("<Q", m, 144)[0])
        roots = [struct.unpack_from("<Q", newest, 128)[0]]
        seen: set[int] = set()
        while roots:
            pgno = roots.pop()
            if pgno < 2 or pgno >= last or pgno in seen:
                continue  # LMDB refuses those pages itself
            seen.add(pgno)
            start = pgno * psize
            f.seek(start)
            flags = struct.unpack_from("<H", f.read(16), 10)[0]
            if not flags & (P_BRANCH | P_LEAF) or flags & P_LEAF2:
                continue
            near_end = start + PAGE_REACH > file_size
            if flags & P_LEAF and not near_end:
                continue  # cannot reach past the end; nothing below it
            f.seek(start)  # near the end: the page and the rest of the file after it
            window = np.frombuffer(f.read(PAGE_REACH if near_end else psize), dtype=np.uint8)
            offs = _node_offsets(window)
            if offs is None:
                raise StoreError(f"{path}: LMDB page {pgno} is damaged (its nodes lie outside "
                                 f"{'the file' if near_end else 'the page'})")
            if flags & P_BRANCH and not flags & P_LEAF:
                w = window.astype(np.int64)
                roots += (w[offs] | w[offs + 1] << 8 | w[offs + 2] << 16 | w[offs + 3] << 24
                          | w[offs + 4] << 32 | w[offs + 5] << 40).tolist()


def _node_offsets(window: np.ndarray) -> np.ndarray | None:
    """Node offsets of the page at the start of ``window`` (the page and the rest of the file
    after it, up to ``PAGE_REACH``), or None when a key count, node or key lies past its end."""
    lower = int(window[12]) | int(window[13]) << 8
    if lower < 16 or lower > len(window):
        return None
    offs = window[16:lower - (lower & 1)].view("<u2").astype(np.int64)
    if (offs + 8 > len(window)).any():
        return None
    ksize = window[offs + 6].astype(np.int64) | window[offs + 7].astype(np.int64) << 8
    if (offs + 8 + ksize > len(window)).any():
        return None
    return offs


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
        self._env = lmdb.open(path, subdir=False, map_size=self._map_size, lock=False,
                              meminit=True, sync=False, metasync=False, readahead=False)
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0

    def append(self, data: bytes) -> None:
        self._pending.append((record_key(self.count), data))
        self._pending_bytes += len(data)
        self.count += 1
        if self._pending_bytes >= TXN_BYTES:
            self._commit()

    def _commit(self) -> None:
        """Write pending items in one transaction, doubling the map until they fit."""
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

    def finish(self, arrays: dict[str, np.ndarray], meta_json: bytes) -> None:
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


# lmdb refuses to open one file twice in a process (a forked child inherits the parent's handle
# too), so each process keeps one environment per file and shares it between readers. Files are
# told apart by inode, not name: a store replaced under the same name is a different file.
_ENVS: dict[tuple[int, int], tuple[int, lmdb.Environment, int]] = {}


def _env_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _acquire_env(path: str) -> lmdb.Environment:
    key = _env_key(path)
    pid = os.getpid()
    entry = _ENVS.get(key)
    if entry is not None:
        owner, env, refs = entry
        if owner == pid:
            _ENVS[key] = (owner, env, refs + 1)
            return env
        env.close()  # inherited over fork: unusable here, and it blocks a fresh open
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                    meminit=False, max_readers=MAX_READERS, max_dbs=0,
                    map_size=os.stat(path).st_size)
    _ENVS[key] = (pid, env, 1)
    return env


def _map_range(path: str, size: int) -> tuple[int, int] | None:
    """Address range of this process's LMDB map of ``path`` (Linux ``/proc/self/maps``)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) >= 5 and fields[4] == str(st.st_ino) and fields[3] == dev \
                and int(fields[2], 16) == 0:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if hi - lo >= size:
                return lo, lo + size
    return None


def _address(buf: memoryview) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data if len(buf) else 0


def _release_env(env: lmdb.Environment) -> None:
    key = next((k for k, v in _ENVS.items() if v[1] is env), None)
    entry = _ENVS.get(key) if key is not None else None
    if entry is None:
        return
    owner, _, refs = entry
    if refs > 1:
        _ENVS[key] = (owner, env, refs - 1)
    else:
        del _ENVS[key]
        env.close()


class LmdbShardReader(ShardReader):
    format_name = "lmdb"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        psize, need = layout(path)
        if self.file_size < need:
            raise StoreError(
                f"{path}: LMDB file is truncated ({self.file_size} bytes, header needs {need})")
        check_tail_pages(path, psize, need, self.file_size)
        try:
            self._env = _acquire_env(path)
            # Index arrays are views into this long-lived read transaction's map: no copies.
            self._array_txn = self._env.begin(buffers=True)
        except lmdb.Error as exc:
            raise StoreError(f"{path}: cannot open LMDB store: {exc}") from None
        self._range = _map_range(path, self.file_size)

    def _inside(self, value: memoryview, what: str) -> memoryview:
        """Refuse a value that LMDB (misled by a damaged page) places outside the file: touching
        it would crash the process."""
        n, lo_hi = len(value), self._range
        if n > self.file_size:
            raise StoreError(f"{self.path}: {what} is larger than the file (damaged store)")
        if lo_hi is not None and n:
            start = _address(value)
            if not lo_hi[0] <= start <= lo_hi[1] - n:
                raise StoreError(f"{self.path}: {what} lies outside the file (damaged store)")
        return value

    def _get(self, key: bytes, what: str) -> bytes:
        try:
            with self._env.begin(buffers=True) as txn:
                value = txn.get(key)
                if value is not None:
                    value = bytes(self._inside(value, what))
        except lmdb.Error as exc:
            raise StoreError(f"{self.path}: LMDB read failed for {what}: {exc}") from None
        if value is None:
            raise StoreError(f"{self.path}: {what} is missing (incomplete or foreign store)")
        return value

    def meta_json(self) -> bytes:
        return self._get(META_KEY, "metadata")

    def array(self, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        try:
            raw = self._array_txn.get(ARRAY_PREFIX + name.encode())
        except lmdb.Error as exc:
            raise StoreError(f"{self.path}: LMDB read failed for index array {name!r}: {exc}") from None
        if raw is None:
            raise StoreError(f"{self.path}: index array {name!r} is missing (damaged store)")
        itemsize = np.dtype(dtype).itemsize
        self._inside(raw, f"index array {name!r}")
        if len(raw) != itemsize * int(np.prod(shape, dtype=np.int64)):
            raise StoreError(f"{self.path}: index array {name!r} has {len(raw)} bytes, "
                             f"metadata promises {dtype}{list(shape)} (damaged store)")
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
        return check_array(self.path, name, arr, dtype, shape)

    @contextmanager
    def records(self) -> Iterator[RecordGetter]:
        try:
            txn = self._env.begin(buffers=True)
        except lmdb.Error as exc:
            raise StoreError(f"{self.path}: LMDB read failed: {exc}") from None
        path, inside = self.path, self._inside

        def get(i: int):
            try:
                value = txn.get(record_key(i))
            except lmdb.Error as exc:
                raise StoreError(f"{path}: LMDB read of record {i} failed: {exc}") from None
            if value is None:
                raise StoreError(f"{path}: record {i} is missing (damaged store)")
            return inside(value, f"record {i}")

        try:
            yield get
        finally:
            txn.abort()

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            self._array_txn.abort()
            _release_env(env)
