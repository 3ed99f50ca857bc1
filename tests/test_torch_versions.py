"""shardkit beside the current torch and torchvision releases (``.venv-tv``), against this torch.

``scripts/torchvision_venv.sh`` builds ``.venv-tv``: torch 2.14.1 and torchvision 0.29.1 first,
then ``pip install -e '.[test,pillow]'``, which must keep that torch (shardkit requires only
``torch>=2.1``). ``SHARDKIT_TV_PYTHON`` names another interpreter. Without the environment the
tests skip, except under CI (env ``CI`` set), which builds it: there they fail.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_program
from helpers.digests import digest, loader_digests, record_digests
from PIL import Image

import shardkit
from shardkit import ShardDataset
from shardkit.bench.sample import make_sample

ROOT = Path(__file__).resolve().parents[1]
TV_TORCH, TV_TORCHVISION = "2.14.1", "0.29.1"  # what scripts/torchvision_venv.sh installs
CROP, BATCH = 160, 4


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """Photo-like JPEGs of 300-800 px (resized at pack time) in 3 classes, and an RGBA PNG."""
    root = tmp_path_factory.mktemp("tv") / "src"
    make_sample(str(root), 11, 3, seed=5, workers=1)
    rng = np.random.default_rng(2)
    Image.fromarray(rng.integers(0, 256, (300, 420, 4), dtype=np.uint8), "RGBA").save(
        root / "class_001" / "alpha.png")
    return root


def test_shardkit_in_the_torchvision_env_matches_this_torch(tv_python, src, tmp_path):
    """Same records, batches and labels under torch 2.14 (+torchvision) as under this torch;
    torchvision's v2 transforms take ShardDataset's tensors."""
    proc = run_program("tv_probe", str(src), str(tmp_path / "tv.lmdb"), str(CROP), str(BATCH),
                       python=tv_python, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tv = json.loads(proc.stdout.strip().splitlines()[-1])
    # The install kept the environment's torch, and torchvision imports against it.
    assert tv["torch"].split("+")[0] == TV_TORCH
    assert tv["torchvision"].split("+")[0] == TV_TORCHVISION
    assert torch.__version__.split("+")[0] != TV_TORCH  # two different torch releases compared
    assert tv["shardkit_requires"] == ["torch>=2.1"]

    here = str(tmp_path / "here.lmdb")
    result = shardkit.pack(str(src), here, workers=2, progress=False)
    assert tv["count"] == result.count == 12
    assert tv["records"] == record_digests(here)  # byte for byte: decode, resize, encode agree
    batches, labels = loader_digests(here, CROP, BATCH)
    assert tv["batches"] == batches and tv["labels"] == labels
    assert labels == [int(t) for t in ShardDataset(here).targets]
    assert sorted(set(labels)) == [0, 1, 2]
    # ImageFolder (torchvision's own) gives the same samples and labels as the store.
    assert tv["imagefolder"] == tv["sources"]

    # v2.CenterCrop + horizontal flip on the dataset's uint8 CxHxW tensors, done by hand here.
    ds = ShardDataset(here)
    flipped, floats = [], []
    for i in range(len(ds)):
        img, label = ds[i]
        h, w = img.shape[1:]
        top, left = int(round((h - CROP) / 2.0)), int(round((w - CROP) / 2.0))
        flipped.append(digest(img[:, top:top + CROP, left:left + CROP].flip(-1).numpy()))
        assert tv["flipped_labels"][i] == label
        # v2.ToDtype(float32, scale=True) multiplies by 1/255 (not a division: other last bits)
        floats.append(["torch.float32", digest(img.float().mul_(1.0 / 255).numpy())])
    assert tv["flipped"] == flipped
    assert tv["floats"] == floats


def test_installing_shardkit_keeps_the_environments_torch(tv_python, tmp_path):
    """What pip would do if shardkit were installed into the environment again, from this
    checkout's pyproject.toml: nothing to torch or torchvision (a cap below 2.14 would
    downgrade torch to 2.13 and break torchvision)."""
    report = tmp_path / "report.json"
    proc = subprocess.run([tv_python, "-m", "pip", "install", "--dry-run", "--no-index",
                           "--no-build-isolation", "--quiet", "--report", str(report),
                           "-e", f"{ROOT}[test,pillow]"],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = sorted(item["metadata"]["name"].lower()
                   for item in json.loads(report.read_text())["install"])
    assert names == ["shardkit"]
