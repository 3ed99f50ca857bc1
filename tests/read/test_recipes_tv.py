"""Every recipe of ``shardkit.recipes`` is torchvision v2's pipeline of the same name, pixel for
pixel (``torch.equal``; ``Normalize``'s floats too): on nine odd-sized JPEGs (4:2:0, 4:4:4,
grayscale), eight seeds on every read path: items and a batch (torch's global RNG), a
``ds.loader`` with two worker processes, the thread engine, and a loader resumed mid-epoch from
another's state (per-sample seeds). The probe
``tests/helpers/programs/tv_recipes.py`` runs in ``.venv-tv``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_program

import shardkit
from shardkit.bench.sample import photo_like

CASES = ["whole", "center", "random", "rrc_bicubic", "rrc_nearest", "rrc_random", "views",
         "dino"]


@pytest.fixture(scope="module")
def probe(tv_python, tmp_path_factory) -> dict:
    import simplejpeg

    path = str(tmp_path_factory.mktemp("tv-recipes") / "r.lmdb")
    rng = np.random.default_rng(5)
    sizes = [(97, 131), (130, 77), (203, 157), (61, 45), (149, 149), (48, 90), (121, 199),
             (77, 255), (255, 63)]
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
def test_recipe_equals_torchvision_v2_on_every_read_path(probe, case):
    views = {"views": 2, "dino": 4}.get(case, 1)
    n, seeds = 9, 8
    expected = {"items": [n * seeds * views, 0], "batch": [n * seeds * views, 0],
                "workers": [n * seeds * views, 0], "threads": [n * seeds * views, 0],
                "resume": [(n - 4) * seeds * views, 0]}  # resumed at the second batch of 4
    if case == "whole":  # whole images of many sizes: items only
        expected.update(batch=[0, 0], workers=[0, 0], threads=[0, 0], resume=[0, 0])
    else:  # eight distinct draw streams on each loader path
        assert probe[case].pop("streams") == {"workers": seeds, "threads": seeds,
                                               "resume": seeds}
    if case == "rrc_random":  # the reference drew both interpolations, about equally
        bilinear, bicubic = probe[case].pop("picks")
        assert min(bilinear, bicubic) > 0.4 * (bilinear + bicubic), (bilinear, bicubic)
    assert probe[case] == expected
