#!/usr/bin/env python
"""A tiny text-to-image-style training loop over aspect-ratio buckets (SDXL's recipe, in small).

The store is packed with buckets (``shardkit pack photos/ train.lmdb --buckets 1024 --captions``):
every record is stored at its bucket's size. ``BucketSampler`` batches within a bucket, so a batch
is one stacked ``[B, 3, H, W]`` uint8 tensor of that bucket's size, and every sample comes once an
epoch (over all ranks, resumable mid-epoch). Each record also carries SDXL's micro-conditioning
(``original_size``, ``crop_top_left``, ``target_size``) and its caption.

The model is a toy denoiser: a noisy image, the noise level, a hashed bag-of-words embedding of
the caption and the six micro-conditioning numbers go in; the noise comes out (the diffusion
objective, MSE). Fully convolutional, so every bucket's size fits.

    python examples/train_buckets.py train.lmdb --batch-size 16 --workers 4 --steps 1000
    python examples/train_buckets.py train.lmdb --batch-size 4 --steps 3        # CPU, tiny

Under ``torchrun`` the sampler takes the world and rank from ``torch.distributed`` (wrap the
model in ``DistributedDataParallel``: every rank gets the same number of batches).
Prints one JSON line per step: ``{"step", "epoch", "loss", "shape", "caption", "original_size",
"crop_top_left", "target_size"}`` (the batch's conditioning, one entry per sample).
"""

from __future__ import annotations

import argparse
import json
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

import shardkit

FIELDS = ["caption", "original_size", "crop_top_left", "target_size"]
VOCAB, WIDTH = 4096, 32


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def tokens(captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Hashed words of each caption, as ``EmbeddingBag``'s (ids, offsets)."""
    ids, offsets = [], []
    for caption in captions:
        offsets.append(len(ids))
        ids.extend(zlib.crc32(w.encode()) % VOCAB for w in caption.lower().split() or [""])
    return torch.tensor(ids), torch.tensor(offsets)


class Denoiser(nn.Module):
    """Predicts the noise in ``x`` from it, the noise level, the caption and the
    micro-conditioning (added to the features as a per-channel bias, as SDXL adds its
    conditioning to the timestep embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.text = nn.EmbeddingBag(VOCAB, WIDTH)
        self.cond = nn.Linear(1 + 6, WIDTH)
        self.inp = nn.Conv2d(3, WIDTH, 3, padding=1)
        self.mid = nn.Conv2d(WIDTH, WIDTH, 3, padding=1)
        self.out = nn.Conv2d(WIDTH, 3, 3, padding=1)

    def forward(self, x, level, ids, offsets, micro):
        bias = self.text(ids, offsets) + self.cond(torch.cat([level[:, None], micro], 1))
        h = F.silu(self.inp(x) + bias[:, :, None, None])
        return self.out(F.silu(self.mid(h)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("store", help="a store packed with --buckets and --captions")
    parser.add_argument("--batch-size", type=positive, default=8)
    parser.add_argument("--steps", type=positive, default=100)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    ds = shardkit.ShardDataset(args.store, fields=FIELDS)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    world = {} if distributed else dict(num_replicas=1, rank=0)
    sampler = shardkit.BucketSampler(ds, args.batch_size, seed=args.seed, **world)
    loader = ds.loader(batch_sampler=sampler, num_workers=args.workers)
    model = Denoiser()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for images, target in loader:
            x0 = images.float() / 127.5 - 1  # one bucket: [B, 3, H, W]
            level = torch.rand(len(x0))
            noise = torch.randn_like(x0)
            a = level[:, None, None, None]
            noisy = (1 - a).sqrt() * x0 + a.sqrt() * noise
            micro = torch.cat([target["original_size"], target["crop_top_left"],
                               target["target_size"]], 1).float() / 1024
            loss = F.mse_loss(model(noisy, level, *tokens(target["caption"]), micro), noise)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(json.dumps({"step": step, "epoch": epoch, "loss": round(loss.item(), 5),
                              "shape": list(images.shape), "caption": list(target["caption"]),
                              **{name: target[name].tolist() for name in FIELDS[1:]}}),
                  flush=True)
            step += 1
            if step == args.steps:
                break
        epoch += 1


if __name__ == "__main__":
    main()
