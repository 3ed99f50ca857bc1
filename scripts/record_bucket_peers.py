#!/usr/bin/env python
"""Record what the peers' own bucketing code does on thousands of image sizes, as plain numbers
(``tests/packing/data/bucket_peers.json``), for ``tests/packing/test_bucket_peers.py`` to compare
shardkit's rules with, offline.

    python scripts/record_bucket_peers.py --kohya PATH/sd-scripts --diffusers PATH/diffusers \
        --out tests/packing/data/bucket_peers.json

Nothing of theirs is copied: the peers' files are read from the checkouts given and the
definitions used are executed from them, unchanged, in this process, with stubs only for what
they import and never call here (sd-scripts' image resize, torch):

* kohya sd-scripts (``library/train_util.py``: ``BucketManager``, ``trim_and_resize_if_required``;
  ``library/model_util.py``: ``make_bucket_resolutions``): per configuration and size, the
  bucket and resized size of ``select_bucket``, the crop ``trim_and_resize_if_required`` cuts
  from an image already at the resized size (read from coordinate arrays: no pixels are
  resized), and ``get_crop_ltrb``.
* diffusers (``examples/text_to_image/train_text_to_image_sdxl.py``: its ``preprocess_train``,
  with ``--center_crop``): the ``crop_top_lefts`` it computes for an image at a resized size,
  one side at a time (it crops squares of ``--resolution``: the height's offset with the
  resolution set to the bucket's height, the width's with it set to the bucket's width).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import random
import subprocess
import types
from typing import Any, List, NamedTuple, Optional, Tuple

import numpy as np

SDXL_WH = [(512, 2048), (512, 1984), (512, 1920), (512, 1856), (576, 1792), (576, 1728),
           (576, 1664), (640, 1600), (640, 1536), (704, 1472), (704, 1408), (704, 1344),
           (768, 1344), (768, 1280), (832, 1216), (832, 1152), (896, 1152), (896, 1088),
           (960, 1088), (960, 1024), (1024, 1024), (1024, 960), (1088, 960), (1088, 896),
           (1152, 896), (1152, 832), (1216, 832), (1280, 768), (1344, 768), (1408, 704),
           (1472, 704), (1536, 640), (1600, 640), (1664, 576), (1728, 576), (1792, 576),
           (1856, 512), (1920, 512), (1984, 512), (2048, 512)]

#: name -> (BucketManager arguments: no_upscale, max_reso, min_size, max_size, reso_steps;
#: how its buckets are made: "make" (make_buckets), "sdxl" (set_predefined_resos), None)
KOHYA_CONFIGS = {
    "kohya": ((False, (1024, 1024), 256, 1024, 64), "make"),
    "kohya_no_upscale": ((True, (1024, 1024), 256, 1024, 64), None),
    "kohya_512_2048": ((False, (1024, 1024), 512, 2048, 64), "make"),
    "sdxl": ((False, (1024, 1024), None, None, 64), "sdxl"),
}


def sizes(count: int, seed: int = 0) -> list[tuple[int, int]]:
    """(width, height) pairs: every bucket size of the configurations, sizes around them, small
    and huge ones, and random photos of 1:4..4:1 up to 6000 px."""
    rng = random.Random(seed)
    found = set(SDXL_WH)
    for w, h in SDXL_WH:
        found.update({(w + 1, h), (w, h + 1), (w - 1, h), (w * 3, h * 3), (w // 2, h // 2)})
    found.update({(w, h) for w in (64, 65, 100, 127, 128, 200, 255, 256, 300, 511, 512)
                  for h in (64, 99, 128, 250, 256, 400, 512, 600)})
    found.update({(8000, 2000), (2000, 8000), (6000, 6000), (1025, 1023), (1100, 1000)})
    while len(found) < count:
        long = rng.randint(64, 6000)
        short = rng.randint(max(16, long // 4), long)
        found.add((long, short) if rng.random() < 0.5 else (short, long))
    return sorted(found)


def _definitions(path: str, names: set[str]) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            and n.name in names]
    missing = names - {n.name for n in body}
    if missing:
        raise SystemExit(f"{path}: no {', '.join(sorted(missing))}")
    return ast.Module(body=body, type_ignores=[])


def load_kohya(root: str) -> dict[str, Any]:
    """sd-scripts' definitions, executed from its files unchanged."""
    model_util = types.SimpleNamespace()
    ns: dict[str, Any] = {"math": math, "np": np, "random": random, "Tuple": Tuple,
                          "Optional": Optional, "List": List, "NamedTuple": NamedTuple}
    exec(compile(_definitions(os.path.join(root, "library", "model_util.py"),
                              {"make_bucket_resolutions"}), "model_util.py", "exec"), ns)
    model_util.make_bucket_resolutions = ns["make_bucket_resolutions"]

    def resize_image(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an image is already at its resized size here")

    ns.update(model_util=model_util, resize_image=resize_image)
    exec(compile(_definitions(os.path.join(root, "library", "train_util.py"),
                              {"BucketManager", "trim_and_resize_if_required"}),
                 "train_util.py", "exec"), ns)
    return ns


def record_kohya(ns: dict[str, Any], config: tuple, made: str | None,
                 found: list[tuple[int, int]]) -> dict[str, Any]:
    manager = ns["BucketManager"](*config)
    if made == "make":
        manager.make_buckets()
    elif made == "sdxl":
        manager.set_predefined_resos(SDXL_WH)
    trim = ns["trim_and_resize_if_required"]
    rows = []
    for width, height in found:
        try:
            reso, resized, _ = manager.select_bucket(width, height)
        except (ZeroDivisionError, AssertionError) as exc:
            rows.append([width, height, type(exc).__name__])
            continue
        if reso[0] <= 0 or reso[1] <= 0:  # an image side under the step: no bucket
            rows.append([width, height, "empty bucket"])
            continue
        rw, rh = resized
        xs = np.broadcast_to(np.arange(rw, dtype=np.int64)[None, :, None], (rh, rw, 1))
        ys = np.broadcast_to(np.arange(rh, dtype=np.int64)[:, None, None], (rh, rw, 1))
        cut_x, original, ltrb = trim(False, xs, reso, resized)
        cut_y, _, _ = trim(False, ys, reso, resized)
        assert tuple(original) == (rw, rh)
        rows.append([width, height, list(reso), list(resized),
                     [int(cut_x[0, 0, 0]), int(cut_y[0, 0, 0])],
                     [float(v) for v in manager.get_crop_ltrb(reso, (width, height))]])
    return {"bucket_manager": list(config), "buckets": made,
            "predefined": [list(r) for r in getattr(manager, "predefined_resos", [])],
            "rows": rows}


class _Image:
    """What ``preprocess_train`` reads of an image: its size; ``convert`` returns it."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height

    def convert(self, mode: str) -> _Image:
        return self


def record_diffusers(root: str, placements: list[list[int]]) -> dict[str, Any]:
    """diffusers' ``crop_top_lefts`` for images already at their resized size."""
    path = os.path.join(root, "examples", "text_to_image", "train_text_to_image_sdxl.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    fn = next(n for n in ast.walk(main) if isinstance(n, ast.FunctionDef)
              and n.name == "preprocess_train")
    args = types.SimpleNamespace(center_crop=True, random_flip=False, resolution=0)

    def identity(image: Any) -> Any:
        return image

    ns: dict[str, Any] = {"args": args, "train_resize": identity, "train_crop": identity,
                          "train_flip": identity, "train_transforms": identity,
                          "image_column": "image", "random": random, "crop": None}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)

    def offsets(rh: int, rw: int, side: int) -> tuple[int, int]:
        args.resolution = side
        return ns["preprocess_train"]({"image": [_Image(rw, rh)]})["crop_top_lefts"][0]

    rows = []
    for rh, rw, bh, bw in placements:
        rows.append([rh, rw, bh, bw, offsets(rh, rw, bh)[0], offsets(rh, rw, bw)[1]])
    return {"function": "main.preprocess_train (--center_crop)", "rows": rows}


def _commit(root: str) -> str:
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kohya", required=True, help="a checkout of kohya-ss/sd-scripts")
    parser.add_argument("--diffusers", required=True, help="a checkout of huggingface/diffusers")
    parser.add_argument("--count", type=int, default=2500, help="image sizes to record")
    parser.add_argument("--kohya-commit", help="the sd-scripts commit (default: its git HEAD)")
    parser.add_argument("--diffusers-commit", help="the diffusers commit (default: its HEAD)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    found = sizes(args.count)
    ns = load_kohya(args.kohya)
    kohya = {name: record_kohya(ns, config, made, found)
             for name, (config, made) in KOHYA_CONFIGS.items()}
    # diffusers' offsets for the resized sizes and buckets of the area rule's 1024 set
    # (kohya_512_2048's buckets), resized to cover as shardkit's area rule does
    placements = set()
    for width, height, *rest in kohya["kohya_512_2048"]["rows"]:
        bw, bh = rest[0]
        if bh * width >= bw * height:
            rh, rw = bh, -(-width * bh // height)
        else:
            rh, rw = -(-height * bw // width), bw
        placements.add((rh, rw, bh, bw))
        if height >= 64 and width >= 64:  # a small source kept at its own size, cut to 64s
            placements.add((height, width, height - height % 64, width - width % 64))
    out = {
        "command": "python scripts/record_bucket_peers.py --kohya PATH/sd-scripts "
                   f"--diffusers PATH/diffusers --count {args.count} --out "
                   "tests/packing/data/bucket_peers.json",
        "kohya_commit": args.kohya_commit or _commit(args.kohya),
        "diffusers_commit": args.diffusers_commit or _commit(args.diffusers),
        "sizes": "(width, height) as sd-scripts takes them; rows: [width, height, bucket "
                 "(w, h), resized (w, h), crop (left, top), get_crop_ltrb] or [width, height, "
                 "error]; diffusers rows: [resized h, resized w, bucket h, bucket w, y1, x1]",
        "kohya": kohya,
        "diffusers": record_diffusers(args.diffusers, sorted(placements)),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"{args.out}: {len(found)} sizes, {len(placements)} diffusers placements")


if __name__ == "__main__":
    main()
