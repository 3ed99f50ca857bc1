"""Subsets of a ``ShardDataset`` without repacking: by index, by class, by a seeded stratified
fraction, and a seeded train/val split.

A subset is a ``ShardDataset`` (the same decode, crop and batch paths) whose store is a
:class:`shardkit.read.storeview.StoreView`: record ``i`` of the subset is record ``indices[i]`` of
the dataset it was taken from. It is lazy (no shard opens) and picklable (the index travels as
one int64 array), and ``ShardSampler`` deals it shard by shard as it does a whole store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import OptionError
from .storeview import StoreView

if TYPE_CHECKING:
    from .dataset import ShardDataset


def _indices(indices: Any, n: int) -> np.ndarray:
    try:
        arr = np.asarray(indices)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 1 or not (arr.dtype.kind in "iu" or len(arr) == 0):
        raise OptionError("indices must be a sequence of integers (a list, range or 1-d "
                          f"integer array), got {type(indices).__name__}")
    arr = arr.astype(np.int64)
    if len(arr) and (arr.min() < -n or arr.max() >= n):
        bad = next(i for i in arr.tolist() if not -n <= i < n)
        raise OptionError(f"indices: {bad} is out of range for a dataset of {n} records")
    return np.where(arr < 0, arr + n, arr)


def _class_ids(ds: ShardDataset, classes: Sequence[Any]) -> np.ndarray:
    if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence) or not classes:
        raise OptionError("classes must be a non-empty list of class names or labels")
    ids = []
    for c in classes:
        if isinstance(c, str):
            if c not in ds.class_to_idx:
                raise OptionError(f"classes: {c!r} is not a class of this dataset")
            ids.append(ds.class_to_idx[c])
        elif isinstance(c, (int, np.integer)) and not isinstance(c, bool) \
                and 0 <= c < len(ds.classes):
            ids.append(int(c))
        else:
            raise OptionError(f"classes: {c!r} is neither a class name nor a label in "
                              f"0..{len(ds.classes) - 1}")
    if len(set(ids)) != len(ids):
        raise OptionError("classes: a class is named twice")
    return np.array(sorted(ids), dtype=np.int64)


def _stratified(targets: np.ndarray, fraction: float, seed: int, salt: int) -> np.ndarray:
    """Each class's ``round(fraction * n_class)`` records (at least one of a non-empty class),
    drawn by ``seed``; returned in dataset order."""
    rng = np.random.default_rng([seed, salt])
    chosen = []
    for label in np.unique(targets).tolist():
        members = np.flatnonzero(targets == label)
        k = min(len(members), max(1, int(round(fraction * len(members)))))
        chosen.append(members[rng.permutation(len(members))[:k]])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def _fraction(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise OptionError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


def _seed(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise OptionError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def subset(ds: ShardDataset, indices: Sequence[int] | None = None, *,
           classes: Sequence[str | int] | None = None, remap: bool = False,
           fraction: float | None = None, seed: int = 0) -> ShardDataset:
    """Some of ``ds``'s records, as a ``ShardDataset``.

    Args:
        indices: the records, in the subset's order (negative: from the end; repeats allowed).
        classes: keep the records of these classes (names or labels), in dataset order.
        remap: with ``classes``, renumber the labels ``0..k-1`` (in the classes' original
            order; ``classes``/``class_to_idx`` become those ``k``); default: labels kept.
        fraction: keep this share of each class (at least one record of each), drawn by
            ``seed``; with ``classes``, of those classes.
        seed: the draw of ``fraction``.
    """
    if indices is not None and (classes is not None or fraction is not None):
        raise OptionError("give indices, or classes and/or fraction, not both")
    if indices is None and classes is None and fraction is None:
        raise OptionError("give indices, classes or fraction")
    if remap and classes is None:
        raise OptionError("remap needs classes")
    targets = np.asarray(ds.targets)
    label_map, names = None, None
    if indices is not None:
        chosen = _indices(indices, len(ds))
    else:
        chosen = np.arange(len(ds), dtype=np.int64)
        if classes is not None:
            ids = _class_ids(ds, classes)
            chosen = np.flatnonzero(np.isin(targets, ids))
            if remap:
                label_map = np.full(len(ds.classes), -1, dtype=np.int64)
                label_map[ids] = np.arange(len(ids))
                names = [ds.classes[i] for i in ids.tolist()]
        if fraction is not None:
            picked = _stratified(targets[chosen], _fraction(fraction, "fraction"),
                                 _seed(seed, "seed"), 0)
            chosen = chosen[picked]
    return ds.with_store(_view(ds.store, chosen, label_map, names))


def split(ds: ShardDataset, val: float = 0.1, seed: int = 0
          ) -> tuple[ShardDataset, ShardDataset]:
    """``(train, val)``: a seeded, class-stratified split; ``val`` is the validation share of
    each class (at least one record of each), ``train`` the rest. Disjoint; together all of
    ``ds``; each in dataset order."""
    targets = np.asarray(ds.targets)
    held = _stratified(targets, _fraction(val, "val"), _seed(seed, "seed"), 1)
    keep = np.setdiff1d(np.arange(len(ds), dtype=np.int64), held, assume_unique=True)
    return (ds.with_store(_view(ds.store, keep, None, None)),
            ds.with_store(_view(ds.store, held, None, None)))


def _view(store: Any, chosen: np.ndarray, label_map: np.ndarray | None,
          names: list[str] | None) -> StoreView:
    """``store``'s records ``chosen`` (indices in its own order) as a view of the base store,
    composing with a view ``store`` already is."""
    if not isinstance(store, StoreView):
        return StoreView(store, chosen, label_map, names)
    base_index = chosen if store.subset is None else store.subset[chosen]
    if store.label_map is not None:
        if label_map is not None:  # base label -> store's label -> new label
            label_map = np.where(store.label_map >= 0, label_map[store.label_map], -1)
        else:
            label_map, names = store.label_map, store.classes
    return StoreView(store.base, base_index, label_map, names)
