"""LMDB's on-disk layout as shardkit writes it, and the checks a file passes before LMDB maps it.

Record ``i`` is under the 8-byte big-endian key ``i`` (so keys sort in index order and are written
with ``append=True``). Its side record in stream ``S`` (see :mod:`shardkit.formats.base`) is under
that key followed by the ASCII name ``S`` (``record_key(i) + b"f.masks"``): it sorts right after
record ``i`` and before record ``i + 1``, so it lies beside its record in the B-tree and is
written in the same ordered pass. Index arrays are raw little-endian bytes under ``__array__/<name>``; their
dtype and shape live in the metadata JSON under ``__meta__``. No pickle anywhere.

LMDB trusts every byte of the file it maps; a damaged or foreign one can crash the process
(SIGBUS, NULL pointer), so ``layout`` and ``check_pages`` read the headers and pages first.
"""

from __future__ import annotations

import struct

import numpy as np

from ...errors import StoreError

META_KEY = b"__meta__"
ARRAY_PREFIX = b"__array__/"
LMDB_MAGIC = 0xBEEFC0DE
# Page and node flags of LMDB's on-disk format (mdb.c), for ``check_pages``.
P_BRANCH, P_LEAF, P_LEAF2, F_BIGDATA = 0x01, 0x02, 0x20, 0x01


def record_key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def side_key(i: int, stream: str) -> bytes:
    """The key of record ``i``'s side record in ``stream`` (a name of ``base.SIDE_STREAM``)."""
    return i.to_bytes(8, "big") + stream.encode("ascii")


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
