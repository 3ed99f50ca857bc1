"""Lightning with ``use_distributed_sampler=False`` (what docs/scale-and-ddp.md says): the
loader's ShardSampler / MixSampler is used as given and Lightning calls its ``set_epoch`` each
epoch, so every epoch trains exactly the sampler's order for that epoch."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import shardkit
from helpers.tensors import tensor_shards as _part  # a part made of shards

pl = pytest.importorskip("lightning.pytorch")


class _Recorder(pl.LightningModule):
    def __init__(self, loader: DataLoader) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.loader = loader
        self.seen: dict[int, list[int]] = {}

    def train_dataloader(self) -> DataLoader:
        return self.loader

    def training_step(self, batch, batch_idx):
        (values,) = batch
        self.seen.setdefault(self.current_epoch, []).extend(values.tolist())
        return (self.weight * values.float()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize("kind", ["shard", "mix"])
def test_lightning_uses_the_sampler_as_given_and_sets_its_epoch(kind, tmp_path):
    if kind == "shard":
        ds = _part([7, 5, 9, 3], 0)
        sampler = shardkit.ShardSampler(ds, 1, 0, seed=5)
        reference = shardkit.ShardSampler(ds, 1, 0, seed=5)
    else:
        ds = shardkit.Mix([_part([6, 6], 0), _part([10, 10], 12)])
        kw = dict(proportion=[0.5, 0.5], epoch_size=30, num_replicas=1, rank=0, seed=5)
        sampler, reference = shardkit.MixSampler(ds, **kw), shardkit.MixSampler(ds, **kw)
    model = _Recorder(DataLoader(ds, batch_size=4, sampler=sampler))
    trainer = pl.Trainer(max_epochs=3, use_distributed_sampler=False, accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path))
    trainer.fit(model)
    assert trainer.train_dataloader.sampler is sampler  # not wrapped, not replaced
    for epoch in range(3):
        reference.set_epoch(epoch)
        assert model.seen[epoch] == list(reference), epoch
    assert model.seen[0] != model.seen[1]  # set_epoch was called: epochs differ
