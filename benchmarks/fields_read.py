"""Typed fields on the read path, two rows (same machine, same images, one run):

A. The batched crop path (``RandomResizedCrop(224)`` + flip at decode, ``ds.loader`` with
   ``shardkit.collate``) with ``fields=["boxes", "labels"]`` against the same path without
   fields, on the same COCO-packed store (target: >= 0.9x).
B. The detection read path (the same, plus ``sanitize=True``) against torchvision's
   ``CocoDetection`` + ``wrap_dataset_for_transforms_v2`` + the v2 detection recipe
   (``ToImage, RandomResizedCrop(224), RandomHorizontalFlip(0.5), SanitizeBoundingBoxes``) on
   the source images (goal: >= 4x).

Run in the torchvision environment (row B needs torchvision and pycocotools)::

    .venv-tv/bin/python benchmarks/fields_read.py --images 1500 --workers 2 \\
        --out benchmarks/results/fields_read.txt

Photo-like JPEGs (``shardkit.bench.sample``, long side ~480 px) with 1-12 random boxes each in a
COCO file; packed with ``--coco`` at shorter side 256. Each configuration runs ``--repeats``
full epochs alternately; the median epoch counts (the first batch of each epoch excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import shardkit
from shardkit.bench.sample import make_sample
from reports import emit  # beside this script


def coco_file(src: str, seed: int) -> str:
    from PIL import Image

    rng = np.random.default_rng(seed)
    images, anns = [], []
    files = sorted(os.path.join(d, f) for d in os.listdir(src) for f in os.listdir(
        os.path.join(src, d)))
    for n, rel in enumerate(files):
        with Image.open(os.path.join(src, rel)) as im:
            w, h = im.size
        images.append({"id": n + 1, "file_name": rel, "width": w, "height": h})
        for k in range(int(rng.integers(1, 13))):  # v2.SanitizeBoundingBoxes needs labels
            x, y = float(rng.uniform(0, w - 8)), float(rng.uniform(0, h - 8))
            bw, bh = float(rng.uniform(4, w - x)), float(rng.uniform(4, h - y))
            anns.append({"id": len(anns) + 1, "image_id": n + 1,
                         "category_id": int(rng.integers(1, 91)), "iscrowd": 0,
                         "bbox": [x, y, bw, bh], "area": bw * bh})
    path = os.path.join(os.path.dirname(src), "instances.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": anns,
                   "categories": [{"id": i, "name": f"c{i}"} for i in range(1, 91)]}, f)
    return path


def detection_collate(batch):
    return tuple(zip(*batch))


def epoch(loader) -> tuple[float, int]:
    """(images per second after the first batch, images)."""
    it = iter(loader)
    first = next(it)
    count, t0 = 0, time.perf_counter()
    for images, _ in it:
        count += len(images)
    del first
    return count / (time.perf_counter() - t0), count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the report here")
    args = p.parse_args()
    base = tempfile.mkdtemp(prefix="shardkit-fields-bench-")
    src = os.path.join(base, "images")
    make_sample(src, args.images, 10, seed=args.seed)
    annotations = coco_file(src, args.seed)
    store = os.path.join(base, "coco.lmdb")
    shardkit.pack(src, store, coco=annotations, coco_masks=False, progress=False)
    recipe = dict(crop=224, crop_mode="random_resized", flip=0.5)
    kw = dict(batch_size=args.batch_size, num_workers=args.workers, shuffle=True,
              drop_last=False)

    def shardkit_loader(fields, sanitize=False):
        ds = shardkit.ShardDataset(store, fields=fields, sanitize=sanitize, **recipe)
        return ds.loader(**kw)

    configs = {"no fields": lambda: shardkit_loader(None),
               "boxes+labels": lambda: shardkit_loader(["boxes", "labels"]),
               "detection (sanitize)": lambda: shardkit_loader(["boxes", "labels"], True)}
    try:
        from torchvision import datasets
        from torchvision.transforms import v2

        transforms = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(224, antialias=True),
                                 v2.RandomHorizontalFlip(0.5), v2.SanitizeBoundingBoxes()])

        def torchvision_loader():
            ds = datasets.wrap_dataset_for_transforms_v2(
                datasets.CocoDetection(src, annotations, transforms=transforms),
                target_keys=("boxes", "labels"))
            return torch.utils.data.DataLoader(ds, collate_fn=detection_collate,
                                               persistent_workers=args.workers > 0, **kw)

        configs["CocoDetection + v2 recipe"] = torchvision_loader
    except ImportError:
        print("torchvision not installed: row B left out", file=sys.stderr)
    loaders = {name: make() for name, make in configs.items()}
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(args.repeats):
        for name, loader in loaders.items():
            rates[name].append(epoch(loader)[0])
    med = {name: statistics.median(r) for name, r in rates.items()}
    lines = [f"fields_read: {args.images} images, {args.workers} workers, batch "
             f"{args.batch_size}, {args.repeats} epochs each (median), torch {torch.__version__}, "
             f"{os.cpu_count()} CPUs"]
    for name, r in rates.items():
        lines.append(f"  {name:28s} {med[name]:8.0f} img/s   (epochs: "
                     f"{', '.join(f'{x:.0f}' for x in r)})")
    lines.append(f"A. boxes+labels / no fields: {med['boxes+labels'] / med['no fields']:.2f}x "
                 "(target >= 0.9x)")
    if "CocoDetection + v2 recipe" in med:
        lines.append(f"B. detection / CocoDetection + v2: "
                     f"{med['detection (sanitize)'] / med['CocoDetection + v2 recipe']:.2f}x "
                     "(goal >= 4x)")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
