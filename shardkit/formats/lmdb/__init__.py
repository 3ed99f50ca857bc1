"""LMDB backend: one single-file LMDB environment per shard.

``validate`` holds the on-disk layout (keys, magic) and the page checks run before LMDB maps a
file; ``writer`` and ``reader`` the two sides. Side records (a typed field's masks) are values
under the record's key followed by the stream's name, right after their record
(``validate.side_key``).
"""

from ..base import RECORD_INDEX_BYTES, SIDE_INDEX_BYTES, Backend
from .reader import LmdbShardReader
from .validate import sniff
from .writer import LmdbShardWriter

PAGE = 4096  # LMDB's page: the OS page size (x86-64, aarch64 with 4 KiB pages)
_PAGE_HEADER, _NODE_HEADER, _KEY = 16, 8, 8  # bytes (lmdb's PAGEHDRSZ, NODESIZE; record_key)


def record_bytes(n: int, side: dict[str, int] | None = None) -> int:
    """Bytes a record of ``n`` bytes, with its side records (stream -> bytes), takes in an
    LMDB file: its index entries plus each value's node (see ``value_bytes``)."""
    side = side or {}
    return (value_bytes(n, _KEY) + RECORD_INDEX_BYTES
            + sum(value_bytes(m, _KEY + len(s)) + SIDE_INDEX_BYTES for s, m in side.items()))


def value_bytes(n: int, key: int) -> int:
    """Bytes a value of ``n`` bytes under a ``key``-byte key takes: a value too big for half a
    page goes to its own overflow pages (whole pages); small ones share leaf pages, as many
    whole nodes as fit in one."""
    node = _NODE_HEADER + key + n
    if node > (PAGE - _PAGE_HEADER) // 2:
        pages = -(-(_PAGE_HEADER + n) // PAGE)
        leaf = _NODE_HEADER + key + 8 + 2  # the node that points at the overflow pages
        return pages * PAGE + leaf
    per_page = (PAGE - _PAGE_HEADER) // (node + 2)  # + its 2-byte pointer in the page
    return PAGE // per_page


BACKEND = Backend(name="lmdb", label="LMDB", suffixes=(".lmdb",), sniff=sniff,
                  reader=LmdbShardReader, writer=LmdbShardWriter, record_bytes=record_bytes)
