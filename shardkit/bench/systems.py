"""What ``shardkit bench`` measures: the system names, the stores they read, and the image-folder
baselines (ImageFolder + PIL, and the training recipe the way pytorch/examples runs it)."""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from ..codec import ENCODINGS
from ..formats import FORMATS, SUFFIXES


BATCH = 64
SIZE = 256
CROP = 224
STORE_SYSTEMS = tuple(f"{f}-{e}" for e in ENCODINGS for f in FORMATS)
RECIPE_STORE = "lmdb-jpeg"
RECIPE_SYSTEMS = ("recipe-imagefolder", "recipe-transform", "recipe-decode", "random-crop",
                  "random-crop/default-collate")
DEFAULT_SYSTEMS = ("imagefolder", *STORE_SYSTEMS, f"{RECIPE_STORE}/threads", *RECIPE_SYSTEMS)
# Random crops are compared within these groups, at one setting: under one seed, the same samples
# go to the same workers and draw the same boxes and flips.
PIXEL_GROUPS = {"recipe-transform": "recipe", "recipe-decode": "recipe",
                "recipe-imagefolder": "recipe-imagefolder", "random-crop": "random-crop",
                "random-crop/default-collate": "random-crop"}


def store_of(system: str) -> str | None:
    """The store a system reads (``lmdb-jpeg``, ...), None for the image-folder systems."""
    if system in ("imagefolder", "recipe-imagefolder"):
        return None
    return RECIPE_STORE if system in RECIPE_SYSTEMS else system.split("/")[0]


def store_path(work: str, system: str) -> str:
    fmt, enc = store_of(system).split("-")
    return os.path.join(work, f"{fmt}-{enc}" + SUFFIXES[fmt])


def encoding_of(system: str) -> str | None:
    """The encoding of the store a system reads (None: an image folder)."""
    store = store_of(system)
    return None if store is None else store.split("-")[1]


# -- the baseline: what users run today -----------------------------------------------------------

def _pil_center_crop(img: Any, crop: int) -> Any:
    """torchvision's ``CenterCrop`` on a PIL image: zero padding first when it is smaller."""
    w, h = img.size
    if w < crop or h < crop:
        from PIL import Image

        canvas = Image.new("RGB", (max(w, crop), max(h, crop)))  # zeros, as torchvision pads
        canvas.paste(img, ((crop - w) // 2 if w < crop else 0, (crop - h) // 2 if h < crop else 0))
        img, (w, h) = canvas, canvas.size
    top, left = int(round((h - crop) / 2.0)), int(round((w - crop) / 2.0))
    return img.crop((left, top, left + crop, top + crop))


class PilImageFolder:
    """torchvision's ``ImageFolder`` + ``Resize(size)``, ``CenterCrop(crop)``, ``PILToTensor()``,
    written with PIL and numpy for machines without torchvision (same pixels, same order);
    ``transform`` replaces the resize and crop (it gets the RGB PIL image)."""

    def __init__(self, root: str, size: int = SIZE, crop: int = CROP,
                 transform: Callable | None = None) -> None:
        from ..packing.discovery import discover

        found = discover(root)
        self.samples = found.samples
        self.classes, self.class_to_idx = found.classes, found.class_to_idx
        self.size, self.crop, self.transform = size, crop, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        path, target = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        if self.transform is not None:
            return self.transform(img), target
        w, h = img.size
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = self.size, int(self.size * long / short)
        new = (new_short, new_long) if w <= h else (new_long, new_short)
        if new != (w, h):
            img = img.resize(new, Image.Resampling.BILINEAR)
        img = _pil_center_crop(img, self.crop)
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1), target


def baseline_dataset(root: str, size: int = SIZE, crop: int = CROP) -> tuple[Any, str]:
    """The ImageFolder baseline: torchvision's classes when importable, else :class:`PilImageFolder`."""
    try:
        from torchvision import datasets, transforms
    except Exception:  # noqa: BLE001 - not installed (or broken next to this torch)
        return PilImageFolder(root, size, crop), "PIL+numpy ImageFolder (torchvision not installed)"
    transform = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(crop),
                                    transforms.PILToTensor()])
    return datasets.ImageFolder(root, transform=transform), "torchvision ImageFolder"


# -- the training recipe: RandomResizedCrop(224) + RandomHorizontalFlip() -----------------------

def torchvision_version() -> str | None:
    """torchvision's version when it imports (with its v2 transforms), else None."""
    try:
        import torchvision
        from torchvision.transforms import v2  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed (or broken next to this torch)
        return None
    return torchvision.__version__


class PilRecipe:
    """``RandomResizedCrop(crop)``, ``RandomHorizontalFlip()``, ``PILToTensor()`` on a PIL image as
    torchvision's v1 transforms do it (pytorch/examples' recipe), for machines without
    torchvision: box and flip from :class:`shardkit.read.augment.Recipe` (torchvision's RNG calls),
    then torchvision's PIL path: crop, Pillow bilinear resize, transpose."""

    def __init__(self, crop: int = CROP) -> None:
        from ..read.augment import Recipe

        self.crop = crop
        self.recipe = Recipe(crop, "random_resized", flip=0.5, dct_scale=False)

    def __call__(self, img: Any) -> Any:
        import torch
        from PIL import Image

        top, left, h, w, flip = self.recipe.draw(img.height, img.width)[:5]
        img = img.crop((left, top, left + w, top + h))
        img = img.resize((self.crop, self.crop), Image.Resampling.BILINEAR)
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)


class TensorRecipe:
    """``v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip()])`` on
    a uint8 CxHxW tensor, for machines without torchvision: shardkit.read.augment's box, flip and
    resize, the pixels of torchvision v2 (tests/test_torchvision_parity.py,
    tests/bench/test_bench.py)."""

    def __init__(self, crop: int = CROP) -> None:
        from ..read.augment import Recipe

        self.crop = crop
        self.recipe = Recipe(crop, "random_resized", flip=0.5, dct_scale=False)

    def __call__(self, img: Any) -> Any:
        import torch

        from ..read import augment

        top, left, h, w, flip = self.recipe.draw(img.shape[1], img.shape[2])[:5]
        box = img.permute(1, 2, 0).numpy()[top:top + h, left:left + w]
        out = np.empty((self.crop, self.crop, 3), np.uint8)
        if box.shape[:2] == out.shape[:2]:  # torchvision returns such a crop as it is
            np.copyto(out, box)
        else:
            augment.resize_into(out, box)
        if flip:
            augment.mirror(out)
        return torch.from_numpy(out).permute(2, 0, 1)


def recipe_baseline(root: str, torchvision: bool) -> tuple[Any, str]:
    """ImageFolder with the recipe as pytorch/examples runs it (v1 transforms on PIL images)."""
    if not torchvision:
        return (PilImageFolder(root, transform=PilRecipe()),
                "PIL ImageFolder + shardkit's RandomResizedCrop(224)+RandomHorizontalFlip() "
                "on PIL images, Pillow bilinear (torchvision v1's pixels; torchvision not "
                "installed)")
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.RandomResizedCrop(CROP),
                                    transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    return (datasets.ImageFolder(root, transform=transform),
            f"torchvision {torchvision_version()} ImageFolder + RandomResizedCrop(224), "
            "RandomHorizontalFlip(), PILToTensor() (v1 on PIL images)")


def recipe_transform(torchvision: bool) -> tuple[Callable, str]:
    """The recipe as a per-sample transform on ShardDataset's uint8 tensors."""
    if not torchvision:
        return (TensorRecipe(), "shardkit.read.augment's RandomResizedCrop(224)+"
                "RandomHorizontalFlip() on uint8 tensors (torchvision v2's pixels; torchvision "
                "not installed)")
    from torchvision.transforms import v2

    return (v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()]),
            f"torchvision {torchvision_version()} v2.Compose([RandomResizedCrop(224, "
            "antialias=True), RandomHorizontalFlip()])")
