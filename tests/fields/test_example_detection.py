"""``examples/train_detection.py`` trains torchvision detection models from a COCO-packed store
for a few steps on CPU, in the torchvision environment (``.venv-tv``; no weights downloaded)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.coco import make_coco

import shardkit

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "train_detection.py")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("det-example")
    images, annotations = make_coco(str(base), 12, seed=11)
    out = str(base / "coco.lmdb")
    shardkit.pack(images, out, coco=annotations, workers=1, progress=False)
    return out


@pytest.mark.parametrize("model", ["fasterrcnn_mobilenet_v3_large_fpn",
                                   "ssdlite320_mobilenet_v3_large"])
def test_example_trains(tv_python, store, tmp_path, model):
    done = subprocess.run([tv_python, EXAMPLE, store, "--model", model, "--steps", "3",
                           "--batch-size", "2", "--workers", "1", "--crop", "224"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={"HOME": str(tmp_path), "TORCH_HOME": str(tmp_path / "torch"),
                               "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert all(s["loss"] > 0 for s in steps) and sum(s["boxes"] for s in steps) > 0
    assert not (tmp_path / "torch").exists()  # nothing was downloaded
