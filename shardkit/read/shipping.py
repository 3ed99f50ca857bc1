"""Batches leave DataLoader workers in memfd memory, never in ``/dev/shm``.

torch sends a worker's tensors to the main process as shared-memory segments that it creates in
``/dev/shm`` (``default_collate`` even stacks a batch straight into one). A container's
``/dev/shm`` is often small (Docker's default is 64 MB): a few batches in flight fill it and the
workers die with "unable to allocate shared memory(shm)". A memfd (``os.memfd_create``) is the
same kind of memory, but no mount bounds it. Tensors made here live in one: torch sends such a
tensor by its descriptor, as it sends its own segments, with no copy into ``/dev/shm``.

``default_collate`` and ``convert`` are torch's ``default_collate`` and ``default_convert`` (the
same values, types and errors; ``shardkit.collate`` calls the first for what is not a shardkit
batch), except that inside a DataLoader worker every tensor they return lives in a memfd.
Outside a worker nothing differs. (torch's ``file_system`` sharing strategy copies any tensor into
``/dev/shm`` regardless; the default ``file_descriptor`` strategy does not.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import default_convert, get_worker_info
# torch's documented way to extend default_collate: its ``collate`` with a map of collate functions
from torch.utils.data._utils.collate import collate as _collate
from torch.utils.data._utils.collate import default_collate_fn_map


def memfd_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous tensor in a fresh memfd, which torch shares by descriptor."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * itemsize)
    fd = os.memfd_create("shardkit-batch", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)  # maps a duplicate of fd
    finally:
        os.close(fd)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


def ship(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself outside a worker or when torch already shares it; else a memfd copy."""
    if (get_worker_info() is None or not _plain(tensor)
            or tensor.untyped_storage().is_shared()):
        return tensor
    out = memfd_tensor(tuple(tensor.shape), tensor.dtype)
    out.copy_(tensor)
    return out


def _plain(tensor: torch.Tensor) -> bool:
    """A dense CPU tensor that needs no autograd (what may live in a memfd)."""
    return (tensor.layout == torch.strided and tensor.device.type == "cpu"
            and not tensor.is_nested and not tensor.requires_grad)


def _stack(batch: list[torch.Tensor], *,
           collate_fn_map: dict[Any, Callable] | None = None) -> torch.Tensor:
    """``default_collate``'s tensor step, stacking into a memfd instead of ``/dev/shm``."""
    elem = batch[0]
    if get_worker_info() is None or not _plain(elem):
        return default_collate_fn_map[torch.Tensor](batch, collate_fn_map=collate_fn_map)
    if any(t.shape != elem.shape for t in batch):
        return torch.stack(batch, 0)  # raises torch's own "stack expects each tensor ..." error
    return torch.stack(batch, 0, out=memfd_tensor((len(batch), *elem.shape), elem.dtype))


def _shipped(step: Callable) -> Callable:
    """A ``default_collate`` step whose (small) tensor result is moved into a memfd."""
    def run(batch: Any, *, collate_fn_map: dict[Any, Callable] | None = None) -> Any:
        return ship(step(batch, collate_fn_map=collate_fn_map))
    return run


COLLATE_FN_MAP: dict[Any, Callable] = {
    key: (_stack if key is torch.Tensor
          else _shipped(step) if key in (int, float, (np.bool_, np.number, np.object_))
          else step)
    for key, step in default_collate_fn_map.items()}


def default_collate(batch: Any) -> Any:
    """torch's ``default_collate`` whose tensors, inside a DataLoader worker, live in memfd memory."""
    return _collate(batch, collate_fn_map=COLLATE_FN_MAP)


def convert(sample: Any) -> Any:
    """``default_convert`` (what a DataLoader with ``batch_size=None`` applies to each sample)
    whose tensors, inside a DataLoader worker, live in memfd memory."""
    return _ship_all(default_convert(sample))


def _ship_all(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return ship(data)
    if isinstance(data, Mapping):
        shipped = {key: _ship_all(value) for key, value in data.items()}
        try:
            return type(data)(shipped)  # type: ignore[call-arg]
        except TypeError:  # a mapping that cannot be built from a dict
            return shipped
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(_ship_all(d) for d in data))
    if isinstance(data, tuple):
        return tuple(_ship_all(d) for d in data)
    if isinstance(data, list):
        return [_ship_all(d) for d in data]
    return data
