"""LMDB backend: one single-file LMDB environment per shard.

Record ``i`` is under the 8-byte big-endian key ``i`` (so keys sort in index order and are written
with ``append=True``). Index arrays are raw little-endian bytes under ``__array__/<name>``; their
dtype and shape live in the metadata JSON under ``__meta__``. No pickle anywhere.
"""

from __future__ import annotations

import errno
import os
import struct
import weakref
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
TXN_BYTES = 8 << 20  # commit every ~8 MiB: written while encoders work, not all at the end
MAX_READERS = 2048
# Page and node flags of LMDB's on-disk format (mdb.c), for ``check_pages``.
P_BRANCH, P_LEAF, P_LEAF2, F_BIGDATA = 0x01, 0x02, 0x20, 0x01


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


def check_pages(path: str, psize: int, used: int, file_size: int) -> None:
    """Refuse a file whose live B-tree could lead LMDB (or py-lmdb) outside a page or the file.

    LMDB trusts what a page says: 16-bit node offsets, key counts and key sizes, 32-bit record
    sizes, node flags. A damaged value makes it read past the end of the file (SIGBUS) or follow
    a NULL pointer (a duplicate-data flag on a plain database), and py-lmdb touches every page of
    a record it returns. So every page reachable from the root is checked first: each node and
    key inside its page, each record inside its page or, on overflow pages, inside the file.
    Cost: the branch and leaf pages only, about 30 bytes per record for records stored on
    overflow pages (the usual case), the whole file when records are tiny (inline).
    """
    last = used // psize  # pages LMDB may visit: 0 .. last - 1
    with open(path, "rb", buffering=0) as f:

        def read(size: int, offset: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        head = read(2 * psize, 0)
        metas = [head[:psize], head[psize:]]
        newest = max(metas, key=lambda m: struct.unpack_from("<Q", m, 144)[0])
        depth = struct.unpack_from("<H", newest, 94)[0]  # levels; the last holds the leaves
        level, seen, leaves = [struct.unpack_from("<Q", newest, 128)[0]], set(), []
        for _ in range(max(depth - 1, 0)):  # branch levels, page by page (few pages)
            below = []
            for pgno in level:
                if pgno < 2 or pgno >= last or pgno in seen:
                    continue  # LMDB refuses those pages itself
                seen.add(pgno)
                page = np.frombuffer(read(psize, pgno * psize), dtype=np.uint8)
                flags = int(page[10]) | int(page[11]) << 8
                if flags & P_LEAF2:
                    raise StoreError(f"{path}: LMDB page {pgno} is damaged (bad page flags)")
                if flags & P_BRANCH:
                    nodes = _check_nodes(page[None, :], psize, last, file_size, leaf=False)
                    if nodes is None:
                        raise StoreError(f"{path}: LMDB page {pgno} is damaged")
                    below += nodes.tolist()
                elif flags & P_LEAF:
                    leaves.append(pgno)
            level = below
        leaves += [pg for pg in level if 2 <= pg < last and pg not in seen]
        leaves = sorted(set(leaves))
        span = 1024  # pages per step: bounded memory
        for i in range(0, len(leaves), span):
            chunk = np.array(leaves[i:i + span], dtype=np.int64)
            lo, hi = int(chunk[0]), int(chunk[-1]) + 1
            if hi - lo <= 4 * len(chunk):  # dense (tiny records): one read, pick the leaves
                whole = np.frombuffer(read((hi - lo) * psize, lo * psize), dtype=np.uint8)
                pages = whole.reshape(hi - lo, psize)[chunk - lo]
            else:  # sparse (records on overflow pages): page by page
                pages = np.frombuffer(b"".join(read(psize, int(pg) * psize) for pg in chunk),
                                      dtype=np.uint8).reshape(len(chunk), psize)
            flags = pages[:, 10].astype(np.int64) | pages[:, 11].astype(np.int64) << 8
            if ((flags & (P_BRANCH | P_LEAF | P_LEAF2)) != P_LEAF).any() or \
                    _check_nodes(pages, psize, last, file_size, leaf=True) is None:
                raise StoreError(f"{path}: an LMDB leaf page among {lo}..{hi - 1} is damaged "
                                 "(a key or record lies outside its page or the file)")


def _check_nodes(pages: np.ndarray, psize: int, last: int, file_size: int,
                 leaf: bool) -> np.ndarray | None:
    """Check every node of these branch or leaf pages (a k x psize array); None when damaged.

    Returns the child page numbers (branch pages) or an empty array (leaf pages).
    """
    lower = pages[:, 12].astype(np.int64) | pages[:, 13].astype(np.int64) << 8
    if (lower < 16).any() or (lower > psize).any():
        return None
    slots = pages[:, 16:].view("<u2")
    count = (lower - 16) // 2  # nodes per page
    rows = np.repeat(np.arange(len(pages)), count)
    cols = np.arange(len(rows)) - np.repeat(np.cumsum(count) - count, count)
    offs = slots[rows, cols].astype(np.int64)
    if (offs + 8 > psize).any():
        return None
    flat = pages.reshape(-1)
    base = rows * psize + offs

    def u16(at: np.ndarray) -> np.ndarray:
        return flat[at].astype(np.int64) | flat[at + 1].astype(np.int64) << 8

    ksize = u16(base + 6)
    end_key = offs + 8 + ksize
    if (end_key > psize).any():
        return None
    if not leaf:
        return u16(base) | u16(base + 2) << 16 | u16(base + 4) << 32  # child page numbers
    nflags, dsize = u16(base + 4), u16(base) | u16(base + 2) << 16
    if ((nflags != 0) & (nflags != F_BIGDATA)).any():
        return None  # anything else (duplicate data, sub-databases) is never written here
    inline = nflags == 0
    if (end_key[inline] + dsize[inline] > psize).any():
        return None
    big = ~inline
    if big.any():
        if (end_key[big] + 8 > psize).any():
            return None
        at = base[big] + 8 + ksize[big]
        pgno = u16(at) | u16(at + 2) << 16 | u16(at + 4) << 32 | u16(at + 6) << 48
        if (pgno < 2).any() or (pgno >= last).any() or \
                (pgno * psize + 16 + dsize[big] > file_size).any():
            return None
    return np.zeros(0, dtype=np.int64)


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
    for other, (owner, env, _) in list(_ENVS.items()):
        if owner != pid:  # inherited over fork: unusable here, holds a descriptor, blocks an open
            env.close()
            del _ENVS[other]
    entry = _ENVS.get(key)
    if entry is not None:
        owner, env, refs = entry
        _ENVS[key] = (owner, env, refs + 1)
        return env
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                    meminit=False, max_readers=MAX_READERS, max_dbs=0,
                    map_size=os.stat(path).st_size)
    _ENVS[key] = (pid, env, 1)
    return env


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
        check_pages(path, psize, need, self.file_size)
        try:
            self._env = _acquire_env(path)
        except lmdb.Error as exc:
            raise StoreError(f"{path}: cannot open LMDB store: {exc}") from None
        try:
            # Index arrays are views into this long-lived read transaction's map: no copies.
            self._array_txn = self._env.begin(buffers=True)
        except lmdb.Error as exc:
            _release_env(self._env)
            raise StoreError(f"{path}: cannot open LMDB store: {exc}") from None
        # A reader dropped without close() must still give its environment back, or a later open
        # of the same file in this process would be refused as "already open".
        self._release = weakref.finalize(self, _release_reader, self._env, self._array_txn)

    def _get(self, key: bytes, what: str) -> bytes:
        try:
            with self._env.begin() as txn:
                value = txn.get(key)
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
        path = self.path

        def get(i: int):
            try:
                value = txn.get(record_key(i))
            except lmdb.Error as exc:
                raise StoreError(f"{path}: LMDB read of record {i} failed: {exc}") from None
            if value is None:
                raise StoreError(f"{path}: record {i} is missing (damaged store)")
            return value

        try:
            yield get
        finally:
            txn.abort()

    def close(self) -> None:
        self._env = None
        release = getattr(self, "_release", None)
        if release is not None:
            release()


def _release_reader(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
    txn.abort()
    _release_env(env)
