"""Finding a record by its key (``ShardDataset.index_of``): a sorted table of the keys' 64-bit
BLAKE2b hashes and the index of each, numpy arrays (16 bytes a record, no Python object per
record). A hash match is confirmed by the record's own key, so a collision is never a wrong
answer."""

from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np


def key_hash(key: str) -> int:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class KeyTable:
    """The hashes of records ``0..count-1``'s keys (``key_of(i)``), sorted."""

    def __init__(self, key_of: Callable[[int], str], count: int) -> None:
        hashes = np.fromiter((key_hash(key_of(i)) for i in range(count)), np.int64, count)
        self.order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.order]

    def find(self, key: str, key_of: Callable[[int], str]) -> int:
        h = key_hash(key)
        lo = int(np.searchsorted(self.hashes, h, side="left"))
        hi = int(np.searchsorted(self.hashes, h, side="right"))
        for i in self.order[lo:hi].tolist():
            if key_of(i) == key:
                return int(i)
        raise KeyError(key)
