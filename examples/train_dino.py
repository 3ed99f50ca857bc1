#!/usr/bin/env python
"""A small DINO-style self-supervised loop (student/teacher, multi-crop) fed by shardkit views.

Each sample comes as ``2`` global views and ``--locals`` local views, all cut from one decode of
its record with DINO's own augmentation (``ShardDataset(path, recipe=shardkit.recipes.dino(...))``:
``DataAugmentationDINO``'s crops, flips, colour jitter, grayscale, blur, solarisation and
normalisation, as torchvision v2's kernels on uint8 batches; main_dino.py's defaults: 2 x 224 at
scale (0.4, 1), 8 x 96 at (0.05, 0.4)). The student sees every view,
the teacher (an exponential moving average of the student) the global ones; the loss is DINO's
cross-entropy between the teacher's centred, sharpened output and the student's, over pairs of
different views. The views arrive normalised, as float batches made in the DataLoader workers
(the recipe ends with ``Normalize``): normalising ten views an image in the loop would cost the
training process more CPU than reading them.

    python examples/train_dino.py STORE --steps 100 --workers 4
    python examples/train_dino.py STORE --global-size 64 --local-size 32 --steps 3  # CPU, tiny

Prints one JSON line per step: ``{"step", "loss", "views": [[B, 3, H, W], ...], "dtype",
"teacher_views", "pairs"}`` (the views the teacher saw, the (teacher, student) pairs in the
loss).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardkit import ShardDataset
from shardkit.recipes import dino



def backbone_and_head(out_dim: int) -> nn.Module:
    """Any size of input: a small conv net, global pooling, DINO's projection head."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, out_dim))


class DINOLoss(nn.Module):
    def __init__(self, out_dim: int, student_temp: float = 0.1, teacher_temp: float = 0.04,
                 center_momentum: float = 0.9) -> None:
        super().__init__()
        self.student_temp, self.teacher_temp = student_temp, teacher_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(self, student: list[torch.Tensor], teacher: list[torch.Tensor]) -> torch.Tensor:
        targets = [F.softmax((t - self.center) / self.teacher_temp, dim=-1).detach()
                   for t in teacher]
        total, pairs = 0.0, 0
        for i, target in enumerate(targets):
            for j, s in enumerate(student):
                if i == j:  # the same view
                    continue
                total = total + torch.sum(-target * F.log_softmax(s / self.student_temp, dim=-1),
                                          dim=-1).mean()
                pairs += 1
        with torch.no_grad():
            batch_center = torch.cat(teacher).mean(dim=0, keepdim=True)
            self.center.mul_(self.center_momentum).add_(batch_center,
                                                        alpha=1 - self.center_momentum)
        self.pairs = pairs  # reported by the loop
        return total / pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("store", help="a shardkit store (file, folder or URL)")
    parser.add_argument("--global-size", type=int, default=224,
                        help="side of the 2 global views")
    parser.add_argument("--local-size", type=int, default=96, help="side of the local views")
    parser.add_argument("--locals", type=int, default=8, help="local views per sample")
    parser.add_argument("--global-scale", type=float, nargs=2, default=(0.4, 1.0),
                        help="global crops' scale (min, max)")
    parser.add_argument("--local-scale", type=float, nargs=2, default=(0.05, 0.4),
                        help="local crops' scale (min, max)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--lr", type=float, default=1e-3, help="student learning rate")
    parser.add_argument("--momentum", type=float, default=0.996, help="teacher EMA")
    parser.add_argument("--out-dim", type=int, default=128, help="projection head size")
    parser.add_argument("--seed", type=int, default=0, help="torch seed (model, loader)")
    args = parser.parse_args(argv)
    for name in ("global_size", "local_size", "batch_size", "steps", "out_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.locals < 0 or args.workers < 0:
        parser.error("--locals and --workers must be >= 0")
    torch.manual_seed(args.seed)

    recipe = dino(tuple(args.global_scale), tuple(args.local_scale), args.locals,
                  global_size=args.global_size, local_size=args.local_size)
    dataset = ShardDataset(args.store, recipe=recipe)
    loader = dataset.loader(batch_size=args.batch_size, shuffle=True, drop_last=True,
                            num_workers=args.workers,
                            generator=torch.Generator().manual_seed(args.seed))
    student = backbone_and_head(args.out_dim)
    teacher = copy.deepcopy(student).requires_grad_(False)
    criterion = DINOLoss(args.out_dim)
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr)

    step = 0
    while step < args.steps:
        for crops, _labels in loader:  # a list of normalised float batches, one per view
            student_out = [student(c) for c in crops]
            with torch.no_grad():
                teacher_out = [teacher(c) for c in crops[:2]]
            loss = criterion(student_out, teacher_out)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():  # the teacher follows the student
                for t, s in zip(teacher.parameters(), student.parameters()):
                    t.mul_(args.momentum).add_(s.detach(), alpha=1 - args.momentum)
            print(json.dumps({"step": step, "loss": round(loss.item(), 5),
                              "views": [list(b.shape) for b in crops],
                              "dtype": str(crops[0].dtype), "teacher_views": len(teacher_out),
                              "pairs": criterion.pairs}), flush=True)
            step += 1
            if step >= args.steps:
                break
    dataset.close()


if __name__ == "__main__":
    main()
