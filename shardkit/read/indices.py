"""Record indices checked as a Python list checks its own: integers only, within range.

``ds[1.9]``, ``ds["3"]`` or ``ds[np.float64(2)]`` raise ``TypeError`` (a list never truncates);
``ds[2**63]`` raises ``IndexError`` like any other index past the end; integer types that
``operator.index`` accepts (``int``, ``bool``, numpy integers, one-element integer tensors)
work, and negative indices count from the end. ``locate_many`` maps checked global indices to
(shard, index within the shard).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np


def _type_error(value: Any) -> TypeError:
    return TypeError(f"ShardDataset indices must be integers, not {type(value).__name__}")


def _range_error(index: int, count: int) -> IndexError:
    return IndexError(f"index {index} out of range for a dataset of {count} records")


def check_index(index: Any, count: int) -> int:
    """``index`` as an int in ``0..count-1`` (a negative one counts from the end)."""
    try:
        i = operator.index(index)
    except TypeError:
        raise _type_error(index) from None
    if not -count <= i < count:
        raise _range_error(i, count)
    return i + count if i < 0 else i


def check_indices(indices: Any, count: int) -> np.ndarray:
    """``indices`` (any sequence or array of integers) as int64 in ``0..count-1``, vectorised;
    the first bad one raises as :func:`check_index` would."""
    if isinstance(indices, (str, bytes)):
        raise _type_error(indices)
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iub" and idx.size:
        # Floats, strings, objects, or Python ints past int64 (numpy made them floats or
        # objects): checked one by one, as given.
        items = idx.reshape(-1).tolist() if hasattr(indices, "__array__") else list(indices)
        return np.array([check_index(i, count) for i in items], dtype=np.int64)
    idx = idx.reshape(-1)
    if not idx.size:
        return idx.astype(np.int64)
    low, high = idx.min(), idx.max()
    if low < -count or high >= count:
        bad = next(i for i in idx.tolist() if not -count <= i < count)
        raise _range_error(bad, count)
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + count, idx) if low < 0 else idx


def locate_many(starts: np.ndarray, indices: Any) -> tuple[np.ndarray, np.ndarray]:
    """Global indices -> (shard numbers, indices within those shards), int64 arrays, given each
    shard's start ``[0, s1, ..., N]``; negative indices count from the end, as in a list."""
    count = int(starts[-1])
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    if len(idx) and (idx.min() < -count or idx.max() >= count):
        bad = next(i for i in idx.tolist() if not -count <= i < count)
        raise IndexError(f"index {bad} out of range for a store of {count} records")
    if len(idx) and idx.min() < 0:
        idx = np.where(idx < 0, idx + count, idx)
    shards = np.searchsorted(starts, idx, side="right") - 1
    return shards, idx - starts[shards]
