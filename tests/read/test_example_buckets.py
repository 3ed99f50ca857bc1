"""``examples/train_buckets.py`` trains a few text-to-image-style steps on CPU from a real store
packed with buckets and captions: every step's batch is one bucket, stacked at its size, with
the micro-conditioning fields of its records, and a finite loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers.buckets import COUNTS, SIZES, bucketed_store

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_buckets.py")


def test_bucket_example_trains_on_captions_and_buckets(tmp_path):
    """A whole epoch (15 batches of at most 4): every record once, each batch one bucket, and
    each sample's caption and micro-conditioning are its record's."""
    import shardkit

    store = bucketed_store(str(tmp_path / "src"), str(tmp_path / "c.lmdb"), captions=True)
    ds = shardkit.ShardDataset(store, fields=["caption", "original_size", "crop_top_left",
                                              "target_size"], output="numpy")
    stored = {t["caption"]: {k: np.asarray(v).tolist() for k, v in t.items() if k != "caption"}
              for t in (ds[i][1] for i in range(len(ds)))}
    assert len(stored) == len(ds) == sum(COUNTS)
    batches = sum(-(-c // 4) for c in COUNTS)
    done = subprocess.run([sys.executable, EXAMPLE, store, "--batch-size", "4", "--steps",
                           str(batches)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["step"] for s in steps] == list(range(batches))
    assert {s["epoch"] for s in steps} == {0}
    seen = []
    for s in steps:
        b, c, h, w = s["shape"]
        assert c == 3 and (h, w) in SIZES and 1 <= b <= 4 and len(s["caption"]) == b
        assert s["target_size"] == [[h, w]] * b  # one bucket, its records' target size
        for k, caption in enumerate(s["caption"]):
            own = stored[caption]
            assert [s[name][k] for name in ("original_size", "crop_top_left", "target_size")] \
                == [own["original_size"], own["crop_top_left"], own["target_size"]]
            # the caption says the source's size: "photo i of class c, H by W"
            assert own["original_size"] == [int(v) for v in caption.rsplit(", ", 1)[1].split(
                " by ")]
        seen += s["caption"]
        assert s["loss"] == s["loss"] and 0 < s["loss"] < 100
    assert sorted(seen) == sorted(stored)  # every record once in the epoch
