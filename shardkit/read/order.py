"""The epoch order the samplers deal out: a pure function of (seed, epoch), independent of the
world size.

Samples come in *groups* (a store's shards): ``starts = [0, s1, ..., N]`` cuts positions
``0..N-1`` into groups, and ``members[p]`` is the dataset index at position ``p``. One epoch:

1. the groups are laid end to end in an order shuffled by ``(seed, epoch)``, each group's own
   samples shuffled too (a store of one shard, a single file, is one group: without this, each
   rank would read one contiguous slice of it — class-sorted in a store packed in source order);
2. that sequence is cut into ``C`` contiguous *canonical runs* (``C = num_canonical``; the first
   ``N mod C`` runs hold one sample more), and each run is shuffled on its own. The runs lie in
   the sequence grouped for the world size ``V`` the partition was made for
   (``canonical_world``, a divisor of ``C``): run ``c`` is segment ``(c mod V) * C/V + c div V``,
   so at ``V`` ranks rank ``r``'s runs ``r, r + V, ...`` are consecutive segments, one
   contiguous stretch of shards (``V = C``: run ``c`` is segment ``c``);
3. the global sequence ``G`` interleaves the runs: ``G[j*C + c]`` is sample ``j`` of run ``c``.

Rank ``r`` of ``W`` ranks reads ``G[o + r], G[o + r + W], ...`` (``o``: where a resumed epoch
starts). When ``W`` divides ``C``, position ``p`` belongs to run ``p mod C``, so a rank reads only
the ``C / W`` runs ``c = r (mod W)`` and the few shards under them. ``G`` depends on neither
``W`` nor ``r`` (``C`` and ``V`` travel in a saved state): at any world size dividing ``C`` the
ranks together read ``G`` in order, one
step of ``W`` samples at a time. That is what makes resume elastic: after the ranks consumed
``k`` samples each, the epoch's consumed samples are exactly ``G[:k*W]`` and any world size
dividing ``C`` continues at position ``k*W``.

Equal counts per rank, as ``DistributedSampler``: without ``drop_last`` a rank whose stream runs
past ``N`` repeats its own earlier samples (position ``p`` becomes ``p - W``, same rank, same
runs, so padding never opens another shard); with ``drop_last`` the last partial step is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Groups:
    """Samples grouped by shard: ``starts`` ``[0, s1, ..., N]``, and the dataset index at each
    position (``members``; None: position ``p`` is index ``p``)."""

    starts: np.ndarray
    members: np.ndarray | None = None

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def index(self, positions: np.ndarray) -> np.ndarray:
        return positions if self.members is None else np.asarray(self.members)[positions]

    def group_of(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, positions, side="right") - 1


def rng(seed: int, epoch: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & _MASK64, int(epoch), *key])


def per_rank(n: int, origin: int, world: int, drop_last: bool) -> int:
    """Samples each rank reads in an epoch of ``n`` that starts at global position ``origin``."""
    left = max(n - origin, 0)
    return left // world if drop_last else math.ceil(left / world)


def places(n: int, origin: int, rank: int, world: int, drop_last: bool,
           skip: int = 0) -> np.ndarray:
    """Places in a global sequence of ``n`` of rank ``rank``'s samples ``skip..`` of an epoch
    that starts at ``origin``, padding mapped to the rank's own earlier places."""
    count = per_rank(n, origin, world, drop_last)
    p = origin + rank + world * np.arange(skip, count, dtype=np.int64)
    over = p >= n
    if over.any():
        q = p[over] - world * ((p[over] - n) // world + 1)
        low = q < origin  # fewer samples left than ranks: repeat from the start, as
        if low.any():     # DistributedSampler does
            q[low] = origin + (p[over][low] - origin) % (n - origin)
        p[over] = q
    return p


class EpochOrder:
    """The global sequence ``G`` of one epoch (see the module docstring), computed lazily per run.

    Args:
        groups: the samples, grouped by shard.
        seed, epoch: the order is a pure function of these (and of ``groups``, ``canonical``).
        canonical: ``C``, the number of canonical runs.
        shuffle: shuffle group order and each run; without it ``G`` interleaves the runs of the
            groups laid end to end in order (``C = 1``: the dataset in order).
        world: ``V``, the world size the runs are grouped for (a divisor of ``C``; None: ``C``).
    """

    def __init__(self, groups: Groups, seed: int, epoch: int, canonical: int,
                 shuffle: bool, world: int | None = None) -> None:
        self.groups, self.seed, self.epoch = groups, seed, epoch
        self.canonical, self.shuffle = canonical, shuffle
        n = groups.total
        self.n = n
        sizes = np.diff(groups.starts)
        order = rng(seed, epoch, 0).permutation(len(sizes)) if shuffle else np.arange(len(sizes))
        self._order = order
        self._ordered_starts = groups.starts[:-1][order]
        self._cum = np.concatenate([[0], np.cumsum(sizes[order])]).astype(np.int64)
        base, extra = divmod(n, canonical)
        world = canonical if world is None else world
        runs = np.arange(canonical)
        #: segment of the sequence each run is cut from
        self.segment = (runs % world) * (canonical // world) + runs // world
        lengths = np.empty(canonical, dtype=np.int64)
        lengths[self.segment] = base + (runs < extra)  # run c: base + 1 for the first N mod C
        self.segment_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self._runs: dict[int, np.ndarray] = {}
        self._within: dict[int, np.ndarray] = {}  # group -> its samples' shuffled offsets

    def _offsets(self, group: int, a: int, b: int) -> np.ndarray:
        """Offsets ``a..b`` within ``group`` (shuffled by ``(seed, epoch, group)`` when shuffling)."""
        if not self.shuffle:
            return np.arange(a, b, dtype=np.int64)
        perm = self._within.get(group)
        if perm is None:
            size = int(self.groups.starts[group + 1] - self.groups.starts[group])
            perm = rng(self.seed, self.epoch, 2, group).permutation(size).astype(np.int64)
            self._within[group] = perm
        return perm[a:b]

    def _sequence(self, lo: int, hi: int) -> np.ndarray:
        """Positions (in ``groups``) at places ``[lo, hi)`` of the groups laid end to end."""
        first = int(np.searchsorted(self._cum, lo, side="right")) - 1
        last = int(np.searchsorted(self._cum, hi, side="left"))
        parts = []
        for j in range(max(first, 0), min(last, len(self._order))):
            a, b = max(lo, int(self._cum[j])), min(hi, int(self._cum[j + 1]))
            if b > a:
                cum = int(self._cum[j])
                offsets = self._offsets(int(self._order[j]), a - cum, b - cum)
                parts.append(int(self._ordered_starts[j]) + offsets)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def run(self, c: int) -> np.ndarray:
        """Canonical run ``c``: positions in ``groups``, in the run's (shuffled) order."""
        found = self._runs.get(c)
        if found is None:
            s = int(self.segment[c])
            found = self._sequence(int(self.segment_starts[s]), int(self.segment_starts[s + 1]))
            if self.shuffle:
                found = found[rng(self.seed, self.epoch, 1, c).permutation(len(found))]
            self._runs[c] = found
        return found

    def at(self, places: np.ndarray) -> np.ndarray:
        """``G[places]`` (all ``< n``), as positions in ``groups``."""
        places = np.asarray(places, dtype=np.int64)
        out = np.empty(len(places), dtype=np.int64)
        runs, steps = places % self.canonical, places // self.canonical
        for c in np.unique(runs).tolist():
            sel = runs == c
            out[sel] = self.run(c)[steps[sel]]
        return out

    def places(self, origin: int, rank: int, world: int, drop_last: bool,
               skip: int = 0) -> np.ndarray:
        """Places in ``G`` of rank ``rank``'s samples ``skip..`` of an epoch that starts at
        ``origin``, padding mapped to the rank's own earlier places."""
        return places(self.n, origin, rank, world, drop_last, skip)

    def indices(self, origin: int, rank: int, world: int, drop_last: bool,
                skip: int = 0) -> np.ndarray:
        """Dataset indices of rank ``rank``'s samples ``skip..`` of the epoch."""
        return self.groups.index(self.at(self.places(origin, rank, world, drop_last, skip)))
