"""Progress bars leave no thread behind (:mod:`shardkit.progress`): a script that packs, verifies
and exports with bars on, as a user's does, still runs only its main thread afterwards, so its
next pack forks its encoding workers (a process with another Python thread alive spawns them,
each importing torch again). tqdm's own monitor thread outlives its bars."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import image_tree

PROGRAM = r"""
import json, sys, threading
import shardkit
from shardkit.packing.workers import start_method
src, out = sys.argv[1:3]
shardkit.pack(src, out + "/a", num_shards=2, size=16, workers=2, progress=True)
shardkit.verify(out + "/a", progress=True)
from shardkit.export import export
export(out + "/a", out + "/tars/part-%03d.tar", progress=True)
print(json.dumps({"threads": sorted(t.name for t in threading.enumerate()),
                  "method": start_method()}))
"""


def test_bars_leave_no_thread_and_the_next_pack_forks(tmp_path):
    src = str(tmp_path / "src")
    image_tree(src, classes=2, per_class=3, seed=3)
    done = subprocess.run([sys.executable, "-c", PROGRAM, src, str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verify" in done.stderr and "pack" in done.stderr  # the bars were shown
    assert json.loads(done.stdout.splitlines()[-1]) == {"threads": ["MainThread"],
                                                         "method": "fork"}
