"""timm: ``train.py --data-dir STORES --dataset shardkit`` trains from shardkit stores.

The patch to timm's ``train.py`` (it is not part of the timm package) is one line, after its
``from timm.data import create_dataset, create_loader, ...``::

    from shardkit.timm import create_dataset, create_loader

Both delegate to timm's own functions for every other dataset. For ``--dataset shardkit``:

- ``create_dataset`` opens the store of the split under ``root``: ``root/<split>`` as a folder
  store or with a store suffix (``.lmdb``, ``.h5``, ...), trying timm's synonyms (``train`` /
  ``training``; ``validation``, ``val``, ``valid``, ``eval``, ``evaluation``).
- ``create_loader`` builds the decode recipe from timm's arguments (``input_size``, ``scale``,
  ``ratio``, ``hflip``, the interpolation, ``crop_pct``, and for training ``color_jitter``,
  ``color_jitter_prob``, ``grayscale_prob``, ``gaussian_blur_prob`` as recipe steps), instead
  of assigning ``dataset.transform`` (which would crop twice), and refuses anything it cannot do at
  decode: one message names every such argument, its ``train.py`` flag and what to pass. Training batches draw from a
  ``ShardSampler`` under ``distributed=True``. With timm's prefetcher (the default) the uint8
  batches go to timm's ``PrefetchLoader``, which normalises and random-erases on the device;
  with ``--no-prefetcher`` the loader yields normalised float batches (contiguous NCHW).
- The defaults ``train.py`` passes that mean "off" (``grayscale_prob=None``, the unused
  ``--train-img-sizes`` schedule's arguments, ...) are accepted; ``tests/integrations/
  test_timm.py`` pins them per timm version.
- timm's own ``create_loader`` over a dataset of :func:`create_dataset` works (timm's per-sample
  transform) and warns once that ``create_loader`` should come from ``shardkit.timm`` too.
- The engine: ``create_loader(..., engine="threads")`` (or, for ``train.py``, the environment
  variable ``SHARDKIT_TIMM_ENGINE=threads``) reads with the thread engine
  (:mod:`shardkit.read.loading.thread_engine`) instead of worker processes; ``--workers``
  (``num_workers``) is then its ``num_threads`` (0: the CPUs this process may use), unless
  ``num_threads`` is given.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import warnings
from typing import Any

import timm.data
from timm.data.loader import PrefetchLoader, _worker_init

from ..errors import OptionError
from ..formats import SUFFIXES
from ..read import recipes
from ..read.dataset import ShardDataset, collate
from ..read.sampler import ShardSampler

NAME = "shardkit"
TRAIN_SPLITS = ("train", "training")
EVAL_SPLITS = ("validation", "val", "valid", "eval", "evaluation")
#: timm's ``--train-interpolation random``: one of these per sample.
RANDOM = ("bilinear", "bicubic")
#: Picks the engine where create_loader's caller cannot pass ``engine=`` (timm's train.py).
ENGINE_VARIABLE = "SHARDKIT_TIMM_ENGINE"

# train.py's flag for each create_loader argument shardkit may refuse.
FLAGS = {"vflip": "--vflip", "color_jitter": "--color-jitter", "auto_augment": "--aa",
         "interpolation": "--train-interpolation / --interpolation", "re_prob": "--reprob",
         "num_aug_repeats": "--aug-repeats", "num_aug_splits": "--aug-splits",
         "train_crop_mode": "--train-crop-mode", "crop_pct": "--crop-pct",
         "crop_mode": "--crop-mode", "use_multi_epochs_loader": "--use-multi-epochs-loader",
         "worker_seeding": "--worker-seeding", "color_jitter_prob": "--color-jitter-prob",
         "grayscale_prob": "--grayscale-prob", "gaussian_blur_prob": "--gaussian-blur-prob",
         "input_size_choices": "--train-img-sizes", "no_aug": "--no-aug"}
# Arguments create_loader uses; every other one of timm's must keep timm's default.
HANDLED = {"is_training", "no_aug", "scale", "ratio", "hflip", "interpolation", "mean", "std",
           "num_workers", "distributed", "crop_pct", "collate_fn", "pin_memory", "fp16",
           "img_dtype", "device", "use_prefetcher", "persistent_workers", "re_prob", "re_mode",
           "re_count", "re_split", "color_jitter", "color_jitter_prob", "grayscale_prob",
           "gaussian_blur_prob", "train_crop_mode", "crop_mode", "worker_seeding"}
# Values that do nothing at decode whatever timm's default is.
NEUTRAL = {"train_crop_mode": (None, "rrc"), "crop_mode": (None, "center")}
# Values that mean "off" to timm besides its default (its transforms test them for truth or
# None): train.py (timm 1.0.20 on) passes None for the SimCLR-style probabilities, whose
# create_loader defaults are 0.0.
OFF = {"auto_augment": (None, ""), "vflip": (0,),
       "num_aug_repeats": (0,), "num_aug_splits": (0,), "crop_border_pixels": (None, 0)}
# timm's per-batch input size schedule (train.py --train-img-sizes, timm 1.0.29 on): its other
# arguments (train.py passes batch_choice_seed=--seed) are unused while it is off.
SCHEDULE = "input_size_choices"
SCHEDULED = {"batch_size_choices", "batch_choice_weights", "batch_choice_seed",
             "batch_choice_schedule", "batch_schedule_epochs", "batch_schedule_spread",
             "batch_schedule_random_mix", "num_batches"}


def is_shardkit(name: str | None) -> bool:
    return isinstance(name, str) and name.lower() == NAME


def find_store(root: str | os.PathLike, split: str) -> str:
    """The store of ``split`` under ``root`` (``root`` itself if it is a store)."""
    root = os.fspath(root)
    if os.path.isfile(root) or os.path.isfile(os.path.join(root, "manifest.json")):
        return root
    group = TRAIN_SPLITS if split in TRAIN_SPLITS else EVAL_SPLITS if split in EVAL_SPLITS \
        else ()
    names = [split, *[g for g in group if g != split]]
    tried = []
    for name in names:
        for suffix in ("", *sorted(set(SUFFIXES.values()))):
            path = os.path.join(root, name + suffix)
            tried.append(os.path.basename(path))
            if os.path.exists(path):
                return path
    raise OptionError(f"no shardkit store for split {split!r} under root={root!r} (looked for "
                      f"{', '.join(tried)})")


def create_dataset(name: str, root: str | None = None, split: str = "validation",
                   **options: Any) -> Any:
    """timm's ``create_dataset``; for ``name="shardkit"``, the split's store as a
    ``ShardDataset`` (its decode recipe is set by :func:`create_loader`)."""
    if not is_shardkit(name):
        return timm.data.create_dataset(name, root=root, split=split, **options)
    if root is None:
        raise OptionError("root (train.py: --data-dir) must name the folder of the stores")
    # What train.py passes (timm 1.0.20 on); anything but "off" would be ignored, so refuse it.
    for key, ok in (("class_map", ("", None)), ("load_bytes", (False,)), ("repeats", (0, 0.0)),
                    ("input_img_mode", ("RGB",)), ("num_samples", (None,)),
                    ("input_key", (None,)), ("target_key", (None,))):
        if key in options and options[key] not in ok:
            raise OptionError(f"create_dataset: {key}={options[key]!r} is not supported for "
                              "shardkit stores (a store holds its classes and RGB images)")
    return TimmShardDataset(find_store(root, split))


WARNED = []  # once per process


class TimmShardDataset(ShardDataset):
    """The ``ShardDataset`` :func:`create_dataset` makes. timm's own ``create_loader`` assigns it
    a per-sample transform (whole image decoded, cropped in PIL): that works, slowly, and is said
    once, since it means ``create_loader`` was not imported from ``shardkit.timm`` too."""

    @ShardDataset.transform.setter
    def transform(self, value: Any) -> None:
        if value is not None and self.crop is None and not WARNED:
            WARNED.append(True)
            warnings.warn(
                "a shardkit store is getting timm's per-sample transform (timm.data.create_loader "
                "was used): each image is decoded whole and cropped per sample, without "
                "shardkit's decode-time recipe. Import create_loader from shardkit.timm too: "
                "from shardkit.timm import create_dataset, create_loader", UserWarning,
                stacklevel=2)
        ShardDataset.transform.fset(self, value)


def _timm_defaults() -> dict[str, Any]:
    signature = inspect.signature(timm.data.create_loader)
    return {n: p.default for n, p in signature.parameters.items()
            if p.default is not inspect.Parameter.empty}


class Refusals(list):
    """What create_loader cannot apply, collected so that one message names every argument
    (with its ``train.py`` flag) and what to pass instead, not one per run."""

    def add(self, name: str, value: Any, fix: str) -> None:
        flag = f" (train.py {FLAGS[name]})" if name in FLAGS else ""
        self.append(f"{name}={value!r}{flag}: {fix}")

    def raise_any(self) -> None:
        if self:
            raise OptionError(f"shardkit.timm.create_loader cannot apply {len(self)} of timm's "
                              "arguments at decode; " + "; ".join(self))


def _square(input_size: Any, refusals: Refusals) -> int:
    size = (input_size,) * 2 if isinstance(input_size, int) else tuple(input_size)[-2:]
    channels = tuple(input_size)[0] if not isinstance(input_size, int) and \
        len(tuple(input_size)) == 3 else 3
    if channels != 3 or len(size) != 2 or size[0] != size[1]:
        refusals.add("input_size", input_size, "shardkit crops squares of 3-channel RGB images: "
                     "pass (3, S, S)")
        return 0
    return int(size[0])


def _check_defaults(options: dict[str, Any], defaults: dict[str, Any],
                    refusals: Refusals) -> None:
    scheduled = options.get(SCHEDULE) is not None
    for name, value in options.items():
        if name not in defaults:
            raise TypeError(f"create_loader() got an unexpected keyword argument {name!r}")
        if name in HANDLED or value in OFF.get(name, ()) or (
                name in SCHEDULED and not scheduled):
            continue
        if value != defaults[name]:
            refusals.add(name, value, f"pass timm's default {defaults[name]!r}")
    for name, neutral in NEUTRAL.items():
        if name in options and options[name] not in neutral:
            choices = " or ".join(repr(v) for v in neutral if v is not None)
            refusals.add(name, options[name], f"pass {choices}")


def photometric_steps(o: dict[str, Any], refusals: Refusals) -> list:
    """timm's training colour steps (``transforms_imagenet_train``: ``ColorJitter`` of
    ``color_jitter`` (a number: brightness, contrast and saturation; or 3-4 factors) in a
    ``RandomApply`` of ``color_jitter_prob`` when set, ``RandomGrayscale(grayscale_prob)``,
    ``GaussianBlur(23)`` in a ``RandomApply`` of ``gaussian_blur_prob``) as recipe steps: the
    same steps in the same order, as torchvision v2 computes them on the decoded uint8 batch."""
    steps: list = []
    jitter = o["color_jitter"]
    factors = (float(jitter),) * 3 if isinstance(jitter, (int, float)) else jitter
    if jitter is not None and (not isinstance(factors, (list, tuple))
                               or len(factors) not in (3, 4)):
        refusals.add("color_jitter", jitter, "pass a number or 3 or 4 factors")
    made = {}
    if isinstance(factors, (list, tuple)) and len(factors) in (3, 4) and any(factors):
        # (timm's all-zero ColorJitter changes no pixel)
        made["color_jitter"] = lambda: recipes.ColorJitter(*factors, p=o["color_jitter_prob"])
    if o["grayscale_prob"]:
        made["grayscale_prob"] = lambda: recipes.RandomGrayscale(o["grayscale_prob"])
    if o["gaussian_blur_prob"]:  # timm's kernel 23, torchvision's sigma (0.1, 2.0)
        made["gaussian_blur_prob"] = lambda: recipes.GaussianBlur(23, (0.1, 2.0),
                                                                  p=o["gaussian_blur_prob"])
    for name, make in made.items():
        try:
            steps.append(make())
        except OptionError as e:
            refusals.add(name, o[name], str(e))
    return steps


def crop_pct_for(size: int, packed: int) -> float | None:
    """The shortest decimal ``crop_pct`` with ``floor(size / crop_pct) == packed``, as timm
    computes its resize: train.py's ``--crop-pct`` takes a decimal, and ``size / packed`` itself
    can miss by a float rounding (``floor(14 / (14 / 25))`` is 24)."""
    for digits in range(1, 10):
        below = math.floor(size / packed * 10 ** digits)
        for numerator in (below, below - 1):
            value = round(numerator / 10 ** digits, digits)
            if value > 0 and math.floor(size / value) == packed:
                return value
    return None


def recipe_dataset(dataset: ShardDataset, size: int, o: dict[str, Any],
                   refusals: Refusals | None = None) -> ShardDataset:
    """``dataset`` cropping at decode as timm's transform for these options would; what it
    cannot match goes to ``refusals`` (raised at once without it)."""
    own = refusals is None
    refusals = Refusals() if own else refusals
    packed = int(dataset.store.settings.get("size") or 0)
    if o["is_training"] and not o["no_aug"]:
        # timm's RandomResizedCropAndInterpolation: 'random' draws one of bilinear and bicubic
        # per sample, after the box
        interpolation = RANDOM if o["interpolation"] == "random" else o["interpolation"]
        if interpolation not in (*recipes.INTERPOLATIONS, RANDOM):  # refused below or by caller
            interpolation = "bilinear"
            refusals.add("interpolation", o["interpolation"], "pass 'random' (timm's default), "
                         "'bilinear', 'bicubic' or 'nearest' (shardkit resizes as torchvision's "
                         "RandomResizedCrop does, anti-aliased)")
        scale = o["scale"] if o["scale"] is not None else (0.08, 1.0)
        ratio = o["ratio"] if o["ratio"] is not None else (3.0 / 4.0, 4.0 / 3.0)
        steps = photometric_steps(o, refusals)
        if own:
            refusals.raise_any()
        return dataset.with_recipe(size, "random_resized", scale=tuple(scale),
                                   ratio=tuple(ratio), flip=float(o["hflip"]),
                                   interpolation=interpolation, then=steps)
    # Evaluation (and no_aug training): Resize(size / crop_pct) + CenterCrop(size); the resize
    # is the one the store was packed with (bicubic, anti-aliased).
    crop_pct = 1.0 if o["is_training"] else (o["crop_pct"] or 0.875)
    resize = math.floor(size / crop_pct)
    if size and packed != resize and o["is_training"]:  # timm: Resize(size) + CenterCrop(size)
        refusals.add("no_aug", o["no_aug"], f"needs the training images resized to {size}, but "
                     f"{dataset.root} was packed at {packed or 'full size'}: pack it with "
                     f"--size {size}")
    elif size and packed != resize:
        matching = crop_pct_for(size, packed) if packed else None
        refusals.add("crop_pct", o["crop_pct"], f"needs images resized to {resize} (input size "
                     f"{size} / crop_pct {crop_pct}), but {dataset.root} was packed at "
                     f"{packed or 'full size'}: "
                     + (f"pass crop_pct {matching} or " if matching else "")
                     + f"pack it with --size {resize}")
    # timm's Resize: the evaluation interpolation, or under no_aug the training one ('random'
    # is bilinear there); the store's is the packer's
    resized_with = "bilinear" if o["interpolation"] == "random" and o["is_training"] \
        else o["interpolation"]
    if resized_with != "bicubic":
        refusals.add("interpolation", o["interpolation"], "pass 'bicubic' (the filter the store "
                     "was resized with when packed, anti-aliased bicubic"
                     + (", which --no-aug's Resize must use; under --no-aug train.py passes "
                        "--interpolation, else the model's default)" if o["is_training"] else ")"))
    if own:
        refusals.raise_any()
    return dataset.with_recipe(size, "center")


def create_loader(dataset: Any, input_size: Any, batch_size: int, **options: Any) -> Any:
    """timm's ``create_loader``; for a ``ShardDataset``, a loader that decodes with timm's recipe
    (wrapped in timm's ``PrefetchLoader`` when ``use_prefetcher``)."""
    if not isinstance(dataset, ShardDataset):
        return timm.data.create_loader(dataset, input_size, batch_size, **options)
    if dataset.transform is not None or dataset.crop is not None:
        raise OptionError("shardkit.timm.create_loader sets the decode recipe from timm's "
                          "arguments: pass a ShardDataset without crop or transform "
                          "(as shardkit.timm.create_dataset makes)")
    engine = options.pop("engine", None) or os.environ.get(ENGINE_VARIABLE) or "processes"
    num_threads, prefetch_depth = options.pop("num_threads", None), options.pop("prefetch", None)
    defaults = _timm_defaults()
    refusals = Refusals()  # every argument that cannot apply, named in one message
    _check_defaults(options, defaults, refusals)
    o = {**defaults, **options}
    prefetch = bool(o["use_prefetcher"])
    if o["re_prob"] and not prefetch:
        refusals.add("re_prob", o["re_prob"], "needs timm's prefetcher (random erasing runs on "
                     "the device there): drop --no-prefetcher or pass --reprob 0")
    size = _square(input_size, refusals)
    ds = recipe_dataset(dataset, size, o, refusals) if size else dataset
    refusals.raise_any()
    training = bool(o["is_training"])
    loader_args: dict[str, Any] = dict(
        batch_size=batch_size, num_workers=o["num_workers"], pin_memory=o["pin_memory"],
        collate_fn=o["collate_fn"] or collate, drop_last=training,
        persistent_workers=bool(o["persistent_workers"]) and o["num_workers"] > 0,
        # timm's own worker seeding (numpy too: FastCollateMixup draws with it in the workers),
        # after shardkit's worker_init_fn.
        worker_init_fn=functools.partial(_worker_init, worker_seeding=o["worker_seeding"]))
    if engine == "threads":  # no worker processes: --workers is the number of threads
        loader_args.update(engine="threads", prefetch=prefetch_depth,
                           num_threads=num_threads or (o["num_workers"] or None))
        for key in ("num_workers", "persistent_workers", "worker_init_fn"):
            del loader_args[key]
    elif engine != "processes" or num_threads is not None or prefetch_depth is not None:
        loader_args.update(engine=engine, num_threads=num_threads, prefetch=prefetch_depth)
    if o["distributed"]:
        loader_args["sampler"] = ShardSampler(ds, shuffle=training)
    else:
        loader_args["shuffle"] = training
    if not prefetch:
        loader_args.update(normalize=(o["mean"], o["std"]), dtype=o["img_dtype"])
    loader = ds.loader(**loader_args)
    if not prefetch:
        return loader
    prefetch_args = dict(mean=o["mean"], std=o["std"], channels=3, device=o["device"],
                         fp16=o["fp16"], img_dtype=o["img_dtype"],
                         re_prob=o["re_prob"] if training and not o["no_aug"] else 0.0,
                         re_mode=o["re_mode"], re_count=o["re_count"],
                         re_num_splits=2 if o["re_split"] else 0)
    accepted = inspect.signature(PrefetchLoader).parameters
    return PrefetchLoader(loader, **{k: v for k, v in prefetch_args.items()
                                               if k in accepted})
