"""Run under the torchvision environment (``.venv-tv``) by tests/fields/test_crop_parity.py.

argv: CONFIG_JSON (store, modes, seeds, crop). For every mode, sanitize setting, record and seed,
it compares ``ShardDataset(store, fields=[boxes, labels, masks], crop=..., crop_mode=mode,
flip=0.5)`` against torchvision v2's ``Compose([<crop>, RandomHorizontalFlip(0.5)
(, SanitizeBoundingBoxes())])`` applied to the uncropped sample under the same
``torch.manual_seed``: items, batches (``__getitems__`` + ``shardkit.collate``), threads, and
DataLoader workers (fork and spawn, each worker's seed reproduced). Prints one JSON object.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.utils.data import DataLoader
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
    out["workers"] = workers_check(path, crop, cfg["modes"])
    print(json.dumps(out))


def workers_check(path: str, crop: int, modes: list[str]) -> list:
    """A 2-worker DataLoader (fork, spawn) gives what this process gives under each worker's
    seed (``base_seed + worker_id``, batches dealt round-robin)."""
    bad = []
    for mode in modes:
        for context in ("fork", "spawn"):
            ds = ShardDataset(path, fields=FIELDS, crop=crop, crop_mode=mode, flip=0.5,
                              sanitize=True)
            gen = torch.Generator().manual_seed(1234)
            loader = ds.loader(batch_size=3, num_workers=2, generator=gen,
                               multiprocessing_context=context, persistent_workers=False)
            got = list(loader)
            base_seed = torch.empty((), dtype=torch.int64).random_(
                generator=torch.Generator().manual_seed(1234)).item()
            batches = [list(range(s, min(s + 3, len(ds)))) for s in range(0, len(ds), 3)]
            expect = [None] * len(batches)
            for worker in range(2):
                torch.manual_seed(base_seed + worker)
                for b in range(worker, len(batches), 2):
                    expect[b] = shardkit.collate(ds.__getitems__(batches[b]))
            for b, (ours, ref) in enumerate(zip(got, expect)):
                same = torch.equal(ours[0], ref[0]) and all(
                    len(ours[1][k]) == len(ref[1][k]) and all(
                        torch.equal(plain(x), plain(y)) for x, y in zip(ours[1][k], ref[1][k]))
                    for k in FIELDS)
                if not same:
                    bad.append([mode, context, b])
            if len(got) != len(batches):
                bad.append([mode, context, "batches", len(got)])
    return bad


if __name__ == "__main__":
    main()
