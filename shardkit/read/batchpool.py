"""Reusable batch buffers for ``ShardDataset``: no fresh allocation, and no page faults, per batch.

A fresh 9.6 MB batch (64 x 224 x 224 x 3) costs thousands of page faults, each zero-filling a
page: in a DataLoader worker, a new shared-memory segment per batch costs about as much CPU as
decoding a third of the batch. So batches are decoded into buffers that are reused once nothing
uses them any more:

- In the process that consumes the batches (``num_workers=0``), a buffer is free again when no
  tensor uses it: ``torch.from_numpy`` keeps the buffer's array alive exactly as long as any
  tensor, view or storage uses its memory, so the array's reference count tells.
- In a DataLoader worker, buffers are shared-memory files. A batch travels to the main process as
  a reference to the file (the worker's pid and descriptor number, opened through
  ``/proc/PID/fd``; the first time, and wherever that does not work, the descriptor itself, as
  torch sends its own shared tensors) plus the shape. The main process maps it, wraps it in a
  tensor, and when the last user of that tensor's memory is gone clears the buffer's in-use byte,
  which the worker reads before reusing the buffer.

When every buffer is in use (a consumer that keeps many batches), a fresh one is allocated, up to
``MAX_SLOTS``; past that, batches fall back to one-off memory (a memfd in a worker, never
``/dev/shm``: see :mod:`shardkit.read.shipping`). A buffer is never reused while anything can
still read it.

A thread of the thread engine (:mod:`shardkit.read.loading.thread_engine`) that pins its batches
(``pin_memory=True`` with CUDA) asks for them with :func:`pinned`: its batches are then decoded
straight into page-locked memory from torch's caching host allocator, which reuses a freed block
only once the copies queued from it have finished (a slot reused as soon as its tensor is
dropped could be overwritten while a ``non_blocking`` copy still reads it), so nothing is copied
to pin them. Many threads take buffers at once: the pools are taken under locks.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import tempfile
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

from ..forklock import ForkLock
from .shipping import memfd_tensor, ship

HEADER = 64     # bytes before the pixels in a shared buffer:
HELD = 0        # header byte: 1 while the main process uses the batch
BY_PATH = 1     # header byte: 1 once the main process has opened it through /proc/PID/fd
# Buffers kept per process (beyond these, batches use one-off memory): enough for the batches a
# worker has in flight (prefetch_factor + 2) or a loop holding the previous batch, few enough
# that a consumer who once held many batches does not leave them all allocated.
MAX_SLOTS = {True: 8, False: 4}  # shared (DataLoader worker), private


def _shared_fd(size: int) -> int:
    """An anonymous shared-memory file of ``size`` bytes (memfd, or an unlinked /dev/shm file)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("shardkit-batch", os.MFD_CLOEXEC)
    else:  # pragma: no cover - non-Linux
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="shardkit-batch-", dir=folder)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Slot:
    """One reusable buffer: private memory, or a shared-memory file with an in-use byte."""

    def __init__(self, nbytes: int, shared: bool) -> None:
        self.nbytes = nbytes
        self.fd: int | None = None
        self.flag: np.ndarray | None = None
        if shared:
            self.fd = _shared_fd(HEADER + nbytes)
            self.inode = os.fstat(self.fd).st_ino
            self._map = mmap.mmap(self.fd, HEADER + nbytes)
            self.flag = np.frombuffer(self._map, np.uint8, HEADER, 0)
            # Its own object (not a slice of another array), so its reference count is exact.
            self.array = np.frombuffer(self._map, np.uint8, nbytes, HEADER)
        else:
            self.array = np.empty(nbytes, np.uint8)

    def in_use(self) -> bool:
        # One reference is self.array, one is getrefcount's argument; any more is a tensor.
        if sys.getrefcount(self.array) > 2:
            return True
        return self.flag is not None and self.flag[HELD] != 0

    def tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A uint8 tensor of ``shape`` over the start of this buffer (keeps the buffer busy)."""
        count = math.prod(shape)
        return torch.from_numpy(self.array)[:count].view(shape)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class BatchPool:
    """The buffers of one process (re-created after a fork: the owner pid is checked)."""

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.pid = os.getpid()
        self.slots: list[Slot] = []
        self.limit = MAX_SLOTS[shared]  # slots kept (see reserve)
        self._lock = threading.Lock()  # a free slot is handed to one caller only

    def reserve(self, slots: int) -> None:
        """Keep up to ``slots`` buffers: the thread engine has that many batches in flight."""
        with self._lock:
            self.limit = max(self.limit, int(slots))

    def take(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, Slot | None]:
        """A uint8 tensor of ``shape`` and the slot it lives in (None: one-off memory)."""
        nbytes = math.prod(shape)
        with self._lock:
            for slot in self.slots:
                if slot.nbytes >= nbytes and not slot.in_use():
                    return slot.tensor(shape), slot
            if len(self.slots) < self.limit:
                slot = Slot(nbytes, self.shared)
                self.slots.append(slot)
                return slot.tensor(shape), slot
        if self.shared:
            return memfd_tensor(shape, torch.uint8), None
        return torch.empty(shape, dtype=torch.uint8), None

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots = []


class PooledBatch(list):
    """``[images, labels]`` from ``shardkit.collate`` in a worker, sent to the main process as a
    reference to the images' shared buffer rather than as a copy. Elsewhere, a plain list.

    ``images`` is N x C x H x W (a view of the N x H x W x C buffer) or, with ``channels_last``,
    the N x H x W x C buffer itself, or (``views``) a list of those, each view's block after the
    previous one's in the buffer; ``labels`` a tensor (int64 labels travel as bytes) or
    whatever a ``target_transform`` made of them.
    """

    def __init__(self, images: torch.Tensor, labels: Any, slot: Slot | None,
                 channels_last: bool = False) -> None:
        super().__init__((images, labels))
        self._images = images
        self._slot = slot
        self._channels_last = channels_last

    def __reduce__(self) -> tuple:
        slot, labels = self._slot, self[1]
        several = isinstance(self._images, list)
        # the N x H x W x C layout the buffer holds, view after view
        bases = [image if self._channels_last else image.permute(0, 2, 3, 1)
                 for image in (self._images if several else [self._images])]
        where = None if slot is None else slot.array.ctypes.data
        placed = True
        for base in bases:
            placed = placed and base.is_contiguous() and base.data_ptr() == where
            where = base.data_ptr() + base.numel()
        if (slot is None or slot.fd is None or len(self) != 2 or self[0] is not self._images
                or not placed):
            # Changed since collate: its tensors travel by torch's own means (in a memfd).
            return (list, ([_ship_each(x) for x in self],))
        if isinstance(labels, torch.Tensor) and labels.dtype == torch.int64:
            labels = labels.numpy().tobytes()
        handle = None
        if not slot.flag[BY_PATH]:
            from multiprocessing.reduction import DupFd

            handle = DupFd(slot.fd)
        slot.flag[HELD] = 1  # the main process holds it until it is done with the batch
        shapes = [tuple(base.shape) for base in bases]
        return (_rebuild, (os.getpid(), slot.fd, slot.inode, handle, HEADER + slot.nbytes,
                           shapes if several else shapes[0], labels, self._channels_last))


def _ship_each(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ship(x)
    if isinstance(x, list) and x and all(isinstance(t, torch.Tensor) for t in x):
        return [ship(t) for t in x]
    return x


def _release(flag: np.ndarray) -> None:
    flag[HELD] = 0


def _open_by_path(pid: int, fd: int, inode: int) -> int | None:
    """The worker's buffer file through /proc, or None (no /proc, no access, not that file)."""
    try:
        opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    if os.fstat(opened).st_ino != inode:
        os.close(opened)
        return None
    return opened


def _rebuild(pid: int, fd_number: int, inode: int, handle: Any, size: int,
             shape: tuple[int, ...] | list[tuple[int, ...]], labels: Any,
             channels_last: bool = False) -> list:
    """In the main process: map the worker's buffer and wrap it; free it when unused."""
    by_path = _open_by_path(pid, fd_number, inode) if os.getpid() != pid else None
    if handle is not None:
        fd = handle.detach()  # always take it, or the worker's resource sharer keeps it
        if by_path is not None:
            os.close(by_path)
    elif by_path is None:
        raise RuntimeError(f"cannot open the shared batch buffer of DataLoader worker {pid} "
                           "(did the worker exit before its batch was received?)")
    else:
        fd = by_path
    try:
        buf = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    header = np.frombuffer(buf, np.uint8, HEADER, 0)
    if handle is not None and by_path is not None:
        header[BY_PATH] = 1  # from now on the worker sends only its pid and descriptor number
    shapes = shape if isinstance(shape, list) else [shape]
    count = sum(math.prod(s) for s in shapes)
    array = np.frombuffer(buf, np.uint8, count, HEADER)
    weakref.finalize(array, _release, header)
    flat, blocks, start = torch.from_numpy(array), [], 0
    for s in shapes:
        block = flat[start:start + math.prod(s)].view(s)
        blocks.append(block if channels_last else block.permute(0, 3, 1, 2))
        start += math.prod(s)
    images = blocks if isinstance(shape, list) else blocks[0]
    if isinstance(labels, bytes):
        labels = torch.from_numpy(np.frombuffer(bytearray(labels), np.int64))
    return [images, labels]


class PinnedPool:
    """Page-locked batches from torch's caching host allocator (see the module docstring): a
    block comes back to be reused once freed and once the copies queued from it are done."""

    def take(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, None]:
        return torch.empty(shape, dtype=torch.uint8, pin_memory=True), None


_POOLS: dict[tuple[int, bool], BatchPool] = {}
_POOLS_LOCK = ForkLock()
_PINNED = PinnedPool()
_THREAD = threading.local()  # .pinned: this thread's batches go to pinned memory


@contextmanager
def pinned(on: bool = True) -> Iterator[None]:
    """Within the block, :func:`pool` gives this thread page-locked buffers (needs CUDA)."""
    before = getattr(_THREAD, "pinned", False)
    _THREAD.pinned = on
    try:
        yield
    finally:
        _THREAD.pinned = before


def pool(shared: bool) -> BatchPool | PinnedPool:
    """This process's pool (shared-memory buffers in DataLoader workers, private ones elsewhere,
    page-locked ones in a thread that asked for them with :func:`pinned`)."""
    if not shared and getattr(_THREAD, "pinned", False):
        return _PINNED
    key = (os.getpid(), shared)
    found = _POOLS.get(key)
    if found is None:
        with _POOLS_LOCK:
            found = _POOLS.get(key)
            if found is None:
                for stale in [k for k in _POOLS if k[0] != key[0]]:
                    del _POOLS[stale]  # inherited over fork: those buffers are the parent's
                found = _POOLS[key] = BatchPool(shared)
    return found
