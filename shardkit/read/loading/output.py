"""Normalised float batches for loops that feed the model directly.

shardkit's uint8 batches are ``[B, 3, H, W]`` views of ``[B, H, W, 3]`` memory (channels-last):
a decoded image is written row by row, pixel by pixel. That layout is what makes the batch free to
build, but a float batch derived from it by element-wise ops (``shardkit.normalize``) keeps it,
and a model whose weights are in the default (contiguous) layout then computes channels-last
gradients: DDP warns "Grad strides do not match bucket view strides" and copies them each step.
``BatchOutput`` therefore writes the normalised floats in the layout asked for, contiguous NCHW by
default (``torch.channels_last`` for a model converted with ``model.to(memory_format=...)``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch.utils.data import get_worker_info

from ...errors import OptionError
from .. import shipping

MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last)


def _triple(value: Any, name: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise OptionError(f"normalize must be (mean, std), each one number per channel; "
                          f"{name} is {value!r}") from None
    if not values:
        raise OptionError(f"normalize: {name} is empty")
    return values


def _moved(value: Any, device: torch.device) -> Any:
    """Tensors in ``value`` (a tensor, or dicts/lists/tuples of them: detection targets) on
    ``device``; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, device) for v in value)
    return value


class BatchOutput(NamedTuple):
    """What ``ShardLoader`` does to each ``[images, labels]`` batch before the loop sees it."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    device: torch.device | None
    dtype: torch.dtype
    memory_format: torch.memory_format

    @classmethod
    def make(cls, normalize: Sequence[Sequence[float]] | None, device: Any,
             dtype: torch.dtype = torch.float32,
             memory_format: torch.memory_format = torch.contiguous_format) -> "BatchOutput | None":
        """None when nothing is asked for (batches stay uint8, where the dataset made them)."""
        if normalize is None:
            if device is not None:
                raise OptionError("device needs normalize=(mean, std): uint8 batches are moved "
                                  "by the training loop (or pin_memory=True and .to(device))")
            return None
        try:
            mean, std = normalize
        except (TypeError, ValueError):
            raise OptionError(f"normalize must be a pair (mean, std), got {normalize!r}") from None
        mean, std = _triple(mean, "mean"), _triple(std, "std")
        if len(mean) != len(std):
            raise OptionError(f"normalize: mean has {len(mean)} values and std {len(std)}")
        if any(s == 0 for s in std):
            raise OptionError(f"normalize: std must not contain 0, got {std}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise OptionError(f"dtype must be a floating-point torch dtype, got {dtype!r}")
        if memory_format not in MEMORY_FORMATS:
            raise OptionError(f"memory_format must be torch.contiguous_format or "
                              f"torch.channels_last, got {memory_format!r}")
        return cls(mean, std, None if device is None else torch.device(device), dtype,
                   memory_format)

    def check(self, dataset: Any) -> None:
        """Refuses a ``dataset`` whose recipe (``shardkit.recipes``) already ends with
        ``Normalize``: its batches are float, and normalising them twice is never meant."""
        parts = getattr(getattr(dataset, "recipe", None), "parts", None)
        if callable(parts) and any(getattr(p.then, "normalize", None) is not None
                                   for p in parts()):
            raise OptionError("normalize is given and the dataset's recipe already ends with "
                              "Normalize (float batches): normalise in one of them")

    def in_workers(self, dataset: Any) -> bool:
        """Whether the batches are normalised where they are made (workers or threads) rather
        than in the loop: a dataset's ``views`` on the CPU (ten views normalised in the loop
        cost ten times the reading). With an accelerator ``device`` the uint8 views cross
        first (a quarter of the bytes) and are normalised there."""
        return getattr(dataset, "views", None) is not None and (
            self.device is None or self.device.type == "cpu")

    def __call__(self, batch: Any) -> list:
        """``[normalised float images, labels]``, both on ``device`` (when given); with views
        (a list of image batches, one per view) each view is normalised."""
        try:
            images, labels = batch
        except (TypeError, ValueError):
            raise OptionError("normalize needs batches of (images, labels); this loader's "
                              f"collate_fn gives {type(batch).__name__}") from None
        if self.device is not None:
            labels = _moved(labels, self.device)
        if isinstance(images, list):  # views: one batch per view
            return [[self._images(view) for view in images], labels]
        return [self._images(images), labels]

    def _images(self, images: Any) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 \
                or images.dim() != 4 or images.shape[1] != len(self.mean):
            raise OptionError("normalize needs uint8 [B, C, H, W] image batches with "
                              f"C={len(self.mean)} (a dataset with crop or views set and "
                              f"output='tensor'), got {getattr(images, 'dtype', type(images))} "
                              f"{tuple(getattr(images, 'shape', ()))}")
        if self.device is not None:
            images = images.to(self.device, non_blocking=True)  # uint8: a quarter of the bytes
        # One copy into the chosen layout, then in place: exactly images.float().div(255) and
        # v2.Normalize(mean, std), as shardkit.normalize computes it.
        if get_worker_info() is not None and images.device.type == "cpu":
            # made in a DataLoader worker: in a memfd, which leaves it without /dev/shm
            b, c, h, w = images.shape
            out = shipping.memfd_tensor((b, h, w, c), self.dtype).permute(0, 3, 1, 2) \
                if self.memory_format == torch.channels_last \
                else shipping.memfd_tensor((b, c, h, w), self.dtype)
            out.copy_(images)
        else:
            out = images.to(self.dtype, memory_format=self.memory_format)
        shape = (1, -1, 1, 1)
        mean = torch.tensor(self.mean, dtype=self.dtype, device=out.device).view(shape)
        std = torch.tensor(self.std, dtype=self.dtype, device=out.device).view(shape)
        return out.div_(255).sub_(mean).div_(std)


class WorkerOutput:
    """A loader's ``collate_fn`` followed by its ``BatchOutput``, run in the DataLoader worker
    (or the thread-engine thread) that makes the batch: the float views leave the worker in a
    memfd, the uint8 buffer they came from is free for the next batch at once."""

    def __init__(self, collate_fn: Callable[[Any], Any], output: BatchOutput) -> None:
        self.collate_fn = collate_fn
        self.output = output

    def __call__(self, samples: Any) -> list:
        images, labels = self.output(self.collate_fn(samples))
        return [images, shipping.convert(labels)]
