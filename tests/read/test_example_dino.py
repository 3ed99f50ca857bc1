"""``examples/train_dino.py`` trains a few DINO steps on CPU from views of a real store, in a
subprocess: every step gets the global and local views at their sizes, normalised floats, the teacher the
global ones, the loss every (teacher view, other student view) pair, and a finite value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import shardkit
from shardkit.bench.sample import make_sample

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_dino.py")


def test_dino_example_trains_on_views(tmp_path):
    make_sample(str(tmp_path / "src"), 16, 2, seed=6, workers=1)
    store = str(tmp_path / "s.lmdb")
    shardkit.pack(str(tmp_path / "src"), store, size=48, workers=1, progress=False)
    done = subprocess.run([sys.executable, EXAMPLE, store, "--global-size", "32",
                           "--local-size", "16", "--locals", "2", "--batch-size", "4",
                           "--workers", "1", "--steps", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2]
    for s in steps:
        # 2 global and 2 local float views (normalised in the workers) of every sample, at their
        # sizes; the teacher sees
        # the global ones; the loss pairs each teacher view with every other student view
        assert s["views"] == [[4, 3, 32, 32]] * 2 + [[4, 3, 16, 16]] * 2
        assert s["dtype"] == "torch.float32" and s["teacher_views"] == 2
        assert s["pairs"] == 2 * 4 - 2
        assert s["loss"] == s["loss"] and 0 < s["loss"] < 100  # finite, not NaN
