"""``examples/train_buckets.py`` trains a few text-to-image-style steps on CPU from a real store
packed with buckets and captions: every step's batch is one bucket, stacked at its size, with
the micro-conditioning fields of its records, and a finite loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.buckets import SIZES, bucketed_store

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_buckets.py")


def test_bucket_example_trains_on_captions_and_buckets(tmp_path):
    store = bucketed_store(str(tmp_path / "src"), str(tmp_path / "c.lmdb"), captions=True)
    done = subprocess.run([sys.executable, EXAMPLE, store, "--batch-size", "4", "--steps", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["step"] for s in steps] == [0, 1, 2]
    for s in steps:
        b, c, h, w = s["shape"]
        assert c == 3 and (h, w) in SIZES and 1 <= b <= 4
        assert s["target_size"] == [[h, w]] * b  # one bucket, its records' target size
        assert all(oh >= h and ow >= w for oh, ow in s["original_size"])  # cut, never upscaled
        assert s["loss"] == s["loss"] and 0 < s["loss"] < 100
