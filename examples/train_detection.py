"""Train a torchvision detection model from a COCO-packed shardkit store.

    shardkit pack images/ coco.lmdb --coco annotations/instances_train.json
    python examples/train_detection.py coco.lmdb --steps 100 --batch-size 8 --workers 4

The store gives ``(image, target)`` with ``target`` as torchvision's wrapped ``CocoDetection``
does (``boxes`` as ``BoundingBoxes``, ``labels`` the COCO category ids, ``masks``), cropped and
flipped at decode with the boxes moved exactly as torchvision v2 would, and boxes that the crop
made degenerate dropped as ``v2.SanitizeBoundingBoxes`` does. The model is built with
``weights=None, weights_backbone=None``: nothing is downloaded. Prints one JSON line per step.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torchvision

import shardkit
from shardkit.read.targets import split_targets

MODELS = {
    "fasterrcnn_mobilenet_v3_large_fpn": torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn,
    "ssdlite320_mobilenet_v3_large": torchvision.models.detection.ssdlite320_mobilenet_v3_large,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="a store packed with --coco")
    p.add_argument("--model", choices=sorted(MODELS), default="fasterrcnn_mobilenet_v3_large_fpn")
    p.add_argument("--crop", type=int, default=320, help="decode-time RandomResizedCrop size")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    dataset = shardkit.ShardDataset(args.store, fields=["boxes", "labels"], crop=args.crop,
                                    crop_mode="random_resized", scale=(0.3, 1.0), flip=0.5,
                                    sanitize=True)
    categories = dataset.store.meta["annotations"]["categories"]
    num_classes = max(c["id"] for c in categories) + 1  # labels are the raw category ids
    # Faster R-CNN resizes its input to min_size (800 by default): keep the decode crop's size.
    sizes = {"min_size": args.crop, "max_size": args.crop} if args.model.startswith("faster") else {}
    model = MODELS[args.model](weights=None, weights_backbone=None, num_classes=num_classes,
                               **sizes)
    model.to(args.device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loader = dataset.loader(batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                            drop_last=True)
    step = 0
    while step < args.steps:
        for images, targets in loader:
            t0 = time.perf_counter()
            images = list(images.to(args.device, non_blocking=True).float().div_(255))
            targets = [{k: v.to(args.device) for k, v in t.items()}
                       for t in split_targets(targets, len(images))]
            losses = model(images, targets)
            loss = sum(losses.values())
            if not torch.isfinite(loss):
                raise SystemExit(f"step {step}: loss is {loss.item()}")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(json.dumps({"step": step, "loss": round(loss.item(), 5),
                              "boxes": sum(len(t["boxes"]) for t in targets),
                              "seconds": round(time.perf_counter() - t0, 3)}), flush=True)
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
