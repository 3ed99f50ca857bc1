"""``shardkit bench --recommend``: paste-able DataLoader code for the settings measured fastest."""

from __future__ import annotations

import argparse

from .read import Run
from .report import best
from .systems import BATCH, CROP, RECIPE_SYSTEMS, store_of


TIE = 0.03  # --recommend: settings within 3 % of the best count as equally fast


def recommend(runs: list[Run], args: argparse.Namespace, work: str) -> str:
    """Paste-able DataLoader code: for the fastest setting with the fewest workers of the first
    store measured, and for the fastest way measured to run the training recipe."""
    parts = [_recommend_store(runs, args), _recommend_recipe(runs, args)]
    return "\n\n".join(p for p in parts if p)


def _loader_code(workers: int, threads: int, prefetch: int) -> list[str]:
    if threads:
        return [f"loader = DataLoader(dataset, batch_size={BATCH}, shuffle=True, num_workers=0,",
                "                    collate_fn=collate, pin_memory=torch.cuda.is_available())",
                "# decode threads run in the main process: if your training step needs the "
                "CPU, use worker processes instead"]
    lines = [f"loader = DataLoader(dataset, batch_size={BATCH}, shuffle=True, "
             f"num_workers={workers},"]
    if workers > 0:
        lines += [f"                    prefetch_factor={prefetch}, "
                  "persistent_workers=True, worker_init_fn=worker_init_fn,"]
    return lines + ["                    collate_fn=collate, pin_memory=torch.cuda.is_available())"]


def _recommend_store(runs: list[Run], args: argparse.Namespace) -> str:
    stores = [s.split("/")[0] for s in args.systems if store_of(s) and s not in RECIPE_SYSTEMS]
    if not stores:
        return "--recommend: no ShardDataset system was measured"
    store = stores[0]
    mine = [r for r in runs if r.system.split("/")[0] == store]
    best = max(r.images_per_s for r in mine)
    good = [r for r in mine if r.images_per_s >= (1 - TIE) * best]
    # Fewest processes first (threads run in the main process), then fewest threads.
    pick = min(good, key=lambda r: (r.num_workers, r.threads, -r.images_per_s))
    fast = "" if args.exact_decode else ", fast_decode=True"
    lines = [f"# shardkit bench --recommend: {store}, fastest within {TIE:.0%} with the fewest "
             f"workers: {pick.setting}, {pick.images_per_s:.0f} images/s "
             f"(best measured {best:.0f})",
             "import torch",
             "from torch.utils.data import DataLoader",
             "from shardkit import ShardDataset, collate, worker_init_fn",
             "",
             f"dataset = ShardDataset(\"YOUR_STORE\", crop={CROP}, crop_mode=\"random\"{fast}"
             + (f", threads={pick.threads})" if pick.mode == "threads" else ")")]
    return "\n".join(lines + _loader_code(pick.num_workers, pick.threads, args.prefetch))


def _recommend_recipe(runs: list[Run], args: argparse.Namespace) -> str | None:
    """The training recipe: at decode when that measured fastest, else what was faster."""
    measured = [b for b in (best(runs, s) for s in ("recipe-decode", "recipe-transform",
                                                    "recipe-imagefolder")) if b]
    if not any(r.system != "recipe-imagefolder" for r in measured):
        return None
    pick = max(measured, key=lambda r: r.images_per_s)
    others = ", ".join(f"{r.system} {r.images_per_s:.0f}" for r in measured if r is not pick)
    lines = [f"# shardkit bench --recommend: training, RandomResizedCrop({CROP}) + "
             f"RandomHorizontalFlip(): fastest measured {pick.system} {pick.setting}, "
             f"{pick.images_per_s:.0f} images/s" + (f" ({others})" if others else "")]
    if pick.system == "recipe-imagefolder":
        return "\n".join(lines + ["# ImageFolder was the fastest here: keep it"])
    fast = "" if args.exact_decode else ", fast_decode=True"
    lines += ["import torch", "from torch.utils.data import DataLoader",
              "from shardkit import ShardDataset, collate, normalize, worker_init_fn"]
    if pick.system == "recipe-decode":
        lines += ["", f"dataset = ShardDataset(\"YOUR_STORE\", crop={CROP}, "
                      f"crop_mode=\"random_resized\", flip=0.5{fast})"]
    else:
        lines += ["from torchvision.transforms import v2", "",
                  f"recipe = v2.Compose([v2.RandomResizedCrop({CROP}, antialias=True), "
                  "v2.RandomHorizontalFlip()])",
                  f"dataset = ShardDataset(\"YOUR_STORE\", transform=recipe{fast})"]
    return "\n".join(lines + _loader_code(pick.num_workers, 0, args.prefetch) + [
        "# per batch, on the GPU: images = normalize(images.cuda(non_blocking=True), mean, std)"])
