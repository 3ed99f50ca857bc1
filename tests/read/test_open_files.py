"""File descriptors, maps and locks that a reader holds: few, bounded, and released.

* A 200-shard store (HDF5 and LMDB) is read in full -- one by one, as one batch, and through
  forked DataLoader workers -- in a process limited to 256 open files (``ulimit -n 256``). Each
  open shard costs one descriptor, at most ``max_open_shards`` shards are open per process (the
  least recently used is closed; by default a quarter of the limit), and samples read before
  their shard was closed stay intact.
* A dataset holds nothing (descriptor, map or lock) until it is used, and ``close()`` releases
  everything it held.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch
from helpers import run_program
from helpers.digests import digest
from PIL import Image

import shardkit
from shardkit import ShardDataset

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")

SHARDS = 200
NOFILE = 256

@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> dict[str, str]:
    """200 tiny images packed into 200 shards: HDF5 (JPEG records) and LMDB (raw records)."""
    base = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(7)
    for i in range(SHARDS):
        folder = base / "src" / f"c{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(
            folder / f"{i:03d}.png")
    stores = {}
    for fmt, encoding in (("hdf5", "jpeg"), ("lmdb", "raw")):
        stores[fmt] = str(base / f"store-{fmt}")
        shardkit.pack(str(base / "src"), stores[fmt], format=fmt, encoding=encoding, size=0,
                      workers=2, num_shards=SHARDS, progress=False)
    return stores


def _reference(path: str) -> list[list]:
    ds = ShardDataset(path, output="numpy")
    try:
        return [[digest(img), int(label)]
                for img, label in (ds[i] for i in range(len(ds)))]
    finally:
        ds.close()


@pytest.mark.parametrize("limit", ["default", "5"])
@pytest.mark.parametrize("fmt", ["hdf5", "lmdb"])
def test_200_shards_read_under_ulimit_256(many_shards, fmt, limit):
    path = many_shards[fmt]
    assert len(ShardDataset(path).store.shards) == SHARDS
    expected = _reference(path)
    res = run_program("nofile_reader", path, limit, str(NOFILE), capture_output=True, text=True,
                      timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    bound = NOFILE // 4 if limit == "default" else int(limit)  # the documented default
    assert got["after_create"] == 0
    # One descriptor per open shard, plus the store's pin and the maps of labels.npy and of
    # layout.npy (the default, mixed record layout).
    assert got["open_shards"] == bound
    assert bound <= got["peak"] <= bound + 3, got["peak"]
    assert got["after_close"] == 0 and got["store_fds_after_close"] == 0
    assert got["reread"]
    assert got["single"] == expected
    assert got["batch"] == expected
    assert got["targets"] == [label for _, label in expected]
    workers = sorted(got["workers"])
    assert [[d, label] for _, d, label, _ in workers] == expected
    assert [i for i, _, _, _ in workers] == list(range(SHARDS))
    # Workers close what they inherited from the parent and keep their own within the bound.
    assert max(n for _, _, _, n in workers) <= bound + 2


# -- nothing held before use, everything released by close() ------------------------------------

def _held(path: str) -> dict[str, int]:
    """Descriptors and memory maps of files in the store, and flocks on its manifest, that this
    process holds."""
    inside = os.path.realpath(path)
    prefix = inside + os.sep if os.path.isdir(path) else inside
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        fds += target == inside or target.startswith(prefix)
    with open("/proc/self/maps") as f:
        maps = sum(1 for line in f if line.rstrip("\n").split(maxsplit=5)[-1].startswith(inside))
    locks = 0
    manifest = os.path.join(path, "manifest.json")
    if os.path.exists(manifest):
        ino = os.stat(manifest).st_ino
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if fields[1] == "FLOCK" and fields[4] == str(os.getpid()) \
                        and fields[5].rsplit(":", 1)[-1] == str(ino):
                    locks += 1
    return {"fds": fds, "maps": maps, "locks": locks}


NOTHING = {"fds": 0, "maps": 0, "locks": 0}


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
@pytest.mark.parametrize("shards", [None, 3], ids=["file", "folder"])
def test_nothing_held_until_used_and_close_releases_everything(tmp_path, fmt, shards):
    src = tmp_path / "src"
    rng = np.random.default_rng(3)
    for i in range(12):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)).save(
            src / f"c{i % 2}" / f"{i}.png")
    out = str(tmp_path / ("store.h5" if fmt == "hdf5" and not shards else "store"))
    shardkit.pack(str(src), out, format=fmt, size=0, workers=1, num_shards=shards,
                  progress=False)

    ds = ShardDataset(out, crop=8)
    assert len(ds) == 12 and ds.classes == ["c0", "c1"]
    assert _held(out) == NOTHING
    first = [ds[i][0] for i in range(12)]
    assert len(ds.targets) == 12
    held = _held(out)
    assert held["fds"] >= 1 and held["maps"] >= 1
    assert held["locks"] == (1 if shards else 0)
    ds.close()
    assert _held(out) == NOTHING
    # Usable again after close (reopened lazily), and released again.
    assert all(torch.equal(a, ds[i][0]) for i, a in enumerate(first))
    ds.close()
    assert _held(out) == NOTHING
