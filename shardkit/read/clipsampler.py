"""``ClipSampler``: ``ShardSampler``'s epoch order (shuffled per ``(seed, epoch)``, whole shards
per rank, elastic exact resume) over the clips of a store of video frames.

Clips are grouped by the shard of their first frame (a video's frames lie in one shard, in
frame order), so a rank reads a few shards, as with ``ShardSampler``, and a clip reads one
stretch of one shard. The order is :mod:`shardkit.read.order`'s over those groups: every clip
once per epoch across the ranks, the same global sequence at every world size dividing
``num_canonical``, and a state saved at one such size resumes exactly at another.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import OptionError
from .clips import Clips
from .clipwindows import TOLERANCE_S
from .order import Groups
from .sampler import OrderedSampler
from .shardorder import fingerprint, shard_groups, store_versions


class ClipSampler(OrderedSampler):
    """A ``DistributedSampler`` of clips (drop-in as ``ShardSampler`` is), yielding clip
    numbers of ``self.dataset`` (a :class:`shardkit.Clips`).

    Args:
        dataset: a :class:`shardkit.Clips`, or a ``ShardDataset`` of video frames with
            ``frames`` (and ``stride``, ``fields``, ``delta_timestamps``, ``tolerance_s``,
            ``fps``):
            the sampler then makes the clips, ``sampler.dataset``.
        num_replicas, rank, shuffle, seed, drop_last, num_canonical: as ``ShardSampler``'s.

    Read them with ``sampler.dataset.loader(batch_size, sampler=sampler, ...)``; call
    ``set_epoch`` before each epoch; ``state_dict``/``load_state_dict`` (or the loader's) resume
    mid-epoch exactly, also at another world size dividing ``num_canonical``.
    """

    def __init__(self, dataset: Any, frames: int | None = None, stride: int = 1,
                 fields: Sequence[str] | None = None,
                 delta_timestamps: Mapping[str, Sequence[float]] | None = None,
                 tolerance_s: float = TOLERANCE_S, fps: float | None = None,
                 num_replicas: int | None = None,
                 rank: int | None = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_canonical: int | None = None) -> None:
        if isinstance(dataset, Clips):
            if frames is not None or stride != 1 or fields is not None \
                    or delta_timestamps is not None or tolerance_s != TOLERANCE_S \
                    or fps is not None:
                raise OptionError("dataset is already Clips: pass frames, stride, fields and "
                                  "delta_timestamps to Clips, or a ShardDataset here")
        else:
            dataset = Clips(dataset, frames, stride, fields, delta_timestamps, tolerance_s, fps)
        self.dataset = dataset
        first = dataset.first_frames()
        shards, _ = dataset.dataset.store.locate_many(first)
        order = np.argsort(shards, kind="stable")  # clip order within a shard kept
        counts = np.bincount(shards, minlength=len(dataset.dataset.store.shards))
        starts = np.concatenate([[0], np.cumsum(counts[counts > 0])]).astype(np.int64)
        self.groups = Groups(starts, None if np.array_equal(order, np.arange(len(order)))
                             else order.astype(np.int64))
        self._setup(self.groups.total, num_replicas, rank, shuffle, seed, drop_last,
                    num_canonical)
        frames_of = dataset.dataset
        digest = hashlib.sha256(fingerprint(frames_of, shard_groups(frames_of)).encode())
        for part in dataset.windows.digest_parts():
            digest.update(part)
        self._fingerprint = digest.hexdigest()

    def _groups(self, epoch: int) -> Groups:
        return self.groups

    def _identity(self) -> dict[str, Any]:
        versions = store_versions(self.dataset.dataset)
        return {**({"store_version": versions} if versions else {}),
                "dataset_len": self.total, "num_shards": len(self.groups.starts) - 1,
                "fingerprint": self._fingerprint}
