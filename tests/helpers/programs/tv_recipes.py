"""Probe run under the torchvision environment (``.venv-tv``) by tests/read/test_recipes_tv.py.

argv: STORE; prints one JSON object: for each recipe of ``shardkit.recipes`` and each read path
(items, a batch, a ``ds.loader`` with two worker processes, the thread engine, and a loader that
resumed mid-epoch from another's state), how many samples (views) it compared with torchvision
v2's pipeline of the same name and how many differ (``torch.equal``; float steps included), over
eight seeds on every path. Items and batches draw from torch's global RNG under
``torch.manual_seed(seed)``; a loader's sample ``k`` is v2's after
``torch.manual_seed(shardkit.sample_seed(seed, epoch, k))`` with the seed and epoch its
``state_dict()["draws"]`` names for the epoch (two generator seeds, four epochs each).
"""

from __future__ import annotations

import json
import sys

import torch
from torchvision.transforms import v2

import shardkit
from shardkit import ShardDataset
from shardkit import recipes as R

I = v2.InterpolationMode
JITTER = (0.4, 0.4, 0.2, 0.1)


def tv_steps(then: list) -> list:
    """v2's transforms for shardkit steps."""
    out = []
    for s in then:
        if isinstance(s, R.ColorJitter):
            t = v2.ColorJitter(s.brightness, s.contrast, s.saturation, s.hue)
            out.append(t if s.p is None else v2.RandomApply([t], p=s.p))
        elif isinstance(s, R.RandomGrayscale):
            out.append(v2.RandomGrayscale(s.p))
        elif isinstance(s, R.RandomSolarize):
            out.append(v2.RandomSolarize(s.threshold, s.p))
        elif isinstance(s, R.GaussianBlur):
            t = v2.GaussianBlur(s.kernel, s.sigma)
            out.append(t if s.p is None else v2.RandomApply([t], p=s.p))
        elif isinstance(s, R.Normalize):
            out += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(s.mean, s.std)]
    return out


PICKS: dict = {}  # how often the reference drew each interpolation


class RandomResizedCropAndInterpolation(v2.RandomResizedCrop):
    """timm's transform of that name in v2's terms: the box, then one of the interpolations
    (``torch.randint`` in place of timm's ``random.choice``), then v2's anti-aliased resize."""

    def __init__(self, size, scale, ratio, interpolations) -> None:
        super().__init__(size, scale, ratio, antialias=True)
        self.interpolations = [I(i) for i in interpolations]

    def make_params(self, flat_inputs):
        params = super().make_params(flat_inputs)
        pick = int(torch.randint(0, len(self.interpolations), (1,)))
        PICKS[pick] = PICKS.get(pick, 0) + 1
        return {**params, "interpolation": self.interpolations[pick]}

    def transform(self, inpt, params):
        params = dict(params)
        interpolation = params.pop("interpolation")
        return v2.functional.resized_crop(inpt, **params, size=self.size,
                                          interpolation=interpolation, antialias=True)


def tv_crop(c) -> v2.Compose:
    """v2's pipeline for one shardkit crop recipe."""
    if isinstance(c, shardkit.View):  # v2's RandomResizedCrop then RandomHorizontalFlip
        c = R.RandomResizedCrop(c.size, c.scale, c.ratio, flip=c.flip)
    first = []
    if isinstance(c, R.CenterCrop):
        first = [v2.CenterCrop(c.size)]
    elif isinstance(c, R.RandomCrop):
        first = [v2.RandomCrop(c.size)]
    elif isinstance(c, R.RandomResizedCrop) and isinstance(c.interpolation, tuple):
        first = [RandomResizedCropAndInterpolation(c.size, c.scale, c.ratio, c.interpolation)]
    elif isinstance(c, R.RandomResizedCrop):
        first = [v2.RandomResizedCrop(c.size, c.scale, c.ratio, interpolation=I(c.interpolation),
                                      antialias=True)]
    flip = [] if c.flip is None else [v2.RandomHorizontalFlip(c.flip)]
    return v2.Compose(first + flip + tv_steps(list(c.then)))


def reference(recipe) -> list:
    return [tv_crop(c) for c in (recipe.views if isinstance(recipe, R.Views) else [recipe])]


CASES = {
    "whole": R.Whole(then=[R.ColorJitter(*JITTER, p=0.8), R.RandomGrayscale(0.3)]),
    "center": R.CenterCrop(48, flip=0.5, then=[R.RandomSolarize(128, p=0.5)]),
    "random": R.RandomCrop(40, then=[R.GaussianBlur(5, (0.1, 2.0), p=0.7)]),
    "rrc_bicubic": R.RandomResizedCrop(56, (0.2, 1.0), flip=0.5, interpolation=I.BICUBIC,
                                       then=[R.ColorJitter(*JITTER), R.Normalize()]),
    "rrc_nearest": R.RandomResizedCrop(44, interpolation="nearest", then=[
        R.ColorJitter(brightness=(0.5, 1.5), hue=0.3, p=0.6), R.GaussianBlur(3, 1.0)]),
    # timm's --train-interpolation random: bilinear or bicubic, one per sample
    "rrc_random": R.RandomResizedCrop(36, flip=0.5, interpolation=("bilinear", "bicubic")),
    "views": R.Views([R.RandomResizedCrop((40, 24), (0.2, 1.0), then=[R.RandomGrayscale(0.5)]),
                      shardkit.View(32, flip=1.0)]),
    "dino": R.dino(local_crops_number=2, global_size=64, local_size=32),
}
SEEDS = range(8)  # items and batches
LOADER_SEEDS, EPOCHS = (7, 8), 4  # loaders: eight draw streams a path
BATCH = 4


class Tally:
    def __init__(self) -> None:
        self.samples = self.differing = 0

    def add(self, ours, ref) -> None:
        ours, ref = (ours if isinstance(ours, list) else [ours]), (ref if isinstance(ref, list)
                                                                   else [ref])
        for a, b in zip(ours, ref, strict=True):
            self.samples += 1
            self.differing += not (a.shape == b.shape and a.dtype == b.dtype
                                   and torch.equal(a, b))


def probe_recipe(path: str, full: ShardDataset, recipe) -> dict:
    """The tallies of one recipe on every read path (and its loaders' draw streams)."""
    n = len(full)
    out: dict = {}
    ds = ShardDataset(path, recipe=recipe)
    tvs = reference(recipe)
    several = isinstance(recipe, R.Views)

    def ref(i: int) -> list:
        img = full[i][0]
        return [t(img) for t in tvs] if several else tvs[0](img)

    tallies = {k: Tally() for k in ("items", "batch", "workers", "threads", "resume")}
    for seed in SEEDS:
        torch.manual_seed(seed)
        refs = [ref(i) for i in range(n)]
        torch.manual_seed(seed)
        for i in range(n):
            tallies["items"].add(ds[i][0], refs[i])
        if not isinstance(recipe, R.Whole):  # whole images of many sizes: no batch
            torch.manual_seed(seed)
            for i, (img, _) in enumerate(ds.__getitems__(list(range(n)))):
                tallies["batch"].add(img, refs[i])
    if not isinstance(recipe, R.Whole):
        def split(images) -> list:
            return [list(v) for v in zip(*images)] if several else list(images)

        streams: dict = {"workers": set(), "threads": set(), "resume": set()}

        def check(key: str, got: list, draws: dict, first: int = 0) -> None:
            assert len(got) == n - first, (len(got), n, first)
            streams[key].add((draws["seed"], draws["epoch"]))
            tally = tallies[key]
            for k, sample in enumerate(got, start=first):
                torch.manual_seed(shardkit.sample_seed(draws["seed"], draws["epoch"], k))
                tally.add(sample, ref(k))

        states = []  # (state after the first batch, its draws) of each worker epoch
        for engine, key in (("processes", "workers"), ("threads", "threads")):
            extra = ({"num_workers": 2} if engine == "processes"
                     else {"engine": "threads", "num_threads": 2})
            for seed in LOADER_SEEDS:
                loader = ds.loader(batch_size=BATCH, sampler=range(n),
                                   generator=torch.Generator().manual_seed(seed), **extra)
                for _ in range(EPOCHS):
                    draws = loader.state_dict()["draws"]
                    got = []
                    for images, _ in loader:
                        got += split(images)
                        if engine == "processes" and len(got) == BATCH:
                            states.append((loader.state_dict(), draws))
                    check(key, got, draws)
        # A fresh loader (another generator, its own workers) resumes each saved state at the
        # second batch: the rest of that epoch, drawn as the saved one drew it.
        resumed = ds.loader(batch_size=BATCH, sampler=range(n), num_workers=2,
                            generator=torch.Generator().manual_seed(99))
        for state, draws in states:
            resumed.load_state_dict(state)
            got = []
            for images, _ in resumed:
                got += split(images)
            check("resume", got, draws, first=BATCH)
        out["streams"] = {k: len(v) for k, v in streams.items()}
    out.update({k: [t.samples, t.differing] for k, t in tallies.items()})
    if PICKS:
        out["picks"] = [PICKS.get(i, 0) for i in range(2)]
        PICKS.clear()
    ds.close()
    return out


def main() -> None:
    path = sys.argv[1]
    full = ShardDataset(path)
    print(json.dumps({name: probe_recipe(path, full, recipe) for name, recipe in CASES.items()}))


if __name__ == "__main__":
    main()
