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

# The keyword arguments timm's train.py passes to create_dataset / create_loader, read from its
# source (train.py ships in neither timm's wheel nor its sdist) with train.py's defaults (its
# --train-interpolation random among them) and the documented flags --dataset shardkit
# --interpolation bicubic --crop-pct 0.875 --input-size 3 32 32 (224 in the docs), --device cpu
# and a resnet (data_config: ImageNet mean/std). The calls are the same at every release from
# v1.0.20 (234907eca5d801a369b536e001ec0b45d8ec9d60) to v1.0.28
# (8ef73809f622e0031bd7f4940265734aef8b9978); main at aa4b5850c1543fa488abf260f18390eda46cf85d
# (1.0.29.dev0, 2026-08-08) adds the --train-img-sizes schedule's arguments to the training
# create_loader. img_dtype and device are torch names the program turns into torch objects.
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
TRAIN_PY_DATASET = {
    "train": dict(split="train", is_training=True, class_map="", download=False, batch_size=128,
                  seed=42, repeats=0.0, input_img_mode="RGB", input_key=None, target_key=None,
                  num_samples=None, trust_remote_code=False),
    "eval": dict(split="validation", is_training=False, class_map="", download=False,
                 batch_size=128, input_img_mode="RGB", input_key=None, target_key=None,
                 num_samples=None, trust_remote_code=False),
}
TRAIN_PY_COMMON = dict(mean=MEAN, std=STD, pin_memory=False, img_dtype="float32", device="cpu",
                       distributed=False, use_prefetcher=True)
TRAIN_PY_TRAIN_LOADER = dict(
    input_size=[3, 32, 32], collate_fn=None, use_multi_epochs_loader=False, batch_size=128,
    is_training=True, no_aug=False, re_prob=0.0, re_mode="pixel", re_count=1, re_split=False,
    train_crop_mode=None, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3], hflip=0.5, vflip=0.0,
    color_jitter=0.4, color_jitter_prob=None, grayscale_prob=None, gaussian_blur_prob=None,
    auto_augment=None, num_aug_repeats=0, num_aug_splits=0, interpolation="random",
    num_workers=4, worker_seeding="all", **TRAIN_PY_COMMON)
TRAIN_PY_SCHEDULE = dict(  # main aa4b585 (1.0.29.dev0) on; timm 1.0.31 takes them
    input_size_choices=None, batch_size_choices=None, batch_choice_weights=None,
    batch_choice_seed=42, batch_choice_schedule="constant", batch_schedule_epochs=None,
    batch_schedule_spread=0.65, batch_schedule_random_mix=0.1, num_batches=None)
TRAIN_PY_EVAL_LOADER = dict(input_size=[3, 32, 32], batch_size=128, is_training=False,
                            interpolation="bicubic", num_workers=4, crop_pct=0.875,
                            **TRAIN_PY_COMMON)
TRAIN_PY = {
    "v1.0.20..v1.0.28": dict(dataset=TRAIN_PY_DATASET, train=TRAIN_PY_TRAIN_LOADER,
                             eval=TRAIN_PY_EVAL_LOADER),
    "main aa4b585": dict(dataset=TRAIN_PY_DATASET, eval=TRAIN_PY_EVAL_LOADER,
                         train={**TRAIN_PY_TRAIN_LOADER, **TRAIN_PY_SCHEDULE}),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("timm")
    make_sample(str(base / "src"), IMAGES, CLASSES, seed=3, workers=1)
    shardkit.pack(str(base / "src"), str(base / "train.lmdb"), size=40, workers=1,
                  progress=False)
    # timm's evaluation transform: Resize(32 / 0.875 = 36) + CenterCrop(32).
    shardkit.pack(str(base / "src"), str(base / "val.lmdb"), size=36, workers=1,
                  progress=False)
    (base / "train_py.json").write_text(json.dumps(TRAIN_PY))
    return base


@pytest.fixture(scope="module")
def out(tv_python, root) -> dict:
    """What the timm program found (one run, one timm import, for every test here)."""
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run([tv_python, "-m", "helpers.programs.timm_train", str(root),
                           str(root / "train_py.json")], cwd=TESTS, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_train_py_arguments_of_timm_releases_are_accepted(out, root):
    """Exactly what each train.py passes (its defaults: grayscale_prob=None, ...) is accepted."""
    assert set(out["train_py"]) == set(TRAIN_PY)
    for version, got in out["train_py"].items():
        assert got["stores"] == [str(root / "train.lmdb"), str(root / "val.lmdb")], version
        assert got["train"] == ["PrefetchLoader", 32, "random_resized", 0.5], version
        assert got["eval"] == ["PrefetchLoader", 32, "center", 0.0], version
    # An option those defaults turn off, turned on, is still refused naming its flag.
    assert "--aa" in out["train_py_refused"]["auto_augment"]
    assert "--train-img-sizes" in out["train_py_refused"]["input_size_choices"]


def test_timm_own_create_loader_on_a_shardkit_dataset_warns_once(out):
    """Only create_dataset imported from shardkit.timm: timm's per-sample transform is said."""
    assert len(out["fallback_warnings"]) == 1, out["fallback_warnings"]
    assert "from shardkit.timm import create_dataset, create_loader" in out[
        "fallback_warnings"][0]


def test_timm_trains_evaluates_and_refuses_what_it_cannot_match(out, root):
    assert out["stores"] == [str(root / "train.lmdb"), str(root / "val.lmdb")]  # split names
    assert out["config"] == [[3, 32, 32], "bicubic", 0.875]  # resolve_data_config, as train.py
    assert out["prefetch_type"] == "PrefetchLoader"
    assert out["recipe"] == [32, "random_resized", 0.5]
    assert out["same_pixels"]
    # --train-interpolation bicubic: the bicubic recipe, its pixels, not the bilinear ones
    assert out["bicubic"] == [True, True, False]
    # timm's colour steps (--color-jitter, -prob, --grayscale-prob, --gaussian-blur-prob): the
    # recipe's steps, its pixels, in batches from the prefetcher
    assert out["colour"] == [True, True, False]
    assert out["colour_batches"] == [[8, 3, 32, 32]] * 2
    # --train-interpolation random (train.py's default): bilinear or bicubic per sample, the
    # recipe's pixels, neither the bilinear-only nor the bicubic-only ones
    assert out["random"] == [True, True, False, False]
    assert out["random_batches"] == [[8, 3, 32, 32]] * 2
    for run in ("prefetch_steps", "plain_steps"):
        assert len(out[run]) == 3
        for step in out[run]:
            assert step["dtype"] == "torch.float32" and step["contiguous"]
            assert step["shape"] == [8, 3, 32, 32] and step["target"] == [8, CLASSES]  # mixed
    assert out["eval_count"] == IMAGES and out["eval_recipe"] == [32, "center"]
    refused = out["refused"]
    assert "--color-jitter" in refused["color_jitter"] and "3 or 4 factors" in refused[
        "color_jitter"]
    assert "interpolation='lanczos' (train.py --train-interpolation / --interpolation): pass " \
        "'random' (timm's default), 'bilinear', 'bicubic' or 'nearest'" in refused["interpolation"]
    # a decimal train.py's --crop-pct takes, with floor(32 / crop_pct) = 36 as timm computes
    assert "--crop-pct" in refused["crop_pct"] and refused["crop_pct"].endswith(
        "pass crop_pct 0.88 or pack it with --size 33")
    assert "--vflip" in refused["vflip"]
    # --no-aug trains on Resize(32) + CenterCrop(32): a store packed at 32, whatever crop_pct
    assert refused["no_aug"].endswith("no_aug=True (train.py --no-aug): needs the training "
                                      "images resized to 32, but " + str(root / "train.lmdb")
                                      + " was packed at 40: pack it with --size 32")
    assert refused["no_aug_random"].endswith(
        "interpolation='random' (train.py --train-interpolation / --interpolation): pass "
        "'bicubic' (the filter the store was resized with when packed, anti-aliased bicubic, "
        "which --no-aug's Resize must use; under --no-aug train.py passes --interpolation, else "
        "the model's default)") and "cannot apply 1 " in refused["no_aug_random"]
    assert out["no_aug"] == [40, "center", [[8, 3, 40, 40]]]
    # Several at once: one message names each, with what to pass instead.
    assert refused["several"].startswith("shardkit.timm.create_loader cannot apply 3 ")
    for named in ("auto_augment='rand-m9-mstd0.5' (train.py --aa)",
                  "interpolation='lanczos' (train.py --train-interpolation / --interpolation): "
                  "pass 'random'", "vflip=0.5 (train.py --vflip): pass timm's default 0.0"):
        assert named in refused["several"], refused["several"]
    assert "cannot apply 2 " in refused["several_eval"]
    assert "crop_pct=0.95 (train.py --crop-pct): needs images resized to 33" in refused[
        "several_eval"] and "interpolation='bilinear'" in refused["several_eval"] and \
        "pass 'bicubic'" in refused["several_eval"]
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
