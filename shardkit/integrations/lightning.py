"""``ShardDataModule``: a Lightning DataModule over shardkit stores (``shardkit.lightning``).

    import lightning.pytorch as pl
    from shardkit.lightning import ShardDataModule

    dm = ShardDataModule("train-shards", "val.lmdb", batch_size=256, num_workers=8,
                         train_options=dict(crop=224, crop_mode="random_resized", flip=0.5),
                         val_options=dict(crop=224), normalize=((0.485, 0.456, 0.406),
                                                                (0.229, 0.224, 0.225)))
    pl.Trainer(strategy="ddp", devices=8).fit(model, dm)       # ckpt_path=... resumes exactly

Each rank's training loader draws from a ``ShardSampler`` (a ``DistributedSampler``, so
Lightning's default ``use_distributed_sampler=True`` leaves it as it is: every epoch trains every
sample once across the ranks) and is a ``ShardLoader``, whose ``state_dict`` Lightning saves in
its checkpoints: ``fit(ckpt_path=...)`` continues mid-epoch at exactly the next batch. With
``normalize``, batches reach ``training_step`` as normalised float, contiguous NCHW, converted on
the device after Lightning moved the uint8 batch there (``on_after_batch_transfer``).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the standalone package
    try:
        import pytorch_lightning as pl
    except ImportError:
        raise ImportError("shardkit.lightning needs Lightning: pip install lightning") from None

from ..errors import OptionError
from ..read.dataset import ShardDataset
from ..read.loading.engines import check_engine
from ..read.loading.output import BatchOutput
from ..read.sampler import ShardSampler


def _dataset(source: Any, options: dict[str, Any] | None, name: str) -> ShardDataset | None:
    if source is None or isinstance(source, ShardDataset):
        if source is not None and options:
            raise OptionError(f"{name}_options apply to a path; {name} is a ShardDataset already")
        return source
    if isinstance(source, (str, os.PathLike)):
        return ShardDataset(source, **(options or {}))
    raise OptionError(f"{name} must be a store path or a ShardDataset, got "
                      f"{type(source).__name__}")


class ShardDataModule(pl.LightningDataModule):
    """Training, validation and test loaders over shardkit stores, one ``ShardSampler`` per rank.

    Args:
        train, val, test: store paths (opened as ``ShardDataset(path, **<name>_options)``) or
            ``ShardDataset`` objects; ``val`` and ``test`` are optional.
        batch_size: per rank; ``val_batch_size`` (default ``batch_size``) for val and test.
        num_workers: DataLoader workers per rank (0: in the training process).
        engine: ``"processes"`` (DataLoader workers) or ``"threads"``: each rank's batches
            made by threads of its own process, ahead of the steps, with no worker process
            (``num_threads=``, ``prefetch=`` among the loader options; see
            :mod:`shardkit.read.loading.thread_engine`).
        seed: the ``ShardSampler`` seed (the same on every rank).
        drop_last: drop each epoch's tail so no rank repeats a sample (else pad by repeating).
        normalize: ``(mean, std)``: hand the steps normalised float batches (on their device,
            contiguous NCHW); None: uint8 ``[B, 3, H, W]`` channels-last views.
        train_options, val_options, test_options: ``ShardDataset`` arguments for paths.
        **loader_options: further ``ShardDataset.loader``/``DataLoader`` arguments
            (``pin_memory``, ``prefetch_factor``, ``multiprocessing_context``, ...).

    Validation and test read each rank's contiguous share in order (``shuffle=False``); as with
    Lightning's own ``DistributedSampler``, up to ``ranks - 1`` samples are read twice to even
    out the ranks.
    """

    def __init__(self, train: Any, val: Any = None, test: Any = None, *, batch_size: int = 64,
                 val_batch_size: int | None = None, num_workers: int = 0, seed: int = 0,
                 drop_last: bool = False, engine: str = "processes",
                 normalize: tuple[Sequence[float], Sequence[float]] | None = None,
                 train_options: dict[str, Any] | None = None,
                 val_options: dict[str, Any] | None = None,
                 test_options: dict[str, Any] | None = None, **loader_options: Any) -> None:
        super().__init__()
        for key in ("sampler", "batch_sampler", "shuffle", "batch_size"):
            if key in loader_options:
                raise OptionError(f"ShardDataModule sets {key} itself (one ShardSampler per "
                                  "rank); pass batch_size=, seed=, drop_last=")
        options = {key: value for key, value in loader_options.items()
                   if key not in ("num_threads", "prefetch")}
        check_engine(engine, loader_options.get("num_threads"), loader_options.get("prefetch"),
                     {"num_workers": num_workers, **options})  # refused now, not at fit
        self.train_set = _dataset(train, train_options, "train")
        if self.train_set is None:
            raise OptionError("train is required")
        self.val_set = _dataset(val, val_options, "val")
        self.test_set = _dataset(test, test_options, "test")
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.engine = engine
        self.seed = seed
        self.drop_last = drop_last
        self.output = BatchOutput.make(normalize, None)
        self.loader_options = loader_options

    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 1, 0
        return trainer.world_size, trainer.global_rank

    def _loader(self, dataset: ShardDataset, shuffle: bool, batch_size: int,
                drop_last: bool) -> Any:
        world, rank = self._world()
        sampler = ShardSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle,
                               seed=self.seed, drop_last=drop_last)
        return dataset.loader(batch_size=batch_size, sampler=sampler, engine=self.engine,
                              num_workers=self.num_workers, **self.loader_options)

    def train_dataloader(self) -> Any:
        return self._loader(self.train_set, True, self.batch_size, self.drop_last)

    def val_dataloader(self) -> Any:
        if self.val_set is None:
            return []
        return self._loader(self.val_set, False, self.val_batch_size, False)

    def test_dataloader(self) -> Any:
        if self.test_set is None:
            return []
        return self._loader(self.test_set, False, self.val_batch_size, False)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # On the device already: the uint8 batch crossed, the floats are made there.
        return batch if self.output is None else self.output(batch)
