"""``ShardSampler``: a ``DistributedSampler`` whose ranks each read a few shards, not every shard.

``DistributedSampler`` deals a shuffled permutation out round-robin, so every rank reads every
shard. ``ShardSampler`` keeps the same contract (each rank gets ``ceil(N / R)`` indices, padded by
repeating samples, or ``floor(N / R)`` with ``drop_last``; the ranks' lists together cover the
dataset; ``set_epoch`` reshuffles deterministically from ``seed``) but builds each epoch's order
from whole shards:

1. the shard order is shuffled (seeded by ``seed`` and the epoch), and each shard's records are
   shuffled within the shard;
2. the shards are laid end to end and cut into ``R`` contiguous runs, one per rank, so a rank
   holds about ``S / R + 1`` shards (a shard at a cut is split between two ranks);
3. each rank shuffles its own run, interleaving its few shards.

A rank that needs padding repeats its own samples, so padding never opens another shard. Over a
remote store, the sampler downloads its rank's next shard (in the rank's order of first use) in
the background while the one before is read; the store's own k+1 guess is off.
Resuming: ``state_dict(consumed=n)`` records the epoch and how many samples of it the training loop
has *consumed* (the DataLoader's prefetching runs ahead of that, so the sampler's own position is
not used); after ``load_state_dict`` the next iteration starts at exactly the next sample.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sized

import numpy as np
from torch.utils.data import DistributedSampler

from .store import locate_many

_MASK64 = (1 << 64) - 1
STATE_VERSION = 1


def shard_starts(dataset: Sized) -> np.ndarray:
    """Start index of every shard plus the length: ``[0, s1, ..., N]``.

    A ``ShardDataset`` (single-file or multi-shard) gives its store's shards, a ``ConcatDataset``
    its parts; any other dataset with ``len()`` is one shard.
    """
    n = len(dataset)
    store = getattr(dataset, "store", None)
    starts = getattr(store, "starts", None)
    if starts is None and hasattr(dataset, "cumulative_sizes"):
        starts = [0, *dataset.cumulative_sizes]
    if starts is None:
        return np.array([0, n], dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    if starts.ndim != 1 or len(starts) < 2 or starts[0] != 0 or starts[-1] != n \
            or np.any(np.diff(starts) < 0):
        raise ValueError(f"shard starts {starts.tolist()[:8]}... do not describe a dataset of {n}")
    return starts


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ShardSampler: pass num_replicas and rank, or initialise "
                               "torch.distributed first (init_process_group)")
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"invalid rank {rank}: rank should be in the interval [0, "
                         f"{num_replicas - 1}]")
    return num_replicas, rank


class ShardSampler(DistributedSampler):
    """Distributed sampler that gives each rank a few whole shards (drop-in for DistributedSampler).

    It is an ``isinstance`` of ``torch.utils.data.DistributedSampler`` (so Lightning, timm and
    other trainers use it as given instead of wrapping it) with the same attributes
    (``num_replicas``, ``rank``, ``epoch``, ``num_samples``, ``total_size``, ...), but none of
    DistributedSampler's code runs: the order is this class's own.

    Args:
        dataset: a ``ShardDataset`` (or any dataset with ``len()``, treated as one shard).
        num_replicas: number of ranks (default: ``torch.distributed`` world size).
        rank: this rank (default: ``torch.distributed`` rank).
        shuffle: shuffle shard order, records within shards and each rank's run, per epoch.
            Without it, rank ``r`` reads the contiguous range ``[r*n, (r+1)*n)`` in order.
        seed: base seed; must be the same on every rank.
        drop_last: drop the tail so every rank gets ``floor(N / R)`` distinct samples, instead of
            padding to ``ceil(N / R)`` by repeating samples.

    Call ``set_epoch(epoch)`` before each epoch, as with ``DistributedSampler``. To checkpoint,
    save ``state_dict(consumed=samples_this_epoch)`` (or maintain ``sampler.consumed``); after
    ``load_state_dict`` the next ``iter()`` continues at exactly the next sample of that epoch.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        self.dataset = dataset
        self.num_replicas, self.rank = _world(num_replicas, rank)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.starts = shard_starts(dataset)
        store = getattr(dataset, "store", None)
        # A remote store's reads follow this rank's order, not k, k+1: the sampler prefetches.
        self._remote = store if getattr(store, "cache", None) is not None else None
        if self._remote is not None:
            self._remote.prefetch_next = False  # before the DataLoader sends it to its workers
        self.total = int(self.starts[-1])
        r = self.num_replicas
        if drop_last and self.total % r != 0:
            self.num_samples = math.ceil((self.total - r) / r)
        else:
            self.num_samples = math.ceil(self.total / r)
        self.total_size = self.num_samples * r
        self.epoch = 0
        #: Samples of the current epoch the training loop has consumed (kept by the loop).
        self.consumed = 0
        self._skip = 0  # set by load_state_dict, applied by the next __iter__

    # -- the epoch's order ----------------------------------------------------------------------

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed & _MASK64, self.epoch, *key])

    def _shard_order(self) -> np.ndarray:
        n_shards = len(self.starts) - 1
        if not self.shuffle:
            return np.arange(n_shards)
        return self._rng(0).permutation(n_shards)

    def _run(self, lo: int, hi: int, order: np.ndarray, cum: np.ndarray) -> np.ndarray:
        """Dataset indices at positions ``[lo, hi)`` of the epoch's shard-by-shard order."""
        if hi <= lo:
            return np.zeros(0, dtype=np.int64)
        first = int(np.searchsorted(cum, lo, side="right")) - 1
        parts = []
        j = first
        while j < len(order) and cum[j] < hi:
            s = int(order[j])
            size = int(self.starts[s + 1] - self.starts[s])
            a, b = max(lo - int(cum[j]), 0), min(hi - int(cum[j]), size)
            if b > a:
                local = self._rng(1, s).permutation(size)[a:b] if self.shuffle \
                    else np.arange(a, b, dtype=np.int64)
                parts.append(local + self.starts[s])
            j += 1
        return np.concatenate(parts).astype(np.int64, copy=False)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, in order (all ``num_samples`` of them)."""
        n, m = self.total, self.num_samples
        if m == 0:
            return np.zeros(0, dtype=np.int64)
        order = self._shard_order()
        sizes = np.diff(self.starts)[order]
        cum = np.concatenate([[0], np.cumsum(sizes)])
        lo, hi = self.rank * m, (self.rank + 1) * m
        own = self._run(lo, min(hi, n), order, cum)
        if len(own) < m:  # padding (never with drop_last): repeat this rank's own samples
            if len(own):
                own = np.resize(own, m)
            else:  # more ranks than samples: repeat from the start, as DistributedSampler does
                own = self._run(0, n, order, cum)[(np.arange(lo, hi) - n) % n]
        if self.shuffle:
            own = own[self._rng(2, self.rank).permutation(m)]
        return own

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        indices = self.indices()[skip:]
        if self._remote is None:
            return iter(indices.tolist())
        return self._prefetching(indices)

    def _prefetching(self, indices: np.ndarray) -> Iterator[int]:
        """``indices``; as the first index of each shard is handed out (to the DataLoader, which
        runs ahead of the workers' reads), the rank's next shard starts downloading."""
        shards = locate_many(self.starts, indices)[0]
        first = np.sort(np.unique(shards, return_index=True)[1])
        order = shards[first].tolist()
        ends = [*first.tolist()[1:], len(indices)]
        for j, (start, end) in enumerate(zip(first.tolist(), ends)):
            if j + 1 < len(order):
                self._remote.prefetch(order[j + 1])
            yield from indices[start:end].tolist()

    def __len__(self) -> int:
        return self.num_samples - self._skip

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (call before each epoch, with the same value on every rank).

        Changing the epoch resets ``consumed``; setting the epoch a resumed state already holds
        keeps the resume position.
        """
        if epoch != self.epoch:
            self.consumed = 0
            self._skip = 0
        self.epoch = int(epoch)

    def shards_of_rank(self) -> list[int]:
        """Shard numbers this rank reads in the current epoch (sorted)."""
        return np.unique(locate_many(self.starts, self.indices())[0]).tolist()

    # -- checkpointing --------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where to resume: the epoch and how many of its samples the training loop consumed.

        Args:
            consumed: samples of the current epoch this rank's loop has consumed, counted from
                the start of the epoch (including any consumed before an earlier resume), e.g.
                ``batches_done * batch_size``. Default: ``self.consumed``.

        The state does not depend on the rank: one rank may save it for all.
        """
        consumed = self.consumed if consumed is None else int(consumed)
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"consumed={consumed} is outside 0..{self.num_samples} "
                             "(samples per rank per epoch)")
        return {"version": STATE_VERSION, "epoch": self.epoch, "consumed": consumed,
                "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "num_replicas": self.num_replicas, "dataset_len": self.total,
                "num_shards": len(self.starts) - 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next ``iter()`` yields the rest of that epoch."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported ShardSampler state version {state.get('version')!r}")
        mine = self.state_dict(0)
        for key in ("seed", "shuffle", "drop_last", "num_replicas", "dataset_len", "num_shards"):
            if state.get(key) != mine[key]:
                raise ValueError(f"cannot resume: saved {key}={state.get(key)!r}, this sampler "
                                 f"has {mine[key]!r} (the order would differ)")
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"saved consumed={consumed} is outside 0..{self.num_samples}")
        self.epoch = int(state["epoch"])
        self.consumed = consumed
        self._skip = consumed
