"""timm 1.0 (in the torchvision environment, ``.venv-tv``) trains from shardkit stores through
``shardkit.timm``: its ``create_dataset`` split names, ``create_loader`` with the prefetcher and
mixup/cutmix collate, ``--no-prefetcher`` float batches, evaluation, ``ShardSampler`` under DDP;
what the decode path cannot do is refused naming train.py's flag, and timm's own
``create_loader`` on a dataset that crops at decode is refused instead of cropping twice."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import shardkit
from shardkit.bench.sample import make_sample

TESTS = Path(__file__).resolve().parents[1]
IMAGES, CLASSES = 48, 4


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("timm")
    make_sample(str(base / "src"), IMAGES, CLASSES, seed=3, workers=1)
    shardkit.pack(str(base / "src"), str(base / "train.lmdb"), size=40, workers=1,
                  progress=False)
    # timm's evaluation transform: Resize(32 / 0.875 = 36) + CenterCrop(32).
    shardkit.pack(str(base / "src"), str(base / "val.lmdb"), size=36, workers=1,
                  progress=False)
    return base


def test_timm_trains_evaluates_and_refuses_what_it_cannot_match(tv_python, root):
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run([tv_python, "-m", "helpers.programs.timm_train", str(root)], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["stores"] == [str(root / "train.lmdb"), str(root / "val.lmdb")]  # split names
    assert out["config"] == [[3, 32, 32], "bicubic", 0.875]  # resolve_data_config, as train.py
    assert out["prefetch_type"] == "PrefetchLoader"
    assert out["recipe"] == [32, "random_resized", 0.5]
    assert out["same_pixels"]
    for run in ("prefetch_steps", "plain_steps"):
        assert len(out[run]) == 3
        for step in out[run]:
            assert step["dtype"] == "torch.float32" and step["contiguous"]
            assert step["shape"] == [8, 3, 32, 32] and step["target"] == [8, CLASSES]  # mixed
    assert out["eval_count"] == IMAGES and out["eval_recipe"] == [32, "center"]
    refused = out["refused"]
    assert "--color-jitter" in refused["color_jitter"]
    assert "--train-interpolation" in refused["interpolation"] and "'bilinear'" in refused[
        "interpolation"]
    assert "--crop-pct" in refused["crop_pct"] and "--size 33" in refused["crop_pct"]
    assert "--vflip" in refused["vflip"]
    assert "crop twice" in out["double_crop"]
    assert out["ddp_sampler"] == "ShardSampler"
    labels = shardkit.ShardDataset(str(root / "train.lmdb")).targets.tolist()
    assert out["ddp_epoch"] == sorted(labels)  # one epoch, every sample once


def test_assigning_a_transform_to_a_decode_cropping_dataset_is_an_error(photo_store):
    from shardkit.errors import OptionError

    ds = shardkit.ShardDataset(photo_store, crop=32, crop_mode="random_resized")
    with pytest.raises(OptionError, match="crop twice"):
        ds.transform = lambda image: image
    ds.transform = None  # clearing is fine
    composed = shardkit.ShardDataset(photo_store, crop=32, transform=lambda image: image[:, :, :8])
    assert composed[0][0].shape == (3, 32, 8)  # explicit composition: after the decode crop
    plain = shardkit.ShardDataset(photo_store)
    plain.transform = lambda image: image[:, :8, :8]
    assert plain[0][0].shape == (3, 8, 8)
