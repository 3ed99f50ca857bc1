"""A dataset's records in the order its store holds them: grouped by shard (``shard_groups``),
read shard after shard (``StoreOrderSampler``, what ``ds.loader()`` reads without ``shuffle``),
and named by content and order (``fingerprint``: what a sampler's saved state is checked
against).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator, Sized

import numpy as np
from torch.utils.data import SequentialSampler

from .order import Groups


def shard_groups(dataset: Sized) -> Groups:
    """The dataset's samples grouped by shard (see :class:`shardkit.read.order.Groups`).

    A ``ShardDataset`` gives its store's shards (through a subset or the pack's mixed layout:
    the indices each shard holds); a ``ConcatDataset`` its parts' groups end to end; any other
    dataset with ``len()`` is one group.
    """
    n = len(dataset)
    store = getattr(dataset, "store", None)
    if store is not None and hasattr(store, "groups"):
        groups = store.groups()
    elif store is not None and getattr(store, "starts", None) is not None:
        groups = Groups(np.asarray(store.starts, dtype=np.int64))
    elif hasattr(dataset, "datasets") and hasattr(dataset, "cumulative_sizes"):
        starts, members, offset = [0], [], 0
        for part in dataset.datasets:
            inner = shard_groups(part)
            starts.extend((inner.starts[1:] + offset).tolist())
            members.append(inner.index(np.arange(inner.total)) + offset)
            offset += inner.total
        groups = Groups(np.asarray(starts, dtype=np.int64),
                        np.concatenate(members) if members else None)
    else:
        groups = Groups(np.array([0, n], dtype=np.int64))
    starts = groups.starts
    if starts.ndim != 1 or len(starts) < 2 or starts[0] != 0 or starts[-1] != n \
            or np.any(np.diff(starts) < 0):
        raise ValueError(f"shard starts {starts.tolist()[:8]}... do not describe a dataset of {n}")
    return groups


def shard_starts(dataset: Sized) -> np.ndarray:
    """Start position of every shard's samples plus the length: ``[0, s1, ..., N]``."""
    return shard_groups(dataset).starts


class StoreOrderSampler(SequentialSampler):
    """Every index of ``dataset`` once, in the order its records lie in the store: shard by
    shard, each shard's records in file order (what ``ds.loader()`` reads without ``shuffle``).

    A store packed in the class-mixed layout holds ImageFolder's order spread over every shard,
    so reading it in index order touches every shard in every batch (a remote store's cache
    downloads shards again and again); this order reads one shard after another. For a
    source-order store, a single file, a subset or any other dataset it is index order where
    the records lie in index order. It is a ``SequentialSampler`` (reproducible; Lightning
    replaces it under DDP as it does a sequential one).
    """

    def __init__(self, dataset: Sized) -> None:
        super().__init__(dataset)
        self.dataset = dataset

    def indices(self) -> np.ndarray:
        """The dataset indices in reading order (``len(dataset)`` of them, each once)."""
        groups = shard_groups(self.dataset)
        return np.asarray(groups.index(np.arange(groups.total, dtype=np.int64)), dtype=np.int64)

    def __iter__(self) -> Iterator[int]:
        groups = shard_groups(self.dataset)
        step = 1 << 16  # no list of every index at once (a million records: 40 MB)
        for a in range(0, groups.total, step):
            yield from groups.index(np.arange(a, min(a + step, groups.total))).tolist()

    def __len__(self) -> int:
        return len(self.dataset)


def fingerprint(dataset: Sized, groups: Groups) -> str:
    """SHA-256 naming the dataset's contents and order: shard checksums and sizes (the
    manifest's), the pack's layout and any subset, so a state from another store is refused."""
    h = hashlib.sha256(np.ascontiguousarray(groups.starts, dtype="<i8").tobytes())
    if groups.members is not None:
        h.update(np.ascontiguousarray(groups.members, dtype="<i8").tobytes())
    for part in _parts(dataset):
        store = getattr(part, "store", None)
        h.update((store_content(store) if store is not None and hasattr(store, "shards")
                  else f"{type(part).__name__}:{len(part)}").encode())
    return h.hexdigest()


def store_versions(dataset: Sized) -> list[int] | None:
    """The version of each store the dataset reads, where one of them has changed since it was
    packed (:mod:`shardkit.versions`); None where none has (a state saved before stores had
    versions stays valid)."""
    found = [getattr(getattr(part, "store", None), "version", 1) for part in _parts(dataset)]
    return found if any(v != 1 for v in found) else None


def store_content(store: Any) -> str:
    """What names a store's records: each shard's SHA-256 and size from the manifest (a
    single-file store: the checksums of its labels and of its records' CRC32s)."""
    parts = []
    for entry in store.shards:
        if entry.sha256 is not None:
            parts.append(f"{entry.sha256}:{entry.count}:{entry.bytes}")
        else:
            arrays = store.meta["arrays"]
            parts.append(f"{arrays['crc32']['crc32']}:{arrays['labels']['crc32']}:{entry.count}")
    return ",".join(parts)


def _parts(dataset: Any) -> list[Any]:
    inner = getattr(dataset, "datasets", None)
    if inner is not None and not hasattr(dataset, "store"):
        return [p for d in inner for p in _parts(d)]
    return [dataset]
