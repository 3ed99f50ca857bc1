"""Near-duplicates between two stores (train/test leakage): each record decoded as the reader
gives it, hashed (:func:`shardkit.dedup.phash`), and every cross pair within the threshold
listed (:func:`shardkit.dedup.cross_pairs`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..read.dataset import ShardDataset
from .hashing import phash
from .search import DEFAULT_THRESHOLD, check_threshold, cross_pairs


def store_hashes(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """(each record's source path, its pHash) for the store at ``path``, in record order."""
    ds = ShardDataset(path, output="numpy")
    names, hashes = [], np.empty(len(ds), dtype=np.uint64)
    for i in range(len(ds)):
        hashes[i] = phash(ds[i][0])
        names.append(ds.source_path(i))
    return names, hashes


def leaks(a: str | os.PathLike, b: str | os.PathLike, threshold: int = DEFAULT_THRESHOLD
          ) -> list[dict[str, Any]]:
    """Every pair of a record of store ``a`` and one of store ``b`` whose pHashes are within
    ``threshold`` bits: ``{"a": path, "a_index": i, "b": path, "b_index": j, "distance": d}``,
    sorted by ``a_index`` then ``b_index``."""
    threshold = check_threshold(threshold)
    names_a, hashes_a = store_hashes(a)
    names_b, hashes_b = store_hashes(b)
    return [{"a": names_a[i], "a_index": i, "b": names_b[j], "b_index": j, "distance": d}
            for i, j, d in cross_pairs(hashes_a, hashes_b, threshold)]
