"""Hamming search over 64-bit hashes: exact (every pair compared, no pair missed), with numpy's
popcount (``np.bitwise_count``) on XORs, a block of rows at a time so memory stays bounded.

Exact search needs no index library and loses no pair to approximation; its cost is one XOR and
popcount per pair: at pack time each new record is compared with every kept one (10,000 images:
5e7 comparisons, well under a second in all); between two stores of N and M records, N x M
(10^5 x 10^4 takes seconds). Far larger corpora want a multi-index (pigeonhole on byte chunks)
or faiss's binary indexes.
"""

from __future__ import annotations

import numpy as np

#: Pairs at this Hamming distance or less are near-duplicates (docs/dedup.md: how it was chosen).
DEFAULT_THRESHOLD = 8
_BLOCK = 1 << 22  # XOR results per block: 32 MB of uint64


def as_hashes(values) -> np.ndarray:
    """Hashes (Python ints below 2**64, or an integer array) as a uint64 array."""
    return np.asarray([int(v) for v in values] if not isinstance(values, np.ndarray) else values,
                      dtype=np.uint64)


def check_threshold(threshold) -> int:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)) \
            or not 0 <= threshold <= 64:
        raise ValueError(f"`threshold` must be an integer in 0..64, not {threshold!r}")
    return int(threshold)


class HammingIndex:
    """A growing set of hashes: :meth:`nearest` within a distance, :meth:`add`."""

    def __init__(self) -> None:
        self._hashes = np.zeros(1024, dtype=np.uint64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def nearest(self, value: int, threshold: int) -> tuple[int, int] | None:
        """(position, distance) of the closest hash added, the earliest among equals, if it is
        within ``threshold``; else None."""
        if not self._n:
            return None
        d = np.bitwise_count(self._hashes[:self._n] ^ np.uint64(value))
        i = int(np.argmin(d))  # argmin: the first of the smallest
        return (i, int(d[i])) if d[i] <= threshold else None

    def add(self, value: int) -> None:
        if self._n == len(self._hashes):
            self._hashes = np.concatenate([self._hashes, np.zeros_like(self._hashes)])
        self._hashes[self._n] = np.uint64(value)
        self._n += 1


def cross_pairs(a, b, threshold: int = DEFAULT_THRESHOLD) -> list[tuple[int, int, int]]:
    """Every (i, j, distance) with ``a[i]`` and ``b[j]`` within ``threshold`` bits, sorted by
    i, then j."""
    threshold = check_threshold(threshold)
    a, b = as_hashes(a), as_hashes(b)
    out: list[tuple[int, int, int]] = []
    if not len(a) or not len(b):
        return out
    rows = max(1, _BLOCK // len(b))
    for start in range(0, len(a), rows):
        d = np.bitwise_count(a[start:start + rows, None] ^ b[None, :])
        ii, jj = np.nonzero(d <= threshold)
        out.extend(zip((ii + start).tolist(), jj.tolist(), d[ii, jj].tolist()))
    return out
