"""A batch as ``ShardDataset.__getitems__`` reads it (``Batch``), and ``collate``, which hands
it on uncopied: the batched path's two halves that any loader (``ds.loader``, ``Mix``, timm's)
shares with the dataset.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from . import batchpool, shipping
from . import targets as targetmod


class Batch(list):
    """A list of (image, label) samples that also carries them stacked, as ``images``/``labels``
    (with ``views``: each sample's image a list of views, ``images`` a list of stacked views and,
    with fields, ``labels`` a list of collated targets per view).

    ``collate`` returns ``[images, labels]`` straight away; any other collate function sees an
    ordinary list of samples.
    """

    images: torch.Tensor
    labels: torch.Tensor
    slot: batchpool.Slot | None = None  # the reusable buffer ``images`` lives in
    channels_last = False  # ``images`` is N x H x W x C (output="numpy"), else N x C x H x W

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("slot", None)  # process-local (a memory map); the images travel as tensors
        return state


def collate(batch: Sequence[Any], ragged: Any = "list") -> Any:
    """``default_collate``, except that a ``Batch`` from ``ShardDataset`` is passed on uncopied,
    and samples whose target is a dict of fields (``ShardDataset(fields=...)``) are collated by
    :func:`shardkit.read.targets.collate_targets` (ragged fields as ``ragged`` says).

    In a DataLoader worker the batch then travels to the main process as a reference to its
    reusable shared-memory buffer (see :mod:`shardkit.read.batchpool`), not as a new segment.
    """
    if isinstance(batch, Batch):
        slot = getattr(batch, "slot", None)
        if slot is not None and slot.fd is not None:
            return batchpool.PooledBatch(batch.images, batch.labels, slot, batch.channels_last)
        return [batch.images, shipping.ship(batch.labels)
                if isinstance(batch.labels, torch.Tensor) else batch.labels]
    if batch and isinstance(batch[0], (tuple, list)) and len(batch[0]) == 2 \
            and isinstance(batch[0][1], dict):
        return targetmod.collate_samples(batch, ragged)
    if batch and isinstance(batch[0], (tuple, list)) and len(batch[0]) == 2 \
            and isinstance(batch[0][1], list) and batch[0][1] \
            and all(isinstance(t, dict) for t in batch[0][1]):
        # views with fields: ([view_0, ...], [target_0, ...]) -> ([images_0, ...], [targets_0, ...])
        per_view = [targetmod.collate_samples([(s[0][v], s[1][v]) for s in batch], ragged)
                    for v in range(len(batch[0][1]))]
        return [[images for images, _ in per_view], [targets for _, targets in per_view]]
    try:
        return shipping.default_collate(batch)  # in memfd memory inside a worker
    except RuntimeError as exc:
        sizes = _image_sizes(batch)
        if len(sizes) > 1:  # torch's "stack expects each tensor to be equal size" says not why
            raise ValueError(
                f"the images of one batch differ in size ({' and '.join(sizes[:2])}): a store "
                "packed with buckets needs batch_sampler=shardkit.BucketSampler(...) (one bucket "
                "a batch); otherwise crop= or a transform to one size") from exc
        raise


def _image_sizes(batch: Sequence[Any]) -> list[str]:
    """The distinct shapes of the images of ``(image, target)`` samples (only asked when
    stacking them failed)."""
    seen: list[str] = []
    for sample in batch:
        image = sample[0] if isinstance(sample, (tuple, list)) and sample else None
        shape = getattr(image, "shape", None)
        if shape is not None and "x".join(map(str, shape)) not in seen:
            seen.append("x".join(map(str, shape)))
    return seen
