"""Nothing prints at interpreter exit after reading a store in a short script that never closes
it: not in the main process, not in forked or spawned DataLoader workers (a spawned worker exits
through ``sys.exit``, so it tears its modules down as a script does).

The defect this guards: ``swap.Pin.__del__`` ran after module teardown and printed
"Exception ignored in ... Pin.__del__ ... 'NoneType' object has no attribute 'getpid'".
"""

from __future__ import annotations

import pytest
from helpers import run_program

import shardkit
from shardkit.bench.sample import make_sample


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    """A single-file LMDB store, a single-file HDF5 store and a folder store of four shards."""
    base = tmp_path_factory.mktemp("exit")
    make_sample(str(base / "src"), 24, 3, seed=2, workers=1)
    found = {"lmdb": str(base / "s.lmdb"), "hdf5": str(base / "s.h5"), "folder": str(base / "f")}
    shardkit.pack(str(base / "src"), found["lmdb"], size=32, workers=1, progress=False)
    shardkit.pack(str(base / "src"), found["hdf5"], format="hdf5", size=32, workers=1,
                  progress=False)
    shardkit.pack(str(base / "src"), found["folder"], size=32, workers=1, progress=False,
                  num_shards=4)
    return found


CASES = [("lmdb", "index"), ("lmdb", "threads"), ("lmdb", "fork"), ("lmdb", "spawn"),
         ("lmdb", "forkserver"), ("lmdb", "break-spawn"), ("hdf5", "index"), ("hdf5", "spawn"),
         ("folder", "index"), ("folder", "fork"), ("folder", "spawn")]


@pytest.mark.parametrize("kind, case", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_a_short_script_exits_silently(stores, kind, case):
    done = run_program("quiet_exit", stores[kind], case, capture_output=True, text=True,
                       timeout=240)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
