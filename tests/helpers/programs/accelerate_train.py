"""Train a tiny conditioned denoiser the way diffusers' SDXL script does, under accelerate, from a
bucketed shardkit store: ``torchrun --standalone --nproc_per_node 2 -m
helpers.programs.accelerate_train STORE LOG [--save-at N --ckpt DIR] [--resume DIR]``.

The script's data path, in shardkit's terms: a ``BucketSampler`` per process, ``ds.loader(...,
engine="threads")``, ``shardkit.accelerate.prepare`` in place of ``accelerator.prepare``, SDXL's
``add_time_ids`` made per sample from ``original_size + crop_top_left + target_size``,
``accelerator.accumulate``, ``save_state`` from the main process alone every so often (as the
script does) and ``load_state`` then ``first_epoch = global_step // updates_per_epoch``.
Each process appends ``{"epoch", "step", "ids", "sync", ...}`` per batch to ``LOG.rankN`` (``ids``:
the records' numbers, from their captions); with ``--refusals`` it first records what
``accelerator.prepare`` and ``shardkit.accelerate.prepare`` say to the patterns that cannot work
(``LOG.refusals.rankN``).
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from helpers import end_rank
from torch import nn

import shardkit
import shardkit.accelerate

FIELDS = ["caption", "original_size", "crop_top_left", "target_size"]
BATCH, EPOCHS, ACCUMULATE = 4, 2, 2


class Denoiser(nn.Module):
    """Predicts the noise from the noisy image and SDXL's six time ids."""

    def __init__(self) -> None:
        super().__init__()
        self.cond = nn.Linear(6, 8)
        self.inp = nn.Conv2d(3, 8, 3, padding=1)
        self.out = nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x: torch.Tensor, time_ids: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.inp(x) + self.cond(time_ids / 64)[:, :, None, None])
        return self.out(h)


def refusals(accelerator: Accelerator, ds: shardkit.ShardDataset, loader) -> list[str]:
    said = []
    flipped = shardkit.ShardDataset(ds.root, fields=FIELDS, flip=0.5)  # draws: seeds must agree
    plain = torch.utils.data.DataLoader(ds, batch_sampler=shardkit.BucketSampler(
        ds, BATCH, num_replicas=accelerator.num_processes, rank=accelerator.process_index),
        collate_fn=shardkit.collate)
    for attempt in (lambda: accelerator.prepare(loader),
                    lambda: next(iter(accelerator.prepare(plain))),
                    lambda: shardkit.accelerate.prepare(accelerator, ds.loader(batch_size=BATCH,
                                                                               shuffle=True)),
                    lambda: shardkit.accelerate.prepare(accelerator, flipped.loader(
                        batch_sampler=shardkit.BucketSampler(
                            flipped, BATCH, num_replicas=accelerator.num_processes,
                            rank=accelerator.process_index),
                        generator=torch.Generator().manual_seed(accelerator.process_index)))):
        try:
            attempt()
            said.append("accepted")
        except shardkit.OptionError as exc:
            said.append(str(exc))
    return said


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("log")
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--ckpt", default="")
    p.add_argument("--resume", default="")
    p.add_argument("--refusals", action="store_true")
    args = p.parse_args()

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    rank = accelerator.process_index
    set_seed(0)
    # Each process its own default seed, as in a script without set_seed: the loader draws
    # nothing random (no crop, no flip), so its seed decides nothing and prepare accepts it.
    torch.manual_seed(1000 + accelerator.process_index)
    ds = shardkit.ShardDataset(args.store, fields=FIELDS)
    sampler = shardkit.BucketSampler(ds, BATCH, seed=0, num_replicas=accelerator.num_processes,
                                     rank=rank)
    train_dataloader = ds.loader(batch_sampler=sampler, engine="threads", num_threads=2)
    model = Denoiser()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if args.refusals:
        with open(f"{args.log}.refusals.rank{rank}", "w") as f:
            json.dump(refusals(accelerator, ds, train_dataloader), f)

    model, optimizer, train_dataloader, lr_scheduler = shardkit.accelerate.prepare(
        accelerator, model, optimizer, train_dataloader, lr_scheduler)
    updates_per_epoch = math.ceil(len(train_dataloader) / ACCUMULATE)
    global_step = first_epoch = 0
    if args.resume:
        accelerator.load_state(args.resume)
        global_step = int(os.path.basename(args.resume).split("-")[1])
        first_epoch = global_step // updates_per_epoch

    log = open(f"{args.log}.rank{rank}", "a")
    for epoch in range(first_epoch, EPOCHS):
        for step, (images, target) in enumerate(train_dataloader):
            with accelerator.accumulate(model):
                model_input = images.float() / 127.5 - 1
                time_ids = torch.cat([
                    torch.tensor([list(s) + list(c) + list(t)], device=accelerator.device,
                                 dtype=torch.float32)
                    for s, c, t in zip(target["original_size"].tolist(),
                                       target["crop_top_left"].tolist(),
                                       target["target_size"].tolist())])
                noise = torch.randn_like(model_input)
                loss = F.mse_loss(model(model_input + noise, time_ids), noise)
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            log.write(json.dumps({
                "epoch": epoch, "step": step, "sync": accelerator.sync_gradients,
                "ids": [int(c.split()[1]) for c in target["caption"]],
                "sizes_match": all(list(t) == list(images.shape[2:])
                                   for t in target["target_size"].tolist()),
                "time_ids": time_ids.shape[1], "device": str(images.device),
                "loader": type(train_dataloader.loader).__name__}) + "\n")
            log.flush()
            if accelerator.sync_gradients:
                global_step += 1
                if accelerator.is_main_process and global_step == args.save_at:
                    accelerator.save_state(os.path.join(args.ckpt, f"checkpoint-{global_step}"))
    log.close()
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
    end_rank()  # see there: gloo's threads and the interpreter's exit
