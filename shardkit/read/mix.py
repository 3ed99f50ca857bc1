"""Mixing several stores: ``Mix`` (their records end to end) and ``MixSampler`` (each epoch's exact
quota of each, dealt shard by shard, resumable at any world size dividing ``num_canonical``).

Each epoch, part ``i`` contributes exactly ``q_i`` samples, from ``proportion`` (weights of an
``epoch_size``; the quotas are the largest-remainder rounding, so Streaming's example of parts of
100 and 200 samples at 0.25/0.75 with ``epoch_size=400`` gives 100 and 300), ``repeat`` (``q_i =
round(r_i * len_i)``) or ``choose`` (``q_i`` given). A quota of ``q`` over a part of ``n`` takes
every sample ``q // n`` times, plus ``q % n`` more from whole shards drawn per epoch (so a
down-sampled part opens only the shards it uses). Those samples, as groups by shard, go through
the same epoch order as ``ShardSampler`` (:mod:`shardkit.read.order`): a pure function of
``(seed, epoch)``, the same global sequence at every world size dividing ``num_canonical``.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import ConcatDataset, get_worker_info

from ..errors import OptionError
from . import batchpool, draws
from .order import Groups, rng
from .sampler import OrderedSampler
from .shardorder import fingerprint, shard_groups


class Mix(ConcatDataset):
    """Several datasets (``ShardDataset`` s) end to end, read a batch at a time per part.

    Index ``i`` is record ``i - start_k`` of part ``k``, as in ``ConcatDataset``; a batch is
    read with each part's own ``__getitems__`` (its decode path), then put back in the order
    asked. Batches of cropped tensors stay one stacked ``Batch`` for ``shardkit.collate``.
    A ``ds.loader``'s per-sample seeds (:mod:`.draws`) go with each sample to its part, so a
    sample's draws do not depend on which other parts share its batch.
    """

    def __getitem__(self, index: int) -> Any:
        seed = draws.seed_of(index)
        if seed is None:
            return super().__getitem__(index)
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {int(index)} out of range for a mix of {n} records")
        i = int(index) % n
        k = int(np.searchsorted(self.cumulative_sizes, i, side="right"))
        start = self.cumulative_sizes[k - 1] if k else 0
        return self.datasets[k][draws.KeyedIndex(i - start, seed)]

    def __getitems__(self, indices: Sequence[int]) -> list:
        from .batching import Batch

        seeds = draws.seeds_of(indices)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            bad = next(i for i in idx.tolist() if not -n <= i < n)
            raise IndexError(f"index {bad} out of range for a mix of {n} records")
        idx = np.where(idx < 0, idx + n, idx)
        starts = np.array([0, *self.cumulative_sizes], dtype=np.int64)
        part = np.searchsorted(starts, idx, side="right") - 1
        pieces = []
        for k in np.unique(part).tolist():
            positions = np.flatnonzero(part == k)
            ds = self.datasets[k]
            local = (idx[positions] - starts[k]).tolist()
            if seeds is not None:
                local = draws.Keyed(local, seeds[positions])
            if hasattr(ds, "__getitems__"):
                got = ds.__getitems__(local)
            elif seeds is None:
                got = [ds[i] for i in local]
            else:
                got = [ds[draws.KeyedIndex(i, seed)]
                       for i, seed in zip(local, local.seeds.tolist())]
            pieces.append((positions, got))
        if len(pieces) == 1 and np.array_equal(pieces[0][0], np.arange(len(idx))):
            return pieces[0][1]  # one part, in order: its own batch, untouched
        samples: list = [None] * len(idx)
        for positions, got in pieces:
            for p, sample in zip(positions.tolist(), got):
                samples[p] = sample
        images = [getattr(got, "images", None) for _, got in pieces]
        if all(isinstance(got, Batch) and isinstance(x, torch.Tensor) and x.ndim == 4
               and x.shape[1:] == images[0].shape[1:] and x.dtype == torch.uint8
               and isinstance(getattr(got, "labels", None), torch.Tensor)
               for (_, got), x in zip(pieces, images)):
            # One batch buffer, as a ShardDataset's own batch (a worker ships it uncopied).
            _, c, h, w = images[0].shape
            buf, slot = batchpool.pool(get_worker_info() is not None).take((len(idx), h, w, c))
            batch = Batch(samples)
            batch.images = buf.permute(0, 3, 1, 2)
            batch.labels = torch.empty(len(idx), dtype=pieces[0][1].labels.dtype)
            for (positions, got), x in zip(pieces, images):
                where = torch.from_numpy(positions)
                batch.images[where] = x
                batch.labels[where] = got.labels
            batch.slot = slot
            return batch
        return samples

    def loader(self, batch_size: int | None = 1, *, engine: Any = "processes",
               num_threads: int | None = None, prefetch: int | None = None,
               **kwargs: Any) -> Any:
        """A DataLoader over the mix set up as ``ShardDataset.loader`` sets one up
        (``shardkit.collate``, ``shardkit.worker_init_fn`` for every part, persistent workers;
        without ``shuffle``, ``sampler`` or ``batch_sampler``: each part in its store's order,
        shard after shard, as :class:`shardkit.read.sampler.StoreOrderSampler` reads it;
        ``engine``, ``num_threads``, ``prefetch`` as there)."""
        from .batching import collate
        from .loading.engines import loader_for

        return loader_for(self, batch_size, engine, num_threads, prefetch, kwargs, collate)


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    share = weights / weights.sum() * total
    quota = np.floor(share).astype(np.int64)
    left = total - int(quota.sum())
    order = np.argsort(-(share - quota), kind="stable")  # ties: the earlier part
    quota[order[:left]] += 1
    return quota


def _numbers(values: Any, name: str, parts: int, integer: bool) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.shape != (parts,) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise OptionError(f"{name} must be {parts} non-negative numbers (one per dataset), "
                          f"got {values!r}")
    if integer and np.any(arr != np.round(arr)):
        raise OptionError(f"{name} must be whole numbers of samples, got {values!r}")
    return arr


def quotas(lengths: Sequence[int], proportion: Sequence[float] | None = None,
           repeat: Sequence[float] | None = None, choose: Sequence[int] | None = None,
           epoch_size: int | None = None) -> np.ndarray:
    """Samples each part contributes per epoch (see the module docstring)."""
    given = [name for name, v in (("proportion", proportion), ("repeat", repeat),
                                  ("choose", choose)) if v is not None]
    if len(given) != 1:
        raise OptionError("give exactly one of proportion, repeat or choose")
    lengths_arr = np.asarray(lengths, dtype=np.int64)
    k = len(lengths_arr)
    if epoch_size is not None and (isinstance(epoch_size, bool) or not isinstance(
            epoch_size, (int, np.integer)) or epoch_size < 0):
        raise OptionError(f"epoch_size must be an integer >= 0, got {epoch_size!r}")
    if proportion is not None:
        weights = _numbers(proportion, "proportion", k, False)
        if weights.sum() <= 0:
            raise OptionError("proportion must not be all zero")
        q = _largest_remainder(weights, int(lengths_arr.sum() if epoch_size is None
                                            else epoch_size))
    else:
        if epoch_size is not None:
            raise OptionError(f"epoch_size goes with proportion; {given[0]} fixes the epoch")
        if repeat is not None:
            q = np.round(_numbers(repeat, "repeat", k, False) * lengths_arr).astype(np.int64)
        else:
            q = _numbers(choose, "choose", k, True).astype(np.int64)
    empty = np.flatnonzero((q > 0) & (lengths_arr == 0))
    if len(empty):
        raise OptionError(f"dataset {int(empty[0])} is empty but its quota is {int(q[empty[0]])}")
    return q


class MixSampler(OrderedSampler):
    """Distributed sampler over a ``Mix``: each epoch exactly each part's quota, shard by shard.

    Args:
        dataset: a :class:`Mix` (or a ``ConcatDataset``) of the datasets to mix.
        proportion: one weight per dataset; the epoch holds ``epoch_size`` samples split by
            them (exact largest-remainder quotas).
        repeat: one factor per dataset: ``round(repeat * len)`` samples of each (0.5: half,
            2: every sample twice).
        choose: one exact count per dataset.
        epoch_size: samples per epoch with ``proportion`` (default: all datasets' lengths).
        num_replicas, rank, shuffle, seed, drop_last, num_canonical: as ``ShardSampler``
            (the world size must divide ``num_canonical``, default ``num_replicas``).

    ``set_epoch``, ``state_dict(consumed=...)`` and ``load_state_dict`` work as in
    ``ShardSampler``: the order is a pure function of ``(seed, epoch)`` and a state resumes
    exactly at any world size dividing ``num_canonical``.
    """

    def __init__(self, dataset: ConcatDataset, *, proportion: Sequence[float] | None = None,
                 repeat: Sequence[float] | None = None, choose: Sequence[int] | None = None,
                 epoch_size: int | None = None, num_replicas: int | None = None,
                 rank: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_canonical: int | None = None) -> None:
        parts = getattr(dataset, "datasets", None)
        if parts is None or not hasattr(dataset, "cumulative_sizes"):
            raise OptionError("dataset must be a shardkit.Mix (or ConcatDataset) of the "
                              "datasets to mix")
        self.dataset = dataset
        self.parts = [shard_groups(p) for p in parts]
        self.offsets = np.array([0, *dataset.cumulative_sizes[:-1]], dtype=np.int64)
        self.quotas = quotas([g.total for g in self.parts], proportion, repeat, choose,
                             epoch_size)
        self._setup(int(self.quotas.sum()), num_replicas, rank, shuffle, seed, drop_last,
                    num_canonical)
        h = hashlib.sha256(self.quotas.astype("<i8").tobytes())
        for p, g in zip(parts, self.parts):
            h.update(fingerprint(p, g).encode())
        self._fingerprint = h.hexdigest()

    def _identity(self) -> dict[str, Any]:
        return {"dataset_len": self.total, "quotas": self.quotas.tolist(),
                "fingerprint": self._fingerprint}

    def _groups(self, epoch: int) -> Groups:
        sizes: list[int] = []
        members: list[np.ndarray] = []
        for i, (groups, quota) in enumerate(zip(self.parts, self.quotas.tolist())):
            n = groups.total
            if quota == 0:
                continue
            index = groups.index(np.arange(n)) + self.offsets[i]
            shard_sizes = np.diff(groups.starts)
            for _ in range(quota // n):  # whole passes: every shard
                for s in np.flatnonzero(shard_sizes).tolist():
                    members.append(index[groups.starts[s]:groups.starts[s + 1]])
                    sizes.append(int(shard_sizes[s]))
            need = quota % n
            order = (rng(self.seed, epoch, 2, i).permutation(len(shard_sizes)) if self.shuffle
                     else np.arange(len(shard_sizes)))
            for s in order.tolist():  # the rest: whole shards, the last one in part
                if need == 0:
                    break
                piece = index[groups.starts[s]:groups.starts[s + 1]]
                if len(piece) > need:
                    piece = piece[rng(self.seed, epoch, 3, i).permutation(len(piece))[:need]] \
                        if self.shuffle else piece[:need]
                if len(piece):
                    members.append(piece)
                    sizes.append(len(piece))
                    need -= len(piece)
        starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        return Groups(starts, np.concatenate(members) if members else
                      np.zeros(0, dtype=np.int64))
