"""``labels.npy`` and ``layout.npy`` of a sharded store, merged from the plan, not the shards.

A shard holds the labels of its slots minus the sources it skipped, so the store's labels (in
the sources' order) and its layout are the plan's arrays with the skipped sources taken out:
the shards' entries say which (``skipped_slots``, O(skips)), and no shard file is opened. With
``S`` the sorted skipped sources and ``P`` the sorted skipped slots, source ``s`` (not skipped)
is logical record ``s - #(S < s)``, and the slot ``p = places[s]`` it was written at is physical
record ``p - #(P < p)``.

The output files are allocated first; then tasks of :data:`RANGE` sources (or slots) each fill
one contiguous piece of them with ``pwrite`` (a Dask cluster's tasks, or this process's, in
turn: the ``lister`` of :mod:`.discovery`), reading their inputs in chunks of
:data:`.plan_store.CHUNK`: memory O(chunk + skips) in each, nothing per source through the
client.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from ..errors import PackError
from ..fileutil import sha256_file
from . import plan_seal, plan_store
from .plan_store import INDEX_DTYPE, LABEL_DTYPE, LABELS, PLACES, SLOTS, SourceTable

RANGE = 1 << 22  # sources (or slots) per merge task
SKIPPED_SLOTS, SKIPPED_SOURCES = "skipped-slots.bin", "skipped-sources.bin"
LAYOUT_NAME = "layout.npy"


def _npy(path: str, shape: tuple[int, ...]) -> int:
    """Allocate an int64 ``.npy`` file of ``shape`` (as ``np.save`` writes one); its data
    offset."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype="<i8", shape=shape)
    offset = out.offset
    del out
    return offset


def merge_labels(partial: str, plan: Any, entries: list[dict[str, Any]],
                 lister: Callable[..., list[Any]]) -> dict[str, Any] | None:
    """Write ``labels.npy`` (and ``layout.npy`` for a mixed layout) into ``partial`` from
    ``plan``'s arrays and the shards' ``entries``; the manifest's ``layout`` entry (None: the
    sources' order)."""
    table: SourceTable = plan.table
    n, folder = table.count, table.folder
    skipped_slots = np.sort(np.concatenate(
        [np.asarray(e.get("skipped_slots", []), dtype=INDEX_DTYPE) for e in entries]
        or [np.zeros(0, INDEX_DTYPE)]))
    if table.mixed:
        picked = [table.slot(int(p)) for p in skipped_slots.tolist()]
        skipped_sources = np.sort(np.asarray(picked, dtype=INDEX_DTYPE))
    else:
        skipped_sources = skipped_slots
    records = n - len(skipped_sources)
    count = sum(e["count"] for e in entries)
    if count != records:
        raise PackError(f"{partial}: shards hold {count} records, their entries {records}")
    plan_store.write_array(folder, SKIPPED_SLOTS, skipped_slots, INDEX_DTYPE)
    plan_store.write_array(folder, SKIPPED_SOURCES, skipped_sources, INDEX_DTYPE)
    labels_path = os.path.join(partial, "labels.npy")
    layout_path = os.path.join(partial, LAYOUT_NAME)
    labels_at = _npy(labels_path, (records,))
    layout_at = _npy(layout_path, (2, records)) if table.mixed else None
    ranges = [(a, min(n, a + RANGE)) for a in range(0, n, RANGE)]
    tasks = [(by_source, folder, n, table.mixed, a, b, labels_path, labels_at, layout_path,
              layout_at) for a, b in ranges]
    if table.mixed:
        tasks += [(by_slot, folder, n, records, a, b, layout_path, layout_at) for a, b in ranges]
    lister(_run, tasks)
    if not table.mixed:
        return None
    return dict(plan.layout, file=LAYOUT_NAME, sha256=sha256_file(layout_path))


def _run(fn: Callable[..., None], *args: Any) -> None:
    fn(*args)


def _skips(folder: str, name: str) -> np.ndarray:
    size = os.path.getsize(os.path.join(folder, name)) // INDEX_DTYPE.itemsize
    return plan_store.read_array(folder, name, INDEX_DTYPE, size)


def by_source(folder: str, n: int, mixed: bool, a: int, b: int, labels_path: str,
              labels_at: int, layout_path: str, layout_at: int | None) -> None:
    """A merge task: for sources ``a:b``, their labels and (mixed) their physical record."""
    plan_seal.check(folder)  # a task's process reads the plan: once each
    table = SourceTable(folder, n, mixed)
    sources, slots = _skips(folder, SKIPPED_SOURCES), _skips(folder, SKIPPED_SLOTS)
    with open(labels_path, "r+b") as labels_out, \
            open(layout_path, "r+b") if mixed else _Null() as layout_out:
        for c in range(a, b, plan_store.CHUNK):
            d = min(b, c + plan_store.CHUNK)
            s = np.arange(c, d, dtype=INDEX_DTYPE)
            keep = ~np.isin(s, sources[np.searchsorted(sources, c):np.searchsorted(sources, d)])
            first = c - int(np.searchsorted(sources, c))  # logical number of the first kept
            labels = table.read(LABELS, LABEL_DTYPE, c, d)[keep].astype("<i8")
            os.pwrite(labels_out.fileno(), labels.tobytes(), labels_at + 8 * first)
            if mixed:
                places = table.read(PLACES, INDEX_DTYPE, c, d)[keep]
                physical = places - np.searchsorted(slots, places)
                os.pwrite(layout_out.fileno(), physical.astype("<i8").tobytes(),
                          layout_at + 8 * first)
    table.close()


def by_slot(folder: str, n: int, records: int, a: int, b: int, layout_path: str,
            layout_at: int) -> None:
    """A merge task: for slots ``a:b``, the logical record each physical one is."""
    plan_seal.check(folder)
    table = SourceTable(folder, n, True)
    sources, slots = _skips(folder, SKIPPED_SOURCES), _skips(folder, SKIPPED_SLOTS)
    with open(layout_path, "r+b") as out:
        for c in range(a, b, plan_store.CHUNK):
            d = min(b, c + plan_store.CHUNK)
            p = np.arange(c, d, dtype=INDEX_DTYPE)
            keep = ~np.isin(p, slots[np.searchsorted(slots, c):np.searchsorted(slots, d)])
            first = c - int(np.searchsorted(slots, c))
            s = table.read(SLOTS, INDEX_DTYPE, c, d)[keep]
            logical = s - np.searchsorted(sources, s)
            os.pwrite(out.fileno(), logical.astype("<i8").tobytes(),
                      layout_at + 8 * (records + first))
    table.close()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        pass
