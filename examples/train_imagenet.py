#!/usr/bin/env python
"""Train an ImageNet classifier from shardkit stores: pytorch/examples' imagenet main.py, ported.

    shardkit pack /data/imagenet/train train-shards --shard-size 1GiB
    shardkit pack /data/imagenet val-shards --file-list val.csv --num-shards 8
    torchrun --nproc-per-node 8 examples/train_imagenet.py train-shards val-shards --arch resnet50

One process per GPU (``torchrun``; NCCL on GPUs, gloo on CPUs; a plain ``python`` run is one
process). Training images get torchvision's ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``
at decode time, evaluation images ``Resize(256) + CenterCrop(224)`` (a store packed at 256, centre
crop at decode); both arrive as uint8 and are normalised on the GPU. With CUDA: AMP (float16 with
gradient scaling) and channels_last. ``shardkit.ShardSampler`` gives each rank a few whole shards.

Checkpoints (``--checkpoint``, every ``--checkpoint-every`` steps and after each epoch) hold the
model, optimizer, learning-rate schedule, gradient scaler and the sampler's position; ``--resume``
continues mid-epoch at exactly the next sample (the augmentation's random draws differ from the
interrupted run's: DataLoader workers get fresh seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import shardkit
from shardkit import normalize

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("train", help="training store (file or shard folder)")
    p.add_argument("val", help="validation store, packed at 256")
    p.add_argument("--arch", default="resnet18",
                   help="a torchvision.models name, or 'tiny' (a small CNN for CPU test runs)")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=256, help="per process")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--workers", type=int, default=8, help="DataLoader workers per process")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="checkpoint.pt")
    p.add_argument("--checkpoint-every", type=int, default=1000, help="steps")
    p.add_argument("--resume", default="", help="checkpoint to continue from")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: all)")
    p.add_argument("--print-freq", type=int, default=100)
    p.add_argument("--log-file", default="",
                   help="write JSON lines per step and evaluation to LOG_FILE.rankN")
    return p.parse_args(argv)


def make_model(arch: str, num_classes: int) -> nn.Module:
    if arch == "tiny":
        return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16),
                             nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(16, num_classes))
    import torchvision

    return torchvision.models.get_model(arch, num_classes=num_classes)


def loader(ds: shardkit.ShardDataset, sampler, args: argparse.Namespace, cuda: bool) -> DataLoader:
    return DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                      worker_init_fn=shardkit.worker_init_fn, collate_fn=shardkit.collate,
                      persistent_workers=args.workers > 0, pin_memory=cuda)


def to_device(images: torch.Tensor, labels: torch.Tensor, device: torch.device):
    # uint8 crosses to the GPU (4x less than float32), then becomes normalised floats there;
    # shardkit's batches are laid out channels-last already.
    images = normalize(images.to(device, non_blocking=True), MEAN, STD)
    labels = labels.to(device, non_blocking=True)
    return images.contiguous(memory_format=torch.channels_last), labels


def evaluate(model: nn.Module, val_loader: DataLoader, device: torch.device,
             distributed: bool) -> tuple[float, float, int]:
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # top-1, top-5, images
    with torch.no_grad(), torch.autocast(device.type, torch.float16, enabled=device.type == "cuda"):
        for images, labels in val_loader:
            images, labels = to_device(images, labels, device)
            output = model(images)
            top = output.topk(min(5, output.shape[1]), dim=1).indices
            totals[0] += (top[:, 0] == labels).sum()
            totals[1] += (top == labels[:, None]).any(dim=1).sum()
            totals[2] += len(labels)
    if distributed:
        dist.all_reduce(totals)
    model.train()
    top1, top5, count = totals.tolist()
    return 100 * top1 / max(count, 1), 100 * top5 / max(count, 1), int(count)


def save(path: str, state: dict) -> None:
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a checkpoint is whole or absent, even if the run is killed


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    distributed = "RANK" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True

    train_ds = shardkit.ShardDataset(args.train, crop=args.crop, crop_mode="random_resized",
                                     flip=0.5)
    val_ds = shardkit.ShardDataset(args.val, crop=args.crop, crop_mode="center")
    sampler = shardkit.ShardSampler(train_ds, num_replicas=world, rank=rank, seed=args.seed)
    n = len(val_ds)  # each rank evaluates its own contiguous part, no sample twice
    train_loader = loader(train_ds, sampler, args, cuda)
    val_loader = loader(val_ds, range(rank * n // world, (rank + 1) * n // world), args, cuda)

    torch.manual_seed(args.seed)
    model = make_model(args.arch, len(train_ds.classes)).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    if distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    scaler = torch.amp.GradScaler(device.type, enabled=cuda)
    bare = model.module if distributed else model

    start_epoch, step = 0, 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location="cpu", weights_only=True)
        bare.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        sampler.load_state_dict(ckpt["sampler"])  # epoch and samples consumed
        start_epoch, step = ckpt["epoch"], ckpt["step"]

    def checkpoint(epoch: int) -> None:
        if rank == 0:
            save(args.checkpoint, {"epoch": epoch, "step": step, "model": bare.state_dict(),
                                   "optimizer": optimizer.state_dict(),
                                   "scheduler": scheduler.state_dict(),
                                   "scaler": scaler.state_dict(), "sampler": sampler.state_dict()})

    log = open(f"{args.log_file}.rank{rank}", "a") if args.log_file else None
    stop = False
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # a resumed epoch keeps its position
        tick, seen = time.perf_counter(), 0
        for images, labels in train_loader:
            if log:
                log.write(json.dumps({"epoch": epoch, "step": step,
                                      "labels": labels.tolist()}) + "\n")
            images, labels = to_device(images, labels, device)
            with torch.autocast(device.type, torch.float16, enabled=cuda):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            sampler.consumed += len(labels)  # what the loop used, not what was prefetched
            step += 1
            seen += len(labels)
            if rank == 0 and step % args.print_freq == 0:
                rate = seen * world / (time.perf_counter() - tick)
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} {rate:.0f} images/s",
                      flush=True)
            if step % args.checkpoint_every == 0:
                checkpoint(epoch)
            stop = step == args.max_steps
            if stop:
                break
        if stop:
            break
        scheduler.step()
        top1, top5, count = evaluate(model, val_loader, device, distributed)
        if rank == 0:
            print(f"epoch {epoch} val top-1 {top1:.2f} top-5 {top5:.2f} ({count} images)",
                  flush=True)
            if log:
                log.write(json.dumps({"epoch": epoch, "top1": top1, "top5": top5,
                                      "count": count}) + "\n")
        sampler.set_epoch(epoch + 1)  # the checkpoint resumes at the next epoch's start
        checkpoint(epoch + 1)
    if log:
        log.close()
    if distributed:
        # No barrier before this: on CPU (gloo) a barrier holds on to a collective still in
        # flight, such as the evaluation's all_reduce, and releases it only as the process
        # exits; releasing a tensor made in Python then needs the interpreter, and torch 2.13
        # can abort the rank ("terminate called without an active exception").
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
