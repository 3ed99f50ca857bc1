"""``labels.npy`` and ``layout.npy`` merged from a plan of more sources than one chunk of the
merge's passes (:data:`shardkit.packing.plan_store.CHUNK`), with skipped sources on both sides
of the chunk boundaries: both rows of the layout and every label against the definition."""

from __future__ import annotations

import os

import numpy as np
import pytest

from shardkit.packing.discovery import serial
from shardkit.packing.merging import merge_labels
from shardkit.packing.plan import make_plan
from shardkit.packing.plan_store import CHUNK
from shardkit.packing.settings import PackSettings
from shardkit.packing.sources import SourceOptions, resolve

from helpers import image_tree

SOURCES = 2 * CHUNK + 3001  # three chunks, the last one partly filled


@pytest.fixture(scope="module")
def listing(tmp_path_factory) -> tuple[str, str]:
    """A file list of SOURCES entries over a few real images (the merge reads the plan, never
    an image), labels in runs of unequal classes."""
    root = tmp_path_factory.mktemp("many")
    src = str(root / "src")
    rels = [rel for rel, _ in image_tree(src, classes=2, per_class=2, seed=1, sides=(8, 8))]
    path = str(root / "list.csv")
    with open(path, "w") as f:
        f.writelines(f"{rels[i % 4]},{(i * 7) // SOURCES}\n" for i in range(SOURCES))
    return src, path


def _skips(bounds: list[int]) -> list[list[int]]:
    """Skipped slots of each shard: around every chunk boundary, the ends, and a spread."""
    picked = {0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, SOURCES - 1,
              *range(5, SOURCES, 997)}
    return [sorted(p for p in picked if a <= p < b) for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("order", ["mixed", "source"])
def test_merge_past_the_first_chunk(listing, tmp_path, order):
    src, file_list = listing
    options = SourceOptions(src, file_list=file_list)
    folder = str(tmp_path / "plan")
    plan = make_plan(resolve(options).scan_into(options, folder), PackSettings(size=8), folder,
                     num_shards=5, order=order)
    assert plan.count == SOURCES and plan.table.mixed == (order == "mixed")
    skips = _skips(plan.bounds)
    entries = [{"count": b - a - len(s), "skipped_slots": s}
               for a, b, s in zip(plan.bounds[:-1], plan.bounds[1:], skips)]
    partial = str(tmp_path / "partial")
    os.makedirs(partial)
    layout = merge_labels(partial, plan, entries, serial)

    # The definition: physical record r is the r-th slot not skipped; its source is the slot's.
    slots = plan.slots if plan.slots is not None else np.arange(SOURCES)
    skipped = np.zeros(SOURCES, bool)
    skipped[[p for s in skips for p in s]] = True
    physical_sources = slots[~skipped]  # the source of each physical record
    logical_sources = np.sort(physical_sources)  # record i: the i-th source packed
    labels = np.array([plan.table.label(s) for s in range(SOURCES)])
    assert np.array_equal(np.load(os.path.join(partial, "labels.npy")), labels[logical_sources])
    if order == "source":
        assert layout is None and not os.path.exists(os.path.join(partial, "layout.npy"))
        return
    place = np.searchsorted(logical_sources, physical_sources)  # logical of each physical
    rows = np.load(os.path.join(partial, "layout.npy"))
    assert rows.shape == (2, len(physical_sources))
    assert np.array_equal(rows[1], place)  # row 1: the logical record at each physical place
    assert np.array_equal(rows[0][place], np.arange(len(place)))  # row 0: its inverse
    assert layout["file"] == "layout.npy" and layout["order"] == "mixed"
