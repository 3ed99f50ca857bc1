"""Run under torchrun (gloo): train a tiny DDP model one epoch over a bucketed store with a
``BucketSampler`` (world and rank from torch.distributed).

Usage: torchrun --standalone --nproc_per_node N -m helpers.programs.bucket_ddp STORE OUT

Every rank takes the same number of steps (else DDP's all-reduce would hang); each rank writes
its batches (indices, image shapes) to OUT.RANK (JSON; ``helpers.rank_outputs`` reads them).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import shardkit
from helpers import end_rank


def main(store: str, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        ds = shardkit.ShardDataset(store)
        sampler = shardkit.BucketSampler(ds, 4, seed=1)
        sampler.set_epoch(0)
        expect = list(sampler)
        model = DistributedDataParallel(torch.nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        seen = []
        for images, _ in ds.loader(batch_sampler=sampler):
            loss = model(images.float().mean((2, 3)) / 255).mean()
            opt.zero_grad()
            loss.backward()  # an all-reduce: every rank must take this step
            opt.step()
            seen.append(list(images.shape))
        # Each rank its own file, no all_gather_object: see helpers.rank_outputs.
        with open(f"{out}.{dist.get_rank()}", "w") as f:
            json.dump({"rank": dist.get_rank(), "batches": expect, "shapes": seen}, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
    end_rank()  # see there: gloo's threads and the interpreter's exit
