"""Probe run under the torchvision environment (``.venv-tv``) by
tests/read/test_torchvision_parity.py.

argv: CONFIG_JSON; prints one JSON object of measurements. For every
sample it compares shardkit's decode-time augmentation against torchvision v2 applied to the
uncropped ``ShardDataset(path)[i][0]`` under the same ``torch.manual_seed`` (a ``ds.loader``'s
samples under ``torch.manual_seed(shardkit.sample_seed(...))``), and the evaluation
centre crop against ``Resize(256) + CenterCrop(224)`` on the PIL-decoded source.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

import shardkit
from shardkit import ShardDataset
from shardkit import normalize


def _diff(ours: torch.Tensor, ref: torch.Tensor) -> tuple[bool, int]:
    if ours.shape != ref.shape:
        return False, 256
    return torch.equal(ours, ref), int((ours.int() - ref.int()).abs().max())


class Tally:
    def __init__(self) -> None:
        self.samples = self.differing = self.max_abs = 0

    def add(self, ours: torch.Tensor, ref: torch.Tensor) -> None:
        same, worst = _diff(ours, ref)
        self.samples += 1
        self.differing += not same
        self.max_abs = max(self.max_abs, worst)

    def result(self) -> dict:
        return {"samples": self.samples, "differing": self.differing, "max_abs": self.max_abs}


def reference_transform(mode: str, crop: int, scale, ratio, flip: float):
    first = {"random_resized": lambda: v2.RandomResizedCrop(crop, scale=scale, ratio=ratio,
                                                            antialias=True),
             "random": lambda: v2.RandomCrop(crop),
             "center": lambda: v2.CenterCrop(crop)}[mode]()
    return v2.Compose([first, v2.RandomHorizontalFlip(flip)])


def as_chw(img) -> torch.Tensor:
    if isinstance(img, torch.Tensor):
        return img
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)


def check_recipe(cfg: dict) -> dict:
    """Batched, single-item, threaded and numpy paths against torchvision, seed by seed."""
    path, mode, crop = cfg["store"], cfg["mode"], cfg["crop"]
    scale, ratio, flip = tuple(cfg["scale"]), tuple(cfg["ratio"]), cfg["flip"]
    full = ShardDataset(path)
    indices = cfg.get("indices") or list(range(len(full)))
    kwargs = dict(crop=crop, crop_mode=mode, scale=scale, ratio=ratio, flip=flip)
    if cfg.get("dct_scale") is not None:  # else shardkit's default
        kwargs["dct_scale"] = cfg["dct_scale"]
    paths = {"batch": ShardDataset(path, **kwargs),
             "batch_threads2": ShardDataset(path, threads=2, **kwargs),
             "batch_numpy": ShardDataset(path, output="numpy", **kwargs),
             "batch_pil": ShardDataset(path, output="pil", **kwargs),
             "single": ShardDataset(path, **kwargs)}
    transform = reference_transform(mode, crop, scale, ratio, flip)
    tallies = {name: Tally() for name in paths}
    for seed in cfg["seeds"]:
        torch.manual_seed(seed)
        reference = [transform(full[i][0]) for i in indices]
        for name, ds in paths.items():
            torch.manual_seed(seed)
            if name == "single":
                got = [ds[i][0] for i in indices]
            else:
                got = [img for img, _ in ds.__getitems__(indices)]
            for ours, ref in zip(got, reference):
                tallies[name].add(as_chw(ours), ref)
    out = {name: tally.result() for name, tally in tallies.items()}
    for ds in paths.values():
        ds.close()
    return out


def view_transforms(views: list) -> list:
    """What a DINO-style ``DataAugmentation`` applies, one view after the other: each view's
    ``Compose([RandomResizedCrop(size, scale, ratio, antialias=True), RandomHorizontalFlip(p)])``
    (with ``SanitizeBoundingBoxes()`` after it when ``sanitize``)."""
    return [v2.Compose([v2.RandomResizedCrop(tuple(size), scale=tuple(scale), ratio=tuple(ratio),
                                             antialias=True), v2.RandomHorizontalFlip(flip)])
            for size, scale, ratio, flip in views]


def _same_target(ours: dict, ref: dict) -> bool:
    from torchvision import tv_tensors

    if set(ours) != set(ref):
        return False
    for key, b in ref.items():
        a = ours[key]
        if not isinstance(b, torch.Tensor):
            if a != b:
                return False
            continue
        if type(a) is not type(b) or a.dtype != b.dtype or not torch.equal(
                a.as_subclass(torch.Tensor), b.as_subclass(torch.Tensor)):
            return False
        if isinstance(b, tv_tensors.BoundingBoxes) and tuple(a.canvas_size) != tuple(
                b.canvas_size):
            return False
    return True


def check_views(cfg: dict) -> dict:
    """``ShardDataset(path, views=[...])`` against each view's v2 transform applied in turn to
    the plain stored image under the same seed: items, batches (threads, numpy), and with
    ``fields`` (boxes, labels, masks; ``sanitize``) the targets of every view."""
    views = [shardkit.View(tuple(size), tuple(scale), tuple(ratio), flip)
             for size, scale, ratio, flip in cfg["views"]]
    transforms = view_transforms(cfg["views"])
    path = cfg["store"]
    full = ShardDataset(path)
    n = len(full)
    paths = {"single": ShardDataset(path, views=views),
             "batch": ShardDataset(path, views=views),
             "batch_threads2": ShardDataset(path, views=views, threads=2),
             "batch_numpy": ShardDataset(path, views=views, output="numpy")}
    tallies = {name: Tally() for name in paths}
    for seed in cfg["seeds"]:
        torch.manual_seed(seed)
        reference = [[t(full[i][0]) for t in transforms] for i in range(n)]
        for name, ds in paths.items():
            torch.manual_seed(seed)
            if name == "single":
                got = [ds[i][0] for i in range(n)]
            else:
                images = shardkit.collate(ds.__getitems__(list(range(n))))[0]
                got = [[as_chw(images[v][i].numpy() if name == "batch_numpy" else images[v][i])
                        for v in range(len(views))] for i in range(n)]
            for ours, ref in zip(got, reference):
                if len(ours) != len(ref):
                    tallies[name].differing += 1
                for a, b in zip(ours, ref):
                    tallies[name].add(as_chw(a), b)
    out = {name: tally.result() for name, tally in tallies.items()}
    out["views"] = len(views)
    fields = ["boxes", "labels", "masks"]
    # boxes and masks follow every view, the (height, width) ones too
    raw = ShardDataset(path, fields=fields)
    ds = ShardDataset(path, fields=fields, views=views, sanitize=True)
    steps = [v2.Compose([t, v2.SanitizeBoundingBoxes()]) for t in transforms]
    m = len(raw)
    compared, differing, dropped = 0, [], 0
    for seed in cfg["seeds"]:
        torch.manual_seed(seed)
        refs = [[step(*raw[i]) for step in steps] for i in range(m)]
        torch.manual_seed(seed)
        items = [ds[i] for i in range(m)]
        torch.manual_seed(seed)
        batch = shardkit.collate(ds.__getitems__(list(range(m))))
        for i in range(m):
            for v, (ref_img, ref_t) in enumerate(refs[i]):
                compared += 1
                dropped += len(raw[i][1]["boxes"]) - len(ref_t["boxes"])
                item_ok = torch.equal(items[i][0][v], ref_img.as_subclass(torch.Tensor)) \
                    and _same_target(items[i][1][v], ref_t)
                batch_ok = torch.equal(batch[0][v][i], ref_img.as_subclass(torch.Tensor)) \
                    and all(torch.equal(batch[1][v][k][i].as_subclass(torch.Tensor),
                                        ref_t[k].as_subclass(torch.Tensor)) for k in fields)
                if not (item_ok and batch_ok):
                    differing.append([seed, i, v, item_ok, batch_ok])
    out["fields"] = {"compared": compared, "differing": differing, "boxes_dropped": dropped}
    for d in [*paths.values(), ds, raw, full]:
        d.close()
    return out


def check_loader(cfg: dict) -> dict:
    """DataLoader worker processes (fork, spawn): each worker draws from its own seed,
    ``base_seed + worker_id``, exactly as torchvision transforms in that worker would."""
    path, crop, workers, batch = cfg["store"], cfg["crop"], 2, cfg["batch"]
    full = ShardDataset(path)
    ds = ShardDataset(path, crop=crop, crop_mode="random_resized", flip=0.5)
    transform = reference_transform("random_resized", crop, (0.08, 1.0), (3 / 4, 4 / 3), 0.5)
    n = len(full)
    batches = [list(range(s, min(s + batch, n))) for s in range(0, n, batch)]
    out = {}
    for method in ("fork", "spawn"):
        tally = Tally()
        generator = torch.Generator().manual_seed(cfg["seed"])
        base_seed = int(torch.empty((), dtype=torch.int64).random_(
            generator=torch.Generator().manual_seed(cfg["seed"])).item())
        loader = DataLoader(ds, batch_size=batch, num_workers=workers, generator=generator,
                            worker_init_fn=shardkit.worker_init_fn, collate_fn=shardkit.collate,
                            multiprocessing_context=method)
        got = [images.clone() for images, _ in loader]
        for w in range(workers):
            torch.manual_seed(base_seed + w)
            for b in range(w, len(batches), workers):
                for k, i in enumerate(batches[b]):
                    tally.add(got[b][k], transform(full[i][0]))
        out[method] = tally.result()
    ds.close()
    return out


def check_stream(cfg: dict) -> dict:
    """A ``ds.loader``'s samples reproduced with torchvision: for the sample at ``position`` of
    ``epoch``, ``torch.manual_seed(shardkit.sample_seed(seed, epoch, position))`` then the v2
    transform (each view's in turn). A ``ShardSampler`` rank with two worker processes
    (positions: ``sampler.global_places()``), and views in index order (positions 0, 1, ...)."""
    path, crop, seed, batch = cfg["store"], cfg["crop"], cfg["seed"], cfg["batch"]
    full = ShardDataset(path)
    ds = ShardDataset(path, crop=crop, crop_mode="random_resized", flip=0.5)
    transform = reference_transform("random_resized", crop, (0.08, 1.0), (3 / 4, 4 / 3), 0.5)
    sampler = shardkit.ShardSampler(ds, num_replicas=2, rank=1, seed=3)
    sampler.set_epoch(2)
    order = sampler.indices().tolist()
    first, step = sampler.global_places()
    loader = ds.loader(batch_size=batch, sampler=sampler, num_workers=2,
                       generator=torch.Generator().manual_seed(seed))
    got = torch.cat([images for images, _ in loader])
    crops = Tally()
    for k, i in enumerate(order):
        torch.manual_seed(shardkit.sample_seed(seed, 2, first + k * step))
        crops.add(got[k], transform(full[i][0]))
    views = [shardkit.View(tuple(size), tuple(scale), tuple(ratio), flip)
             for size, scale, ratio, flip in cfg["views"]]
    transforms = view_transforms(cfg["views"])
    vfull = ShardDataset(cfg["views_store"])
    vds = ShardDataset(cfg["views_store"], views=views)
    n = len(vds)
    torch.manual_seed(seed)  # the loader's seed: torch.initial_seed()
    images = [torch.cat(v) for v in zip(*[b[0] for b in vds.loader(
        batch_size=batch, sampler=range(n))])]
    each = Tally()
    for k in range(n):
        torch.manual_seed(shardkit.sample_seed(seed, 0, k))
        for v, t in enumerate(transforms):
            each.add(images[v][k], t(vfull[k][0]))
    for d in (full, ds, vfull, vds):
        d.close()
    return {"crops": crops.result(), "views": each.result()}


def check_eval(cfg: dict) -> dict:
    """``crop_mode="center"`` on a store packed at 256 against ``Resize(256) + CenterCrop(224)``
    on the PIL-decoded source (what an ImageFolder evaluation pipeline computes), with
    torchvision's default (bilinear) and with bicubic interpolation (the packer's filter)."""
    ds = ShardDataset(cfg["store"], crop=224, crop_mode="center")
    out = {}
    for name, mode in (("bilinear", v2.InterpolationMode.BILINEAR),
                       ("bicubic", v2.InterpolationMode.BICUBIC)):
        transform = v2.Compose([v2.Resize(256, interpolation=mode, antialias=True),
                                v2.CenterCrop(224)])
        per_image, worst, diffs = [], 0, []
        for i in cfg["indices"]:
            with Image.open(os.path.join(cfg["source"], ds.source_path(i))) as im:
                ref = torch.from_numpy(np.array(transform(im.convert("RGB")))).permute(2, 0, 1)
            d = (ds[i][0].int() - ref.int()).abs()
            per_image.append(float(d.float().mean()))
            worst = max(worst, int(d.max()))
            diffs.append(d.flatten())
        every = torch.cat(diffs).float()
        out[name] = {"images": len(per_image), "mean_abs": float(every.mean()),
                     "max_image_mean_abs": max(per_image),
                     "p99_abs": float(every.quantile(0.99)), "max_abs": worst}
    ds.close()
    return out


def check_normalize(cfg: dict) -> dict:
    """``normalize`` against ``images.float().div_(255)`` then ``v2.Normalize``."""
    torch.manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    mean, std = cfg["mean"], cfg["std"]
    ref = v2.Normalize(mean, std)(images.float().div_(255))
    got = normalize(images, mean, std)
    return {"equal": bool(torch.equal(got, ref)), "dtype": str(got.dtype)}


def main(argv: list[str]) -> None:
    cfg = json.loads(argv[0])
    checks = {"recipe": check_recipe, "loader": check_loader, "eval": check_eval,
              "normalize": check_normalize, "views": check_views, "stream": check_stream}
    result = {name: checks[c["check"]](c) for name, c in cfg.items()}
    import torchvision

    result["versions"] = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                          "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
