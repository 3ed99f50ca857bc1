"""Recipes as objects (``shardkit.recipes``): the photometric steps draw from each sample's own
seed, so a loader's batches (float ones too) are the same with 0 or 2 workers, on the thread
engine and after a mid-epoch resume; the options stay as shortcuts that build a recipe; a recipe
next to an option that also says how to crop is refused in one line naming both. Pixels equal to
torchvision v2's are checked in ``test_recipes_tv.py``."""

from __future__ import annotations

import enum
import re

import pytest
import torch
from helpers import image_tree

import shardkit
from shardkit import recipes as R
from shardkit.errors import OptionError
from shardkit.read import batchpool

RECIPE = R.Views([R.RandomResizedCrop(24, (0.2, 1.0), flip=0.5, interpolation="bicubic", then=[
    R.ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8), R.RandomGrayscale(0.2),
    R.GaussianBlur(5, p=0.5), R.RandomSolarize(128, p=0.2), R.Normalize()]),
    R.RandomResizedCrop(16, then=[R.ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8)])])


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """18 small photo-like JPEGs of varied sides in 3 classes, packed at 48 into 2 LMDB shards."""
    base = tmp_path_factory.mktemp("recipes")
    image_tree(str(base / "src"), classes=3, per_class=6, seed=31, sides=(40, 90))
    out = str(base / "s.lmdb")
    shardkit.pack(str(base / "src"), out, size=48, num_shards=2, workers=1, progress=False)
    return out


def stream(make, seed: int = 5) -> list[list[torch.Tensor]]:
    """Each batch's views (cloned) of the loader ``make()`` makes after
    ``torch.manual_seed(seed)`` (its shuffle and its draws follow that seed)."""
    torch.manual_seed(seed)
    return [[v.clone() for v in images] for images, _ in make()]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(u.dtype == v.dtype and torch.equal(u, v) for u, v in zip(x, y))
        for x, y in zip(a, b))


def test_photometric_draws_are_the_same_for_any_worker_count_engine_and_resume(store):
    ds = shardkit.ShardDataset(store, recipe=RECIPE)
    inline = stream(lambda: ds.loader(batch_size=4, shuffle=True))
    assert inline[0][0].dtype == torch.float32 and inline[0][1].dtype == torch.uint8
    assert inline[0][0].shape == (4, 3, 24, 24) and inline[0][0].is_contiguous()
    workers = stream(lambda: ds.loader(batch_size=4, shuffle=True, num_workers=2))
    threads = stream(lambda: ds.loader(batch_size=4, shuffle=True, engine="threads",
                                       num_threads=2))
    assert same(inline, workers) and same(inline, threads)
    # A fresh loader under another seed resumes at the third batch with the same pixels.
    torch.manual_seed(5)
    loader = ds.loader(batch_size=4, shuffle=True, num_workers=2)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    torch.manual_seed(99)
    resumed = ds.loader(batch_size=4, shuffle=True, num_workers=2)
    resumed.load_state_dict(state)
    assert same([[v.clone() for v in images] for images, _ in resumed], inline[2:])
    # The steps are applied: the same crops without them give other pixels.
    plain = shardkit.ShardDataset(store, views=[shardkit.View(24, (0.2, 1.0), flip=0.5),
                                                shardkit.View(16, flip=0.0)])
    assert not same([b[1:] for b in stream(lambda: plain.loader(batch_size=4, shuffle=True))],
                    [b[1:] for b in inline])
    # In the consuming process a batch's float views lie in the batch pool's reused buffers
    # (no fresh pages to fault in per batch), as its uint8 blocks do.
    for batch in ([0, 1, 2, 3], [4, 5, 6, 7]):  # the second after the first is dropped
        images, _ = shardkit.collate(ds.__getitems__(batch))
        where = images[0].data_ptr()
        assert any(s.array.ctypes.data <= where < s.array.ctypes.data + s.nbytes
                   for s in batchpool.pool(False).slots)
        del images
    ds.close()
    plain.close()


def test_options_build_a_recipe_and_a_conflicting_option_is_refused(store):
    ds = shardkit.ShardDataset(store, crop=24, crop_mode="random_resized", flip=0.5)
    assert ds.recipe == R.RandomResizedCrop(24, flip=0.5)
    same_crop = shardkit.ShardDataset(store, recipe=R.RandomResizedCrop(24, flip=0.5))
    torch.manual_seed(3)
    a = [x for x, _ in ds.__getitems__(list(range(6)))]
    torch.manual_seed(3)
    b = [x for x, _ in same_crop.__getitems__(list(range(6)))]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert shardkit.ShardDataset(store, crop=20).recipe == R.CenterCrop(20)
    assert shardkit.ShardDataset(store).recipe == R.Whole()
    for option in (dict(crop=24), dict(flip=0.5), dict(scale=(0.5, 1.0)),
                   dict(views=[shardkit.View(16)]), dict(crop_mode="random")):
        name = next(iter(option))
        with pytest.raises(OptionError, match=f"^recipe and {name} both say how to crop"):
            shardkit.ShardDataset(store, recipe=R.CenterCrop(16), **option)
    with pytest.raises(OptionError, match="output must be 'tensor'"):
        shardkit.ShardDataset(store, recipe=R.CenterCrop(16, then=[R.Normalize()]),
                              output="numpy")
    with pytest.raises(OptionError, match="^normalize is given and the dataset's recipe already"):
        shardkit.ShardDataset(store, recipe=R.CenterCrop(16, then=[R.Normalize()])).loader(
            batch_size=2, normalize=((0.5,) * 3, (0.5,) * 3))  # at once, not at the first batch
    with pytest.raises(OptionError, match="Normalize must be the last step"):
        R.CenterCrop(16, then=[R.Normalize(), R.RandomGrayscale()])
    with pytest.raises(OptionError, match="GaussianBlur kernel must be an odd"):
        R.GaussianBlur(4)
    with pytest.raises(OptionError, match="interpolation must be one of"):
        R.RandomResizedCrop(16, interpolation="lanczos")
    # torchvision's InterpolationMode is an Enum of the names (the probe of test_recipes_tv.py
    # passes the real one); a jitter range given as a list keeps the recipe hashable.
    mode = enum.Enum("InterpolationMode", {"BICUBIC": "bicubic", "LANCZOS": "lanczos"})
    assert R.RandomResizedCrop(16, interpolation=mode.BICUBIC) \
        == R.RandomResizedCrop(16, interpolation="bicubic")
    with pytest.raises(OptionError, match="interpolation must be one of"):
        R.RandomResizedCrop(16, interpolation=mode.LANCZOS)
    # a sequence of them draws one per sample (timm's 'random'); a sequence of one is that one
    assert R.RandomResizedCrop(16, interpolation=[mode.BICUBIC, "bilinear"]).interpolation == (
        "bicubic", "bilinear")
    assert R.RandomResizedCrop(16, interpolation=["nearest"]) == R.RandomResizedCrop(
        16, interpolation="nearest")
    for bad in (("bilinear", "lanczos"), ()):
        with pytest.raises(OptionError, match=r"^RandomResizedCrop interpolation must be one of "
                                              rf".* got {re.escape(repr(bad))}$"):
            R.RandomResizedCrop(16, interpolation=bad)
    assert hash(R.ColorJitter(brightness=[0.5, 1.5])) == hash(R.ColorJitter(brightness=(0.5, 1.5)))
    # v2's sizes as sequences: one side is square, a square kernel is its side
    assert R.CenterCrop([16]) == R.CenterCrop(16) and R.RandomCrop((16, 16)) == R.RandomCrop(16)
    assert R.RandomResizedCrop([16]) == R.RandomResizedCrop(16)
    assert R.GaussianBlur((5, 5)) == R.GaussianBlur(5) == R.GaussianBlur([5])
    with pytest.raises(OptionError, match=r"^GaussianBlur kernel .* got \(5, 3\)$"):
        R.GaussianBlur((5, 3))
    with pytest.raises(OptionError, match="^RandomResizedCrop scale must be"):  # the name written
        R.RandomResizedCrop(16, scale=(1.0, 0.5))
    with pytest.raises(OptionError, match=r"^crop must be a positive integer size, got crop=-1$"):
        shardkit.ShardDataset(store, crop=-1)  # no word of output='bytes', which was not given
    # scale and ratio only shape a random-resized crop: next to another they are refused.
    for option in (dict(crop=20, scale=(0.5, 1.0)), dict(crop=20, crop_mode="random",
                                                          ratio=(0.5, 2.0))):
        name = list(option)[-1]
        with pytest.raises(OptionError, match=f"^{name} is the random-resized crop's"):
            shardkit.ShardDataset(store, **option)
    # output='bytes' is the stored record undecoded: a recipe's steps or flip would be dropped.
    for option in (dict(recipe=R.Whole(then=[R.RandomSolarize(0, p=1.0)])), dict(flip=0.5),
                   dict(recipe=R.RandomResizedCrop(16))):
        what = "recipe=" if "recipe" in option else "flip="
        with pytest.raises(OptionError, match=f"^output='bytes' .* with {what}"):
            shardkit.ShardDataset(store, output="bytes", **option)
    # with_recipe (timm's integration) puts a plain bilinear crop in place of the recipe's: a
    # recipe with steps or another interpolation is refused rather than dropped.
    for recipe in (R.CenterCrop(16, then=[R.RandomGrayscale(1.0)]),
                   R.RandomResizedCrop(16, interpolation="bicubic")):
        with pytest.raises(OptionError, match="^with_recipe: this dataset's recipe .* would drop"):
            shardkit.ShardDataset(store, recipe=recipe).with_recipe(16, "center")
    plain = shardkit.ShardDataset(store, recipe=R.CenterCrop(20))
    assert plain.with_recipe(16).recipe == R.CenterCrop(16)
    bicubic = plain.with_recipe(16, "random_resized", interpolation="bicubic")
    assert bicubic.recipe == R.RandomResizedCrop(16, interpolation="bicubic")
    torch.manual_seed(4)
    a = [x for x, _ in bicubic.__getitems__([0, 1, 2])]
    torch.manual_seed(4)
    b = [x for x, _ in shardkit.ShardDataset(store, recipe=bicubic.recipe).__getitems__([0, 1, 2])]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(OptionError, match="^with_recipe: interpolation is a random-resized"):
        plain.with_recipe(16, "center", interpolation="bicubic")
    assert shardkit.View is R.View  # the view recipe's old name and import path


def test_dino_is_main_dinos_augmentation():
    """2 global crops of 224 at (0.4, 1), 8 local of 96 at (0.05, 0.4), bicubic; blur p 1.0 /
    0.1 / 0.5; solarize on global 2 only; ImageNet normalisation at the end of each view.
    ``shardkit.recipes.dino`` as the docs write it works after a bare ``import shardkit``: the
    package's lazy ``__getattr__`` finds the subpackage whether or not anything imported it."""
    assert shardkit.__getattr__("recipes").dino is R.dino and "recipes" in dir(shardkit)
    views = R.dino((0.4, 1.0), (0.05, 0.4), 8).views
    assert [v.size for v in views] == [(224, 224)] * 2 + [(96, 96)] * 8
    for number in (2.5, -1):
        with pytest.raises(OptionError, match="^dino local_crops_number must be an int >= 0"):
            R.dino(local_crops_number=number)
    assert [v.scale for v in views] == [(0.4, 1.0)] * 2 + [(0.05, 0.4)] * 8
    assert {v.interpolation for v in views} == {"bicubic"} and {v.flip for v in views} == {0.5}
    blur = [next(s.p for s in v.then if isinstance(s, R.GaussianBlur)) for v in views]
    assert blur == [1.0, 0.1] + [0.5] * 8
    assert [any(isinstance(s, R.RandomSolarize) for s in v.then) for v in views] == \
        [False, True] + [False] * 8
    assert all(v.then[0] == R.ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8)
               and v.then[1] == R.RandomGrayscale(0.2) and isinstance(v.then[-1], R.Normalize)
               for v in views)
