"""A store seen through an index map: the pack's record layout, and subsets without repacking.

``StoreView`` stands where ``ShardDataset`` expects its ``Store``: record ``i`` of the view is the
base store's logical record ``subset[i]`` (all of them without a subset), which lies at physical
place ``layout[0][j]`` of the shards (the identity without a layout; see
:mod:`shardkit.packing.layout`). Only ``locate``/``locate_many``, the labels, the classes and
``groups()`` (what the samplers deal out) differ; everything else is the base store's. It is
picklable: the layout is memory-mapped again in each process, a subset travels as its array.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import StoreError
from ..fields import added
from .addedcols import AddedColumns, WithAdded
from .order import Groups


def open_layout(store: Any) -> Any:
    """``store`` itself, or a view that maps its logical order onto its mixed physical layout
    and a later version's live records and labels (:mod:`shardkit.versions`)."""
    meta = store.meta
    if "layout" not in meta and "records" not in meta and not meta.get("labels_set") and \
            not added.entries(meta):
        return store
    return StoreView(store, None if "records" not in meta else live_records(store))


def live_records(store: Any) -> np.ndarray:
    """A version's live records (logical indices of its shards' records, in its order),
    checked to lie in the store and to name each record at most once."""
    info = store.meta["records"]
    live = np.array(store.side_array(info["file"], info["sha256"]), dtype=np.int64)
    if live.ndim != 1 or (len(live) and (live.min() < 0 or live.max() >= store.count)) or \
            len(np.unique(live)) != len(live):
        raise StoreError(f"{store.path}: live records are out of range or repeated (damaged "
                         "store)")
    return live


class _Relabelled:
    """An open shard with other labels: a class subset with ``remap=True``, or a version
    whose labels were set after its shards were written."""

    def __init__(self, shard: Any, labels: np.ndarray, fields: Any = None) -> None:
        self._shard = shard
        self.labels = labels
        self.fields = shard.fields if fields is None else fields

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shard, name)


class StoreView:
    """``base`` seen through its record layout and an optional subset (see the module docstring).

    Args:
        base: the ``Store``.
        subset: logical indices of ``base`` the view holds, in the view's order (None: all).
        label_map: old label -> new label (a class subset that renumbers); None: labels kept.
        classes: the view's class names (with ``label_map``).
    """

    def __init__(self, base: Any, subset: np.ndarray | None = None,
                 label_map: np.ndarray | None = None, classes: list[str] | None = None) -> None:
        self.base = base
        self.subset = None if subset is None else np.asarray(subset, dtype=np.int64)
        self.label_map = label_map
        self._classes = classes
        self._layout: np.ndarray | None = None  # (2, N) memory map, per process
        self._layout_pid: int | None = None
        self._relabelled: dict[int, _Relabelled] = {}
        self._placed: tuple[int, np.ndarray] | None = None
        #: fields added after packing (their columns are mapped on first use in a process)
        self._added = AddedColumns(base)

    # -- what differs from the base store -------------------------------------------------------

    @property
    def layout(self) -> np.ndarray | None:
        """The base store's ``layout.npy`` (row 0: physical place of each logical record, row 1:
        the inverse), or None when its shards are in logical order."""
        info = self.base.meta.get("layout")
        if info is None:
            return None
        if self._layout is None or self._layout_pid != os.getpid():
            arr = self.base.side_array(info["file"], info["sha256"])
            n = self.base.count
            if arr.dtype != np.int64 or arr.shape != (2, n):
                raise StoreError(f"{self.base.path}: record layout is {arr.dtype}"
                                 f"{list(arr.shape)}, expected int64[2, {n}]")
            self._layout, self._layout_pid = arr, os.getpid()
        return self._layout

    @property
    def count(self) -> int:
        return self.base.count if self.subset is None else len(self.subset)

    def __len__(self) -> int:
        return self.count

    @property
    def classes(self) -> list[str]:
        return self.base.classes if self._classes is None else self._classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        if self._classes is None:
            return self.base.class_to_idx
        return {c: i for i, c in enumerate(self._classes)}

    @property
    def labels(self) -> np.ndarray:
        """Every label of the view, in its order (int64)."""
        labels = self.base.labels
        if self.subset is not None:
            labels = labels[self.subset]
        if self.label_map is not None:
            labels = self.label_map[labels]
        return labels

    def physical(self, indices: Any) -> np.ndarray:
        """View indices (negative: from the end, as in a list) -> physical places in the base."""
        count = self.count
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < -count or idx.max() >= count):
            bad = next(i for i in idx.tolist() if not -count <= i < count)
            raise IndexError(f"index {bad} out of range for a dataset of {count} records")
        if len(idx) and idx.min() < 0:
            idx = np.where(idx < 0, idx + count, idx)
        if self.subset is not None:
            idx = self.subset[idx]
        layout = self.layout
        return idx if layout is None else np.asarray(layout[0][idx])

    def locate_many(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.base.locate_many(self.physical(indices))

    def locate(self, index: int) -> tuple[int, int]:
        shards, local = self.locate_many((index,))
        return int(shards[0]), int(local[0])

    def shard(self, k: int) -> Any:
        shard = self.base.shard(k)
        labels_set = self.base.meta.get("labels_set", False)
        if self.label_map is None and not labels_set and not self._added:
            return shard
        held = self._relabelled.get(k)
        if held is None or held._shard is not shard:  # remapped once per opening of the shard
            labels = np.asarray(shard.labels)
            if labels_set:  # labels.npy, not the ones written in the shard
                start = int(self.base.starts[k])
                labels = self._placed_labels()[start:start + len(labels)]
            held = _Relabelled(shard, labels if self.label_map is None
                               else self.label_map[labels],
                               WithAdded(shard.fields, self._added, int(self.base.starts[k]))
                               if self._added else None)
            # Without the shards the base store has retired: this must not keep them open.
            still = set(self.base.open_shards)
            self._relabelled = {j: r for j, r in self._relabelled.items() if j in still}
            self._relabelled[k] = held
        return held

    def _placed_labels(self) -> np.ndarray:
        """``labels.npy`` in the shards' physical order (a version that set labels)."""
        if self._placed is None or self._placed[0] != os.getpid():
            layout = self.layout
            labels = self.base.labels
            self._placed = (os.getpid(), labels if layout is None else labels[layout[1]])
        return self._placed[1]

    def groups(self) -> Groups:
        """The view's records grouped by the shard that holds them, in physical order."""
        starts = np.asarray(self.base.starts, dtype=np.int64)
        if self.subset is None:
            layout = self.layout
            return Groups(starts, None if layout is None else layout[1])
        places = self.physical(np.arange(self.count))
        by_place = np.argsort(places, kind="stable")
        return Groups(np.searchsorted(places[by_place], starts).astype(np.int64), by_place)

    def close(self) -> None:
        """Release every descriptor and lock this process holds (the layout's map too)."""
        self.base.close()
        self._layout = self._layout_pid = None
        self._relabelled = {}

    # -- everything else is the base store's ----------------------------------------------------

    @property
    def prefetch_next(self) -> bool:
        return self.base.prefetch_next

    @prefetch_next.setter
    def prefetch_next(self, value: bool) -> None:
        self.base.prefetch_next = value

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_layout"] = state["_layout_pid"] = None  # mapped again in the receiving process
        state["_relabelled"] = {}
        state["_placed"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def labels_by_place(store: Any) -> np.ndarray:
    """``labels.npy`` (logical order) put in the shards' physical order, for ``verify``; the
    layout must be a permutation (else ``StoreError``)."""
    labels = store.labels
    if "layout" not in store.meta:
        return labels
    layout = StoreView(store).layout
    n = store.count
    if not np.array_equal(np.sort(layout[0]), np.arange(n)) or \
            not np.array_equal(layout[1][layout[0]], np.arange(n)):
        raise StoreError(f"{store.path}: record layout is not a permutation (damaged store)")
    return labels[layout[1]]
