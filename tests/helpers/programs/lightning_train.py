"""Train a tiny model with Lightning from a shardkit store: 2 CPU ranks (``strategy="ddp"``, gloo).

    python -m helpers.programs.lightning_train STORE LOG CKPT_DIR [--max-steps N] [--resume CKPT]
        [--loader datamodule|plain] [--normalize-in-step]

Every image of the store is its own class, so the labels a step receives name its samples; each
rank appends ``{"epoch", "step", "labels"}`` per training step to ``LOG.rankN``. Checkpoints are
written every 2 steps to CKPT_DIR (``step=N.ckpt``); with the datamodule, each epoch's validation
labels go to ``LOG.val.rankN``. Lightning's defaults otherwise (``use_distributed_sampler=True``).
"""

from __future__ import annotations

import argparse
import json
import warnings

import lightning.pytorch as pl
import torch
from torch import nn

import shardkit
from shardkit.lightning import ShardDataModule

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Tiny(pl.LightningModule):
    def __init__(self, classes: int, log: str, normalize_in_step: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, classes))
        self.log_path = log
        self.normalize_in_step = normalize_in_step

    def training_step(self, batch, batch_idx):
        images, labels = batch
        if self.normalize_in_step:  # uint8 channels-last batches, normalised as they are
            images = shardkit.normalize(images, MEAN, STD)
        with open(f"{self.log_path}.rank{self.global_rank}", "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "step": self.global_step,
                                "labels": labels.tolist(), "dtype": str(images.dtype),
                                "contiguous": images.is_contiguous()}) + "\n")
        return nn.functional.cross_entropy(self.net(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        with open(f"{self.log_path}.val.rank{self.global_rank}", "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "labels": labels.tolist(),
                                "dtype": str(images.dtype)}) + "\n")
        return nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("log")
    p.add_argument("ckpt_dir")
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--resume", default=None)
    p.add_argument("--loader", choices=("datamodule", "plain"), default="datamodule")
    p.add_argument("--normalize-in-step", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    options = dict(crop=32, crop_mode="random_resized", flip=0.5)
    normalize = None if args.normalize_in_step else (MEAN, STD)
    dm = ShardDataModule(args.store, args.store, batch_size=4, val_batch_size=5, num_workers=1,
                         seed=3, normalize=normalize, train_options=options,
                         val_options=dict(crop=32))
    model = Tiny(len(dm.train_set.classes), args.log, args.normalize_in_step)
    if args.loader == "plain":  # ds.loader as a user writes it, Lightning splits it for the ranks
        ds = dm.train_set
        model.train_dataloader = lambda: ds.loader(batch_size=4, shuffle=True, num_workers=1,
                                                   normalize=(MEAN, STD))
        dm = None
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, filename="{step}",
                                               every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2,
                         max_steps=args.max_steps, callbacks=[checkpoints], logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
