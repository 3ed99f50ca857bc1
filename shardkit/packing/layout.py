"""The physical order of a sharded pack: records laid out so that every shard holds a uniform mix
of classes, while the logical order (``ds[i]``, ``targets``, ``source_path(i)``) stays the
sources' order (ImageFolder's, or the file list's).

``order="mixed"`` (the default for a store of several shards) writes source ``slots[p]`` at
physical place ``p``: within each class the sources are shuffled (seeded), and the classes are
interleaved by stratified keys (the ``j``-th of a class's ``n`` sources gets a key in
``[j/n, (j+1)/n)``), so any run of consecutive records, a shard in particular, holds each class
in proportion to its size. ``order="source"`` keeps the sources' order (identity).

The store records the mapping in ``layout.npy``, an int64 array of shape ``(2, N)``: row 0 is the
physical place of each logical record, row 1 the logical record at each physical place (the
inverse). ``labels.npy`` holds the labels in logical order. Sources skipped while packing leave
no record, so the mapping is built from what each shard really holds (its entry's
``sources`` range and ``skipped_slots``) when the manifest is written.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from ..errors import PackError, PackOptionError
from ..fileutil import replace_atomic, sha256_file
from .settings import ORDERS

LAYOUT_NAME = "layout.npy"
SLOTS_NAME = "slots.npy"  # in the partial folder: the source of each slot, for the manifest
_SALT = 0x6D697865  # keeps this stream apart from other uses of the same seed


def check_order(order: Any, seed: Any) -> None:
    """Refuse a bad ``order``/``layout_seed`` (one line naming the parameter)."""
    if order not in ORDERS:
        raise PackOptionError(f"`order` must be one of {', '.join(map(repr, ORDERS))}, "
                              f"not {order!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise PackOptionError(f"`layout_seed` must be an integer >= 0, not {seed!r}")


def mixed_slots(labels: Sequence[int] | np.ndarray, seed: int) -> np.ndarray:
    """Source index at each physical place: classes shuffled within and interleaved evenly.

    numpy throughout, about 25 bytes a source at the peak: labels already in class order (a
    folder's listing) are taken as runs, without sorting them."""
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        labels = labels.astype(np.int64)
    n = len(labels)
    rng = np.random.default_rng([seed, _SALT])
    keys = np.empty(n, dtype=np.float64)
    if n and bool((labels[1:] >= labels[:-1]).all()):
        by_class = None  # sorted already: a stable argsort would be the identity
        bounds = np.flatnonzero(np.diff(labels)) + 1
    else:
        by_class = np.argsort(labels, kind="stable")
        bounds = np.flatnonzero(np.diff(labels[by_class])) + 1
    starts = [0, *bounds.tolist()] if n else []
    for a, b in zip(starts, [*starts[1:], n]):
        m = b - a
        values = (np.arange(m) + rng.random(m)) / m  # drawn before the permutation
        perm = rng.permutation(m)
        keys[perm + a if by_class is None else by_class[a:b][perm]] = values
    del by_class
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)


def save_slots(partial: str, slots: np.ndarray | None) -> None:
    """Keep the plan's slots in the partial folder (``merge`` has no plan); None: identity."""
    path = os.path.join(partial, SLOTS_NAME)
    if slots is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    import io

    buf = io.BytesIO()
    np.save(buf, np.asarray(slots, dtype="<i8"), allow_pickle=False)
    replace_atomic(path, buf.getvalue())


def load_slots(partial: str) -> np.ndarray | None:
    path = os.path.join(partial, SLOTS_NAME)
    if not os.path.exists(path):
        return None
    return np.load(path, allow_pickle=False)


def record_sources(entries: list[dict[str, Any]], slots: np.ndarray) -> np.ndarray:
    """Source index of every record, shard by shard in physical order."""
    parts = []
    for entry in entries:
        first, end = entry["sources"]
        keep = np.ones(end - first, dtype=bool)
        keep[np.asarray(entry.get("skipped_slots", []), dtype=np.int64) - first] = False
        parts.append(slots[first:end][keep])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def write_layout(partial: str, entries: list[dict[str, Any]], slots: np.ndarray | None,
                 labels: np.ndarray, layout: dict[str, Any] | None
                 ) -> tuple[np.ndarray, dict[str, Any] | None]:
    """The labels in logical order and the manifest's ``layout`` entry (None: identity), with
    ``layout.npy`` written into ``partial``."""
    if slots is None or layout is None:
        return labels, None
    sources = record_sources(entries, slots)
    if len(sources) != len(labels):
        raise PackError(f"{partial}: shards hold {len(labels)} records, their entries "
                         f"{len(sources)}")
    physical = np.argsort(sources, kind="stable").astype("<i8")  # logical i -> physical place
    logical = np.empty_like(physical)
    logical[physical] = np.arange(len(physical), dtype="<i8")
    path = os.path.join(partial, LAYOUT_NAME)
    np.save(path, np.stack([physical, logical]), allow_pickle=False)
    return labels[physical], dict(layout, file=LAYOUT_NAME, sha256=sha256_file(path))
