"""Aspect-ratio buckets, read side: each record's bucket, and ``BucketSampler``, which batches
within a bucket with the exact-epoch and elastic-resume rules of ``ShardSampler``.

A store packed with ``buckets=`` (``shardkit pack --buckets 1024``) names its buckets in its
metadata (``"buckets": {"sizes": [[h, w], ...], ...}``) and stores every record at exactly its
bucket's size, so a record's bucket is its (height, width) looked up in that list
(:func:`record_buckets`: one pass over the shards' memory-mapped index arrays, vectorised).

``BucketSampler`` deals *batches*, not samples, through the machinery of
:class:`shardkit.read.sampler.OrderedSampler`. Each epoch, every bucket's records are shuffled
by ``(seed, epoch)`` and cut into batches of ``batch_size`` (a bucket's last batch may be
smaller); the ``B`` batches of all buckets are the "samples" of :class:`shardkit.read.order.
EpochOrder` (one group, so their order is shuffled as a whole: buckets interleave), and rank
``r`` of ``W`` reads batches ``G[o + r], G[o + r + W], ...`` of its global sequence. So, as for
``ShardSampler``: the order is a pure function of ``(seed, epoch)``; every rank gets
``ceil(B / W)`` batches (the last step padded with the rank's own earlier batches: fewer than
``W`` batches repeat) or, with ``drop_last``, ``floor(B / W)`` full batches (each bucket's
partial batch and the last partial step are left out: ``dropped`` says how many samples); and a
state (counted in batches) resumes exactly at any world size dividing ``num_canonical``.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Any, Iterator, Sized

import numpy as np

from .. import bucketmeta
from ..errors import OptionError, StoreError
from .order import Groups, rng
from .sampler import OrderedSampler
from .shardorder import fingerprint, shard_groups
from .storeview import open_layout


def bucket_sizes(store: Any) -> np.ndarray | None:
    """The store's bucket sizes (its metadata's, checked as the store opened:
    :mod:`shardkit.bucketmeta`) as a ``(K, 2)`` int64 array of (height, width), sorted; None for
    a store packed without buckets."""
    held = bucketmeta.sizes_counts(store.meta)
    if held is None:
        return None
    return np.asarray(held[0], dtype=np.int64).reshape(-1, 2)


def live_buckets(store: Any) -> dict[str, Any]:
    """The ``buckets`` entry a bucketed folder store's version that deleted or replaced
    records should hold: its live records' (:func:`.storeview.live_records`), from their
    heights and widths (what ``verify`` checks the manifest's against)."""
    view = open_layout(store)
    n = len(view)
    shards, local = view.locate_many(np.arange(n, dtype=np.int64))
    hw = np.zeros((n, 2), dtype=np.int64)
    for k in np.unique(shards).tolist():
        at = shards == k
        shard = store.shard(k)
        hw[at, 0] = np.asarray(shard.heights)[local[at]]
        hw[at, 1] = np.asarray(shard.widths)[local[at]]
    return bucketmeta.histogram(store.settings[bucketmeta.KEY], hw[:, 0], hw[:, 1])


def _keys(hw: np.ndarray) -> np.ndarray:
    """One int64 per (height, width): sides are below 2**31."""
    return (hw[:, 0].astype(np.int64) << 32) | hw[:, 1].astype(np.int64)


def record_buckets(store: Any, sizes: np.ndarray) -> np.ndarray:
    """Each record's bucket (its index in ``sizes``), int64, in ``store``'s index order (a
    ``StoreView``: the view's records). Reads each shard's memory-mapped heights and widths once;
    a record whose size is no bucket is a ``StoreError``."""
    n = len(store)
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    keys = _keys(sizes)
    by_key = np.argsort(keys, kind="stable")
    sorted_keys = keys[by_key]
    shards, local = store.locate_many(np.arange(n, dtype=np.int64))
    order = np.argsort(shards, kind="stable")  # positions grouped by shard
    bounds = np.flatnonzero(np.diff(shards[order])) + 1
    for part in np.split(order, bounds):
        k = int(shards[part[0]])
        shard = store.shard(k)
        rows = local[part]
        found = np.stack([np.asarray(shard.heights)[rows], np.asarray(shard.widths)[rows]], 1)
        want = _keys(found)
        at = np.minimum(np.searchsorted(sorted_keys, want), len(sorted_keys) - 1)
        bad = np.flatnonzero(sorted_keys[at] != want) if len(sorted_keys) else np.arange(len(want))
        if len(bad):
            i = int(bad[0])
            raise StoreError(f"{store.path}: shard {k}, record {int(rows[i])} is "
                             f"{int(found[i, 0])}x{int(found[i, 1])}, which is no bucket of the "
                             "store's metadata (damaged store)")
        out[part] = by_key[at]
    return out


class BucketSampler(OrderedSampler):
    """A batch sampler over an aspect-ratio bucketed store: every batch holds one bucket.

    Pass it as ``ds.loader(batch_sampler=BucketSampler(ds, 32))``: batches come out stacked, of
    their bucket's size. Its order and checkpoints follow ``ShardSampler``'s rules, counted in
    batches (see the module docstring).

    Args:
        dataset: a ``ShardDataset`` (or a subset of one) over a store packed with ``buckets=``.
        batch_size: samples per batch (a bucket's last batch may hold fewer, unless
            ``drop_last``).
        shuffle: shuffle each bucket's records and the order of all batches, per epoch; without
            it, buckets in order, each bucket's records in index order.
        seed: base seed; must be the same on every rank.
        num_replicas, rank: the world (default: ``torch.distributed``'s).
        drop_last: only full batches, and ``floor(B / W)`` of them per rank: nothing repeats;
            ``dropped`` samples (each bucket's remainder, then the last partial step of batches)
            are left out of each epoch, different ones each epoch when shuffling. Without it
            every sample is read at least once an epoch, and fewer than ``num_replicas`` batches
            repeat (as ``DistributedSampler`` pads).
        num_canonical: the canonical partition ``C`` of the epoch's batches; a state resumes at
            any world size dividing it (default ``lcm(2W, 24)`` with shuffle, see
            :func:`shardkit.read.sampler.default_canonical`).

    Call ``set_epoch(epoch)`` before each epoch. ``state_dict(consumed=batches_this_epoch)`` /
    ``load_state_dict`` resume mid-epoch (a ``ShardLoader`` does both for you); a state of
    another store, subset, seed or batch size is refused.
    """

    def __init__(self, dataset: Sized, batch_size: int, shuffle: bool = True, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None,
                 drop_last: bool = False, num_canonical: int | None = None) -> None:
        if not hasattr(dataset, "bucket_sizes"):
            # TypeError: what Lightning expects of a batch sampler it cannot rebuild around its
            # own sampler (it then says to pass use_distributed_sampler=False).
            raise TypeError(f"BucketSampler needs a ShardDataset, got {type(dataset).__name__} "
                            "(under Lightning: Trainer(use_distributed_sampler=False))")
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
                or batch_size < 1:
            raise OptionError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        sizes = dataset.bucket_sizes
        if sizes is None:
            raise OptionError(f"BucketSampler: {getattr(dataset, 'root', 'the dataset')} has no "
                              "aspect-ratio buckets; pack it with buckets=1024 (shardkit pack "
                              "--buckets 1024)")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        #: Each record's bucket, and each bucket's (height, width).
        self.buckets = dataset.buckets
        self.bucket_sizes = sizes
        counts = np.bincount(self.buckets, minlength=len(sizes))
        per_bucket = counts // self.batch_size if drop_last else -(-counts // self.batch_size)
        #: Each batch's bucket, its first place in the epoch's bucket-sorted records, its length.
        self.batch_bucket = np.repeat(np.arange(len(sizes), dtype=np.int64), per_bucket)
        first = np.concatenate([[0], np.cumsum(per_bucket)])[:-1]
        k = np.arange(len(self.batch_bucket), dtype=np.int64) - np.repeat(first, per_bucket)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.batch_start = starts[self.batch_bucket] + k * self.batch_size
        self.batch_length = np.minimum(self.batch_size,
                                       counts[self.batch_bucket] - k * self.batch_size)
        self._setup(len(self.batch_bucket), num_replicas, rank, shuffle, seed, drop_last,
                    num_canonical)
        #: Samples each epoch leaves out (``drop_last`` only): each bucket's last partial batch,
        #: then the batches of the last partial step (whole batches of ``batch_size``).
        self.dropped = int(len(self.buckets) - self.num_samples * self.num_replicas
                           * self.batch_size) if drop_last else 0
        h = hashlib.sha256(fingerprint(dataset, shard_groups(dataset)).encode())
        h.update(np.ascontiguousarray(self.buckets, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(sizes, dtype="<i8").tobytes())
        self._fingerprint = h.hexdigest()
        self._members_cache: tuple[int, np.ndarray] | None = None

    @property
    def sampler(self) -> BucketSampler:
        """Itself, where a ``BatchSampler`` has its sampler: Lightning calls ``set_epoch`` on
        ``loader.sampler`` and ``loader.batch_sampler.sampler``, not on the batch sampler."""
        return self

    def _groups(self, epoch: int) -> Groups:
        return Groups(np.array([0, self.total], dtype=np.int64))  # one group: all batches mix

    def _identity(self) -> dict[str, Any]:
        return {"dataset_len": len(self.buckets), "batch_size": self.batch_size,
                "num_batches": self.total, "fingerprint": self._fingerprint}

    def members(self) -> np.ndarray:
        """The current epoch's records sorted by bucket, each bucket's shuffled by
        ``(seed, epoch)``: batch ``j`` is ``members()[batch_start[j]:][:batch_length[j]]``."""
        if self._members_cache is None or self._members_cache[0] != self.epoch:
            if self.shuffle:
                perm = rng(self.seed, self.epoch, 4).permutation(len(self.buckets))
                found = perm[np.argsort(self.buckets[perm], kind="stable")]
            else:
                found = np.argsort(self.buckets, kind="stable")
            self._members_cache = (self.epoch, found.astype(np.int64))
        return self._members_cache[1]

    def batches(self) -> np.ndarray:
        """This rank's batch numbers for the rest of the current epoch, in order."""
        return self.indices()

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        members, starts, lengths = self.members(), self.batch_start, self.batch_length
        for j in self.indices().tolist():
            yield members[starts[j]:starts[j] + lengths[j]].tolist()

    def __repr__(self) -> str:
        return (f"BucketSampler(batches={self.total}, buckets={len(self.bucket_sizes)}, "
                f"batch_size={self.batch_size}, rank={self.rank}/{self.num_replicas}, "
                f"drop_last={self.drop_last}, dropped={self.dropped})")
