"""timm (with torchvision) trains a few CPU steps from shardkit stores through ``shardkit.timm``.

    python -m helpers.programs.timm_train ROOT

    python -m helpers.programs.timm_train ROOT TRAIN_PY_JSON

ROOT holds ``train.lmdb`` (packed at 40) and ``val.lmdb`` (packed at 36 = 32 / 0.875).
TRAIN_PY_JSON holds, per timm version, the keyword arguments its train.py passes to
create_dataset / create_loader (the test's data). Prints one JSON object with what each check
found; the test asserts on it.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist
import timm
import timm.data
from timm.data import FastCollateMixup, Mixup
from timm.loss import SoftTargetCrossEntropy

import shardkit
from shardkit.errors import OptionError
from shardkit.timm import create_dataset, create_loader

SIZE, BATCH = 32, 8
MEAN, STD = timm.data.IMAGENET_DEFAULT_MEAN, timm.data.IMAGENET_DEFAULT_STD
# What train.py passes with `--color-jitter 0 --train-interpolation bilinear` (the others: its
# defaults), on CPU: one filter, so that other recipes' pixels can be told from it.
TRAIN = dict(is_training=True, no_aug=False, re_prob=0.25, re_mode="pixel", re_count=1,
             re_split=False, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3], hflip=0.5, vflip=0.0,
             color_jitter=0.0, auto_augment=None, num_aug_repeats=0, num_aug_splits=0,
             interpolation="bilinear", mean=MEAN, std=STD, num_workers=1, distributed=False,
             pin_memory=False, device=torch.device("cpu"), use_multi_epochs_loader=False,
             worker_seeding="all")
EVAL = dict(is_training=False, interpolation="bicubic", mean=MEAN, std=STD, num_workers=1,
            distributed=False, crop_pct=0.875, pin_memory=False, device=torch.device("cpu"))


def steps(model, loader, loss_fn, mixup_fn=None, n=3) -> list[dict]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for i, (images, target) in enumerate(loader):
        if mixup_fn is not None:
            images, target = mixup_fn(images, target)
        loss = loss_fn(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen.append({"dtype": str(images.dtype), "shape": list(images.shape),
                     "contiguous": images.is_contiguous(), "target": list(target.shape),
                     "loss": float(loss)})
        if i + 1 == n:
            break
    return seen


def seeded_batch(ds) -> torch.Tensor:
    """The first ``BATCH`` samples of ``ds`` in one batch, drawn after ``torch.manual_seed(5)``."""
    torch.manual_seed(5)
    return ds.__getitems__(list(range(BATCH))).images.clone()


def recipe_check(made, recipe, *others) -> list[bool]:
    """``made`` (a dataset create_loader built) against ``ShardDataset(recipe=recipe)`` on the
    same store: the same recipe, the same pixels under one seed; then whether its pixels equal
    each of ``others``' (datasets of another recipe: expected False)."""
    own = shardkit.ShardDataset(made.root, recipe=recipe)
    got = seeded_batch(made)
    return [repr(made.recipe) == repr(own.recipe), bool(torch.equal(got, seeded_batch(own)))] \
        + [bool(torch.equal(got, seeded_batch(other))) for other in others]


def refusal(call) -> str:
    try:
        call()
    except OptionError as e:
        return str(e)
    return "accepted"


def torch_args(kwargs: dict) -> dict:
    """The JSON's torch names as train.py's torch objects."""
    out = dict(kwargs)
    if "img_dtype" in out:
        out["img_dtype"] = getattr(torch, out["img_dtype"])
    if "device" in out:
        out["device"] = torch.device(out["device"])
    return out


def train_py(root: str, calls: dict) -> dict:
    """shardkit.timm called with exactly train.py's keyword arguments of each timm version."""
    found = {}
    for version, call in calls.items():
        train = create_dataset("shardkit", root=root, **call["dataset"]["train"])
        val = create_dataset("shardkit", root=root, **call["dataset"]["eval"])
        got = {"stores": [train.root, val.root]}
        for name, ds in (("train", train), ("eval", val)):
            loader = create_loader(ds, **torch_args(call[name]))
            inner = loader.loader.dataset
            got[name] = [type(loader).__name__, inner.crop, inner.crop_mode, inner.flip]
        found[version] = got
    return found


def fallback_warnings(root: str) -> list[str]:
    """timm's own create_loader (twice) over shardkit.timm.create_dataset's dataset."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ds = create_dataset("shardkit", root=root, split="validation")
            timm.data.create_loader(ds, (3, SIZE, SIZE), BATCH, device=torch.device("cpu"))
    return [str(w.message) for w in caught if "shardkit" in str(w.message)]


def main() -> None:
    root = sys.argv[1]
    out: dict = {}
    with open(sys.argv[2]) as f:
        calls = json.load(f)
    out["train_py"] = train_py(root, calls)
    latest = calls[list(calls)[-1]]
    out["train_py_refused"] = {name: refusal(lambda: create_loader(
        create_dataset("shardkit", root=root, **latest["dataset"]["train"]),
        **torch_args({**latest["train"], name: value})))
        for name, value in (("auto_augment", "rand-m9-mstd0.5"), ("input_size_choices", [32, 40]))}
    out["fallback_warnings"] = fallback_warnings(root)
    train = create_dataset("shardkit", root=root, split="train", is_training=True,
                           class_map="", download=False, batch_size=BATCH, seed=42, repeats=0)
    val = create_dataset("shardkit", root=root, split="validation", is_training=False,
                         class_map="", download=False, batch_size=BATCH)
    out["stores"] = [train.root, val.root]
    classes = len(train.classes)
    model = timm.create_model("resnet18", num_classes=classes)
    # train.py's data config: --input-size 3 32 32 --interpolation bicubic --crop-pct 0.875.
    config = timm.data.resolve_data_config(
        {"input_size": (3, SIZE, SIZE), "interpolation": "bicubic", "crop_pct": 0.875,
         "mean": None, "std": None}, model=model)
    out["config"] = [list(config["input_size"]), config["interpolation"], config["crop_pct"]]
    TRAIN.update(mean=config["mean"], std=config["std"])
    EVAL.update(mean=config["mean"], std=config["std"], interpolation=config["interpolation"],
                crop_pct=config["crop_pct"], crop_mode=config.get("crop_mode"))

    # Prefetcher (timm's default) with mixup/cutmix in the collate function.
    mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=classes)
    loader = create_loader(train, (3, SIZE, SIZE), BATCH, use_prefetcher=True,
                           collate_fn=FastCollateMixup(**mix), **TRAIN)
    ds = loader.loader.dataset
    out["prefetch_type"] = type(loader).__name__
    out["recipe"] = [ds.crop, ds.crop_mode, ds.flip]
    out["prefetch_steps"] = steps(model, loader, SoftTargetCrossEntropy())

    # The decode recipe is ShardDataset's own with timm's numbers: same seed, same pixels.
    own = shardkit.ShardDataset(train.root, crop=SIZE, crop_mode="random_resized",
                                scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5)
    out["same_pixels"] = bool(torch.equal(seeded_batch(ds), seeded_batch(own)))
    R = shardkit.recipes
    # train.py's --color-jitter 0.4 (its default) --color-jitter-prob 0.8 --grayscale-prob 0.2
    # --gaussian-blur-prob 0.5: timm's colour steps as recipe steps, the recipe object's pixels.
    loader = create_loader(train, (3, SIZE, SIZE), BATCH, use_prefetcher=True, **{
        **TRAIN, "color_jitter": 0.4, "color_jitter_prob": 0.8, "grayscale_prob": 0.2,
        "gaussian_blur_prob": 0.5})
    out["colour"] = recipe_check(loader.loader.dataset, R.RandomResizedCrop(
        SIZE, (0.08, 1.0), (3 / 4, 4 / 3), flip=0.5, then=[
            R.ColorJitter(0.4, 0.4, 0.4, p=0.8), R.RandomGrayscale(0.2),
            R.GaussianBlur(23, (0.1, 2.0), p=0.5)]), ds)
    out["colour_batches"] = [list(images.shape) for _, (images, _) in zip(range(2), loader)]
    # --train-interpolation bicubic: v2's bicubic RandomResizedCrop, the recipe object's pixels.
    loader = create_loader(train, (3, SIZE, SIZE), BATCH, use_prefetcher=True,
                           **{**TRAIN, "interpolation": "bicubic"})
    bicubic = loader.loader.dataset
    out["bicubic"] = recipe_check(bicubic, R.RandomResizedCrop(
        SIZE, (0.08, 1.0), (3 / 4, 4 / 3), flip=0.5, interpolation="bicubic"), ds)

    # train.py's default --train-interpolation random: bilinear or bicubic per sample, timm's
    # RandomResizedCropAndInterpolation; the recipe object's pixels, neither single filter's.
    loader = create_loader(train, (3, SIZE, SIZE), BATCH, use_prefetcher=True,
                           **{**TRAIN, "interpolation": "random"})
    out["random"] = recipe_check(loader.loader.dataset, R.RandomResizedCrop(
        SIZE, (0.08, 1.0), (3 / 4, 4 / 3), flip=0.5, interpolation=("bilinear", "bicubic")),
        ds, bicubic)
    out["random_batches"] = [list(images.shape) for _, (images, _) in zip(range(2), loader)]

    # --no-prefetcher: normalised float batches the model takes directly, mixup on them.
    loader = create_loader(train, (3, SIZE, SIZE), BATCH, use_prefetcher=False,
                           **{**TRAIN, "re_prob": 0.0})
    out["plain_steps"] = steps(model, loader, SoftTargetCrossEntropy(), Mixup(**mix))

    # Evaluation: Resize(36) + CenterCrop(32) = the store packed at 36, centre crop at decode.
    loader = create_loader(val, config["input_size"], BATCH, use_prefetcher=True, **EVAL)
    model.eval()
    with torch.no_grad():
        out["eval_count"] = sum(len(t) for _, t in loader)
    out["eval_recipe"] = [loader.loader.dataset.crop, loader.loader.dataset.crop_mode]

    # What the decode path cannot do is refused, naming train.py's flag.
    out["refused"] = {
        "color_jitter": refusal(lambda: create_loader(
            train, SIZE, BATCH, **{**TRAIN, "color_jitter": (0.4, 0.4)})),
        "interpolation": refusal(lambda: create_loader(
            train, SIZE, BATCH, **{**TRAIN, "interpolation": "lanczos"})),
        "crop_pct": refusal(lambda: create_loader(val, SIZE, BATCH, **{**EVAL, "crop_pct": 0.95})),
        "vflip": refusal(lambda: create_loader(train, SIZE, BATCH, **{**TRAIN, "vflip": 0.5})),
        "no_aug": refusal(lambda: create_loader(train, SIZE, BATCH, **{
            **TRAIN, "no_aug": True, "interpolation": "bicubic"})),
        # --no-aug's Resize takes the training interpolation ('random': bilinear), the store's
        # is bicubic: refused on a store packed at the input size (40) too
        "no_aug_random": refusal(lambda: create_loader(train, 40, BATCH, **{
            **TRAIN, "no_aug": True, "interpolation": "random"})),
        # several: every one named in one message.
        "several": refusal(lambda: create_loader(train, SIZE, BATCH, **{
            **TRAIN, "color_jitter": 0.4, "interpolation": "lanczos", "vflip": 0.5,
            "auto_augment": "rand-m9-mstd0.5"})),
        "several_eval": refusal(lambda: create_loader(val, SIZE, BATCH, **{
            **EVAL, "crop_pct": 0.95, "interpolation": "bilinear"})),
    }
    # timm's own create_loader on a dataset that crops at decode: refused, not a double crop.
    cropping = shardkit.ShardDataset(train.root, crop=SIZE, crop_mode="random_resized")
    out["double_crop"] = refusal(lambda: timm.data.create_loader(
        cropping, (3, SIZE, SIZE), BATCH, is_training=True, device=torch.device("cpu")))

    # --no-aug --train-interpolation bicubic at the packed size: the centre crop of the store.
    loader = create_loader(train, (3, 40, 40), BATCH, use_prefetcher=True, **{
        **TRAIN, "no_aug": True, "interpolation": "bicubic"})
    out["no_aug"] = [loader.loader.dataset.crop, loader.loader.dataset.crop_mode,
                     [list(images.shape) for _, (images, _) in zip(range(1), loader)]]

    # Under DDP (one gloo rank here) the training loader draws from a ShardSampler.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    loader = create_loader(train, (3, SIZE, SIZE), BATCH, use_prefetcher=True,
                           **{**TRAIN, "distributed": True})
    out["ddp_sampler"] = type(loader.sampler).__name__
    loader.sampler.set_epoch(1)
    out["ddp_epoch"] = sorted(y for _, t in loader for y in t.tolist())
    dist.destroy_process_group()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
