"""Every recipe of ``shardkit.recipes`` is torchvision v2's pipeline of the same name, pixel for
pixel (``torch.equal``; ``Normalize``'s floats too): on odd-sized JPEGs (4:2:0, 4:4:4, grayscale),
three seeds, in items and a batch (torch's global RNG), in a ``ds.loader`` with two worker
processes and on the thread engine (per-sample seeds). The probe
``tests/helpers/programs/tv_recipes.py`` runs in ``.venv-tv``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_program

import shardkit
from shardkit.bench.sample import photo_like

CASES = ["whole", "center", "random", "rrc_bicubic", "rrc_nearest", "views", "dino"]


@pytest.fixture(scope="module")
def probe(tv_python, tmp_path_factory) -> dict:
    import simplejpeg

    path = str(tmp_path_factory.mktemp("tv-recipes") / "r.lmdb")
    rng = np.random.default_rng(5)
    sizes = [(97, 131), (130, 77), (203, 157), (61, 45), (149, 149), (48, 90), (121, 199)]
    with shardkit.StoreWriter(path, ["a"]) as w:
        for i, (h, wd) in enumerate(sizes):
            img = photo_like(rng, wd, h)
            if i == 2:
                gray = np.ascontiguousarray(img.mean(axis=2).astype(np.uint8)[..., None])
                data = simplejpeg.encode_jpeg(gray, quality=90, colorspace="GRAY")
            else:
                data = simplejpeg.encode_jpeg(img, quality=90, colorspace="RGB",
                                              colorsubsampling="420" if i % 2 else "444")
            w.add_encoded(data, 0, h, wd)
    done = run_program("tv_recipes", path, python=tv_python, capture_output=True, text=True,
                       timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("case", CASES)
def test_recipe_equals_torchvision_v2_in_items_batches_workers_and_threads(probe, case):
    views = {"views": 2, "dino": 4}.get(case, 1)
    expected = {"items": [21 * views, 0], "batch": [21 * views, 0],
                "workers": [7 * views, 0], "threads": [7 * views, 0]}
    if case == "whole":  # whole images of many sizes: items only
        expected.update(batch=[0, 0], workers=[0, 0], threads=[0, 0])
    assert probe[case] == expected
