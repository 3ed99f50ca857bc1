"""``ShardDataset``: a map-style torch Dataset over a packed store.

It is picklable and holds no file handle until used in a process; ``worker_init_fn`` opens the
store in each DataLoader worker, and a pid check reopens it lazily anywhere else. A batch is read in
one transaction per shard (``__getitems__``) and, with ``crop`` set, decoded straight into one
batch buffer (shared memory inside a worker) that ``shardkit.collate`` hands on without a copy.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from . import codec
from .errors import StoreError
from .store import OpenShard, Store

OUTPUTS: tuple[str, ...] = ("tensor", "numpy", "pil", "bytes")


class Batch(list):
    """A list of (image, label) samples that also carries them stacked, as ``images``/``labels``.

    ``collate`` returns ``[images, labels]`` straight away; any other collate function sees an
    ordinary list of samples.
    """

    images: torch.Tensor | np.ndarray
    labels: torch.Tensor


def collate(batch: Sequence[Any]) -> Any:
    """``default_collate``, except that a ``Batch`` from ``ShardDataset`` is passed on uncopied."""
    if isinstance(batch, Batch):
        return [batch.images, batch.labels]
    return default_collate(batch)


class ShardDataset(Dataset):
    """Images and labels from a shardkit store, with ImageFolder's ``classes``/``class_to_idx``/``targets``.

    Args:
        path: a single-file store or a multi-shard store folder.
        transform: applied to each image (after ``crop``), e.g. torchvision transforms.
        target_transform: applied to each label.
        output: ``"tensor"`` (uint8 CxHxW, a view of HxWxC memory), ``"numpy"`` (HxWxC uint8),
            ``"pil"`` (RGB image) or ``"bytes"`` (the stored record, undecoded).
        crop: crop size applied at decode time (square); smaller images are zero-padded as
            torchvision's ``CenterCrop`` does.
        crop_mode: ``"center"`` or ``"random"`` (seeded from ``torch.initial_seed()``, so each
            DataLoader worker and epoch differ, and ``torch.manual_seed`` reproduces them).
        threads: decode a batch with this many threads (0: in the calling thread). Wins when
            the DataLoader runs with ``num_workers=0`` and the training step leaves CPU idle.
        verify: check every record's CRC32 on read.
        fast_decode: libjpeg-turbo's fast DCT and upsampling (a few % faster, slightly less exact).
    """

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None,
                 target_transform: Callable | None = None, output: str = "tensor",
                 crop: int | None = None, crop_mode: str = "center", threads: int = 0,
                 verify: bool = False, fast_decode: bool = False) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if crop_mode not in codec.CROP_MODES:
            raise ValueError(f"crop_mode must be one of {codec.CROP_MODES}, got {crop_mode!r}")
        if crop is not None and (crop <= 0 or output == "bytes"):
            raise ValueError("crop must be a positive size and cannot be used with output='bytes'")
        if threads < 0:
            raise ValueError("threads must be >= 0")
        self.store = Store(path)
        self.root = self.store.path
        self.transform = transform
        self.target_transform = target_transform
        self.output = output
        self.crop = crop
        self.crop_mode = crop_mode
        self.threads = threads
        self.verify = verify
        self.fast_decode = fast_decode
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._rng: tuple[int, int, np.random.Generator] | None = None

    # -- ImageFolder-compatible attributes ------------------------------------------------------

    @property
    def classes(self) -> list[str]:
        return self.store.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        return self.store.class_to_idx

    @property
    def targets(self) -> np.ndarray:
        """Label of every record (int64 array, not a list: no per-record Python objects)."""
        return self.store.labels

    @property
    def encoding(self) -> str:
        return self.store.encoding

    def __len__(self) -> int:
        return self.store.count

    def source_path(self, index: int) -> str:
        """Path of record ``index``'s source image, relative to the packed folder."""
        k, local = self.store.locate(index)
        return self.store.shard(k).source_path(local)

    # -- process-local state --------------------------------------------------------------------

    def open(self) -> None:
        """Open the store in this process (what ``worker_init_fn`` calls)."""
        self.store.open()

    def close(self) -> None:
        self.store.close()
        if self._pool is not None and self._pool[0] == os.getpid():
            self._pool[1].shutdown(wait=False)
        self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        state["_rng"] = None
        return state

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()
        if self._pool is None or self._pool[0] != pid:
            self._pool = (pid, ThreadPoolExecutor(self.threads, thread_name_prefix="shardkit"))
        return self._pool[1]

    def _generator(self) -> np.random.Generator:
        pid, seed = os.getpid(), torch.initial_seed()
        if self._rng is None or self._rng[:2] != (pid, seed):
            self._rng = (pid, seed, np.random.default_rng(seed))
        return self._rng[2]

    # -- reading --------------------------------------------------------------------------------

    def _check(self, shard: OpenShard, k: int, local: int, buf) -> None:
        if self.verify and zlib.crc32(buf) != int(shard.crc32[local]):
            raise StoreError(f"{self.root}: checksum mismatch in shard {k} "
                             f"({shard.entry.path}), record {local}: the stored bytes are damaged")

    def _decode(self, shard: OpenShard, k: int, local: int, buf, out: np.ndarray | None,
                origin: tuple[int, int] | None) -> np.ndarray:
        """Decode one record; crop into ``out`` when given. Returns memory the caller owns."""
        self._check(shard, k, local, buf)
        try:
            img = codec.decode(buf, self.store.encoding, int(shard.heights[local]),
                               int(shard.widths[local]), self.fast_decode)
        except codec.RecordDecodeError as exc:
            raise StoreError(f"{self.root}: shard {k} ({shard.entry.path}), record {local}: "
                             f"{exc}") from None
        if out is None:
            return img.copy() if self.store.encoding == "raw" else img
        if origin is None:
            origin = codec.center_origin(img.shape[0], img.shape[1], self.crop)
        codec.crop_into(out, img, *origin)
        return out

    def _origin(self, shard: OpenShard, local: int) -> tuple[int, int] | None:
        if self.crop_mode != "random":
            return None
        return codec.random_origin(int(shard.heights[local]), int(shard.widths[local]),
                                   self.crop, self._generator())

    def _present(self, img: np.ndarray) -> Any:
        if self.output == "numpy":
            return img
        if self.output == "pil":
            from PIL import Image

            return Image.fromarray(img, "RGB")
        return torch.from_numpy(img).permute(2, 0, 1)

    def _sample(self, img: Any, label: int) -> tuple[Any, Any]:
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return img, label

    def _item(self, shard: OpenShard, k: int, local: int, buf,
              origin: tuple[int, int] | None) -> tuple[Any, Any]:
        label = int(shard.labels[local])
        if self.output == "bytes":
            self._check(shard, k, local, buf)
            return self._sample(bytes(buf), label)
        out = None if self.crop is None else np.empty((self.crop, self.crop, 3), np.uint8)
        img = self._decode(shard, k, local, buf, out, origin)
        return self._sample(self._present(img), label)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        k, local = self.store.locate(int(index))
        shard = self.store.shard(k)
        with shard.reader.records() as get:
            return self._item(shard, k, local, get(local), self._origin(shard, local))

    def __getitems__(self, indices: Sequence[int]) -> list:
        """A batch: one read transaction per shard, optional threads, one buffer when cropping."""
        if self.output == "bytes" or self.crop is None or self.transform is not None \
                or self.output == "pil":
            return self._getitems_each(indices)
        return self._getitems_batched(indices)

    def _located(self, indices: Sequence[int]) -> dict[int, list[tuple[int, int]]]:
        """Shard -> [(position in batch, index in shard)], so each shard is read in one go."""
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for pos, index in enumerate(indices):
            k, local = self.store.locate(int(index))
            by_shard.setdefault(k, []).append((pos, local))
        return by_shard

    def _run(self, fn: Callable, jobs: list[tuple]) -> list:
        if self.threads > 0 and len(jobs) > 1:
            return list(self._executor().map(lambda job: fn(*job), jobs))
        return [fn(*job) for job in jobs]

    def _getitems_each(self, indices: Sequence[int]) -> list:
        results: list = [None] * len(indices)
        for k, items in self._located(indices).items():
            shard = self.store.shard(k)
            with shard.reader.records() as get:
                jobs = [(shard, k, local, get(local), self._origin(shard, local))
                        for _, local in items]
                for (pos, _), sample in zip(items, self._run(self._item, jobs)):
                    results[pos] = sample
        return results

    def _getitems_batched(self, indices: Sequence[int]) -> Batch:
        n, c = len(indices), self.crop
        if self.output == "tensor":
            if get_worker_info() is not None:
                # Allocate in shared memory, so sending the batch to the main process is free.
                storage = torch.UntypedStorage._new_shared(n * c * c * 3)
                images = torch.tensor([], dtype=torch.uint8).set_(storage).view(n, c, c, 3)
            else:
                images = torch.empty((n, c, c, 3), dtype=torch.uint8)
            pixels = images.numpy()
        else:
            pixels = np.empty((n, c, c, 3), dtype=np.uint8)
        labels = np.empty(n, dtype=np.int64)
        for k, items in self._located(indices).items():
            shard = self.store.shard(k)
            with shard.reader.records() as get:
                jobs = []
                for pos, local in items:
                    labels[pos] = shard.labels[local]
                    jobs.append((shard, k, local, get(local), pixels[pos],
                                 self._origin(shard, local)))
                self._run(self._decode, jobs)
        batch = Batch()
        label_list = labels.tolist()
        if self.target_transform is not None:
            label_list = [self.target_transform(t) for t in label_list]
        if self.output == "tensor":
            views = images.permute(0, 3, 1, 2)
            batch.extend(zip(views.unbind(0), label_list))
            batch.images = views
        else:
            batch.extend(zip(pixels, label_list))
            batch.images = pixels
        batch.labels = (torch.from_numpy(labels) if self.target_transform is None
                        else default_collate(label_list))
        return batch

    def __repr__(self) -> str:
        return (f"ShardDataset({self.root!r}, records={len(self)}, classes={len(self.classes)}, "
                f"encoding={self.encoding!r}, output={self.output!r}, crop={self.crop})")


def _find_shard_datasets(dataset: Any, seen: set[int] | None = None) -> list[ShardDataset]:
    seen = set() if seen is None else seen
    if id(dataset) in seen:
        return []
    seen.add(id(dataset))
    if isinstance(dataset, ShardDataset):
        return [dataset]
    found: list[ShardDataset] = []
    inner = getattr(dataset, "dataset", None)
    if inner is not None:
        found += _find_shard_datasets(inner, seen)
    for inner in getattr(dataset, "datasets", ()) or ():
        found += _find_shard_datasets(inner, seen)
    return found


def worker_init_fn(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: open every ShardDataset (also inside Subset/ConcatDataset)."""
    info = get_worker_info()
    if info is None:
        return
    for dataset in _find_shard_datasets(info.dataset):
        dataset.open()
