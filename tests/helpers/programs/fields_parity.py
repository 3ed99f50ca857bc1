"""Run under the torchvision environment (``.venv-tv``) by tests/fields/test_coco_torchvision.py.

argv: CONFIG_JSON (store, modes, seeds, crop). For every mode, sanitize setting, record and seed,
it compares ``ShardDataset(store, fields=[boxes, labels, masks], crop=..., crop_mode=mode,
flip=0.5)`` against torchvision v2's ``Compose([<crop>, RandomHorizontalFlip(0.5)
(, SanitizeBoundingBoxes())])`` applied to the uncropped sample under the same
``torch.manual_seed``: items, batches (``__getitems__`` + ``shardkit.collate``), threads, and a
``ds.loader`` with fork and spawn workers (each sample's keyed draws reproduced from
``shardkit.sample_seed``). Prints one JSON object.
"""

from __future__ import annotations

import json
import sys

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

import shardkit
from shardkit import ShardDataset

FIELDS = ["boxes", "labels", "masks"]  # the config's "fields" (e.g. a semantic "seg") join them


def plain(x):
    return x.as_subclass(torch.Tensor) if isinstance(x, torch.Tensor) else x


def same_target(ours: dict, ref: dict) -> bool:
    if set(ours) != set(ref):
        return False
    for key in ref:
        a, b = ours[key], ref[key]
        if isinstance(b, torch.Tensor):
            if type(a) is not type(b) or a.dtype != b.dtype or not torch.equal(plain(a), plain(b)):
                return False
            if isinstance(b, tv_tensors.BoundingBoxes) and (
                    tuple(a.canvas_size) != tuple(b.canvas_size) or a.format != b.format):
                return False
        elif a != b:
            return False
    return True


def reference(mode: str, crop: int, sanitize: bool):
    first = {"random_resized": lambda: v2.RandomResizedCrop(crop, antialias=True),
             "random": lambda: v2.RandomCrop(crop),
             "center": lambda: v2.CenterCrop(crop)}[mode]()
    steps = [first, v2.RandomHorizontalFlip(0.5)]
    if sanitize:
        steps.append(v2.SanitizeBoundingBoxes())
    return v2.Compose(steps)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    path, crop, seeds = cfg["store"], cfg["crop"], cfg["seeds"]
    FIELDS[:] = FIELDS[:3] + cfg.get("fields", [])
    raw = ShardDataset(path, fields=FIELDS)
    n = len(raw)
    out = {"compared": 0, "differing": [], "boxes_seen": 0, "boxes_dropped": 0,
           "canvas_checked": 0}
    for mode in cfg["modes"]:
        for sanitize in (False, True):
            ds = ShardDataset(path, fields=FIELDS, crop=crop, crop_mode=mode, flip=0.5,
                              sanitize=sanitize)
            threaded = ShardDataset(path, fields=FIELDS, crop=crop, crop_mode=mode, flip=0.5,
                                    sanitize=sanitize, threads=2)
            transform = reference(mode, crop, sanitize)
            for seed in seeds:
                refs = []
                torch.manual_seed(seed)
                for i in range(n):
                    img, target = raw[i]
                    refs.append(transform(img, target))
                torch.manual_seed(seed)
                items = [ds[i] for i in range(n)]
                torch.manual_seed(seed)
                batch = shardkit.collate(ds.__getitems__(list(range(n))))
                torch.manual_seed(seed)
                threads = shardkit.collate(threaded.__getitems__(list(range(n))))
                for i, (ref_img, ref_t) in enumerate(refs):
                    out["compared"] += 1
                    out["boxes_seen"] += len(raw[i][1].get("boxes", ()))
                    out["boxes_dropped"] += len(raw[i][1].get("boxes", ())) - len(
                        ref_t.get("boxes", ()))
                    checks = {
                        "item": same_target(items[i][1], ref_t)
                        and torch.equal(items[i][0], plain(ref_img)),
                        "batch": all(torch.equal(plain(batch[1][k][i]), plain(ref_t[k]))
                                     for k in FIELDS)
                        and torch.equal(batch[0][i], plain(ref_img)),
                        "threads": all(torch.equal(plain(threads[1][k][i]), plain(ref_t[k]))
                                       for k in FIELDS),
                    }
                    out["canvas_checked"] += 1
                    for name, ok in checks.items():
                        if not ok:
                            out["differing"].append([mode, sanitize, seed, i, name])
    out["workers"], out["workers_compared"] = workers_check(
        path, crop, cfg["modes"], cfg.get("contexts", ["fork", "spawn"]))
    print(json.dumps(out))


def workers_check(path: str, crop: int, modes: list[str], contexts: list[str]
                  ) -> tuple[list, int]:
    """A 2-worker ``ds.loader`` (each of ``contexts``: fork, spawn) gives, sample for sample, what torchvision v2 gives
    on the uncropped sample after ``torch.manual_seed(shardkit.sample_seed(seed, epoch,
    position))`` (docs/training-recipe.md, "Random state"): ``seed`` the loader generator's
    ``initial_seed()``, ``epoch`` 0 (a fresh loader whose sampler has no epoch), ``position`` the
    sample's place ``k`` in the epoch (``loader.sampler.indices()``'s order). Whichever worker
    decodes a sample, its draws are its own: images, boxes and masks ``torch.equal`` to v2's."""
    bad, compared = [], 0
    raw = ShardDataset(path, fields=FIELDS)
    for mode in modes:
        transform = reference(mode, crop, sanitize=True)
        for context in contexts:
            ds = ShardDataset(path, fields=FIELDS, crop=crop, crop_mode=mode, flip=0.5,
                              sanitize=True)
            gen = torch.Generator().manual_seed(1234)
            loader = ds.loader(batch_size=3, num_workers=2, generator=gen,
                               multiprocessing_context=context, persistent_workers=False)
            order = loader.sampler.indices().tolist()
            got = list(loader)
            refs = []
            for k, i in enumerate(order):
                torch.manual_seed(shardkit.sample_seed(gen.initial_seed(), 0, k))
                refs.append(transform(*raw[i]))
            for b, ours in enumerate(got):
                for j, (ref_img, ref_t) in enumerate(refs[3 * b:3 * b + 3]):
                    same = j < len(ours[0]) and torch.equal(ours[0][j], plain(ref_img)) and all(
                        torch.equal(plain(ours[1][key][j]), plain(ref_t[key])) for key in FIELDS)
                    compared += 1
                    if not same:
                        bad.append([mode, context, b, j])
            if sum(len(images) for images, _ in got) != len(order):
                bad.append([mode, context, "samples", sum(len(images) for images, _ in got)])
            ds.close()
    raw.close()
    return bad, compared


if __name__ == "__main__":
    main()
