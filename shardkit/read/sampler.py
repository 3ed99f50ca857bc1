"""``ShardSampler``: a ``DistributedSampler`` whose ranks each read a few shards, not every shard,
in an order that is a pure function of ``(seed, epoch)`` and resumes exactly at any world size
that divides ``num_canonical``.

``DistributedSampler`` deals a shuffled permutation out round-robin, so every rank reads every
shard. ``ShardSampler`` keeps its contract (each rank gets ``ceil(N / R)`` indices, padded by
repeating samples, or ``floor(N / R)`` with ``drop_last``; the ranks' lists together cover the
dataset; ``set_epoch`` reshuffles deterministically from ``seed``) but builds the epoch from whole
shards cut into ``num_canonical`` runs (see :mod:`shardkit.read.order`): rank ``r`` of ``R``
reads the runs ``r, r + R, ...``; the runs are grouped for the world size the sampler was made
for, so there a rank reads one contiguous stretch of about ``S / R + 1`` of the ``S`` shards.

The rule (as Streaming's ``num_canonical_nodes``): the global sequence of samples, read one step
of ``R`` samples at a time, is the same at every world size that divides ``num_canonical``, and a
state saved at one such world size resumes exactly at any other. The default (shuffled) is
``lcm(2 * R, 24)`` (:func:`default_canonical`): a state resumes at half and twice the world size
and at 1, 2, 3, 4, 6, 8, 12 and 24 ranks; pass ``num_canonical`` as a multiple of every world
size a run may use for others. A state carries it, and a sampler built with the default adopts it.

Over a remote store, the sampler downloads its rank's next shard (in the rank's order of first
use) in the background while the one before is read; the store's own k+1 guess is off.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterator, Sized

import numpy as np
from torch.utils.data import DistributedSampler

from ..errors import OptionError
from . import bridge
from .consumers import check_sampler_consumer
from .order import EpochOrder, Groups, per_rank, places
# StoreOrderSampler and shard_starts: names this module has always offered
from .shardorder import (StoreOrderSampler, fingerprint, shard_groups, shard_starts,  # noqa: F401
                         store_versions)

STATE_VERSION = 2


#: The default canonical partition of a shuffled sampler is a multiple of this (and of twice the
#: world size): a state resumes at every world size dividing 24, and at half and twice its own.
ELASTIC_SIZES = 24


def default_canonical(num_replicas: int, shuffle: bool) -> int:
    """``num_canonical`` when none is given: ``lcm(2 * num_replicas, 24)`` for a shuffled
    sampler, so its state resumes at half and at twice the world size and at every divisor of 24
    (1, 2, 3, 4, 6, 8, 12, 24: from 4 ranks, at 1, 2, 3, 6, 8, 12 or 24); ``num_replicas``
    without shuffle, so each rank reads one contiguous range in order (an evaluation pass).

    The runs are grouped for this world size (``canonical_world``), so here each rank still
    reads one contiguous stretch of about ``S / W + 1`` shards, as with ``num_canonical = W``.
    The cost comes only after a resume at another world size ``W'``, which adopts the saved
    partition (and keeps it, so the run's order does not depend on when it was resized): a rank
    then reads its ``C / W'`` runs, about ``S / W' + C / W'`` shards instead of ``S / W' + 1``.
    """
    if not shuffle:
        return num_replicas
    return math.lcm(2 * num_replicas, ELASTIC_SIZES)


def _group_world() -> int | None:
    """The world size of torch.distributed's process group, or None when there is none."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else None


def _world(num_replicas: int | None, rank: int | None, owner: str) -> tuple[int, int]:
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        if _group_world() is None:
            if num_replicas is None and rank is None:
                return 1, 0  # one process, as a script without DDP is
            raise OptionError(f"{owner}: pass both num_replicas and rank, or neither (one "
                              "replica) before torch.distributed is initialised, got "
                              f"num_replicas={num_replicas!r}, rank={rank!r}")
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise OptionError(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise OptionError(f"invalid rank {rank!r}: rank should be in the interval [0, "
                          f"{num_replicas - 1}]")
    return num_replicas, rank


class OrderedSampler(DistributedSampler):
    """What ``ShardSampler`` and ``MixSampler`` share: the world, the epoch, the canonical
    partition, the resume position and the checkpoint state. Subclasses give each epoch's
    :class:`Groups` (``_groups``) and what identifies their data (``_identity``).

    It is an ``isinstance`` of ``torch.utils.data.DistributedSampler`` (so Lightning, timm and
    other trainers use it as given instead of wrapping it) with the same attributes
    (``num_replicas``, ``rank``, ``epoch``, ``shuffle``, ``seed``, ``drop_last``,
    ``num_samples``, ``total_size``), but none of DistributedSampler's code runs.
    """

    _name = "sampler"

    def _setup(self, total: int, num_replicas: int | None, rank: int | None, shuffle: bool,
               seed: int, drop_last: bool, num_canonical: int | None) -> None:
        self.num_replicas, self.rank = _world(num_replicas, rank, type(self).__name__)
        #: The world was taken as one process for want of a process group (see ``epoch_order``).
        self._lone = num_replicas is None and rank is None and _group_world() is None
        self.shuffle = bool(shuffle)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise OptionError(f"seed must be an integer, got {seed!r}")
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.total = int(total)
        self._canonical_given = num_canonical is not None
        self.num_canonical = default_canonical(self.num_replicas, self.shuffle) \
            if num_canonical is None else num_canonical
        self._check_canonical(self.num_canonical, "num_canonical")
        #: The world size the canonical runs are grouped for (see :mod:`shardkit.read.order`):
        #: this one by default, so each rank reads one contiguous stretch of shards; with an
        #: explicit ``num_canonical``, ``num_canonical`` itself (the order of earlier versions).
        self.canonical_world = self.num_replicas if num_canonical is None else num_canonical
        self.num_samples = per_rank(self.total, 0, self.num_replicas, self.drop_last)
        self.total_size = self.num_samples * self.num_replicas
        self.epoch = 0
        #: Samples of the current epoch this rank's training loop has consumed (kept by the
        #: loop, e.g. ``sampler.consumed += batch_size``); ``state_dict`` saves it.
        self.consumed = 0
        self._origin = 0  # where this epoch starts in the global sequence (a resume sets it)
        self._skip = 0    # samples per rank this epoch starts past (a resume sets it)
        self._order_cache: tuple[tuple[int, int, int], EpochOrder] | None = None
        #: The resumed epoch's sequence when it was saved over another store version
        #: (:mod:`shardkit.read.bridge`); None: the epoch's own order.
        self._bridge: bridge.Bridge | None = None

    def _check_canonical(self, canonical: Any, what: str) -> None:
        if isinstance(canonical, bool) or not isinstance(canonical, int) or canonical < 1:
            raise OptionError(f"{what} must be an integer >= 1, got {canonical!r}")
        if canonical % self.num_replicas:
            raise OptionError(f"{what}={canonical} is not a multiple of num_replicas="
                              f"{self.num_replicas}: the world size must divide the canonical "
                              "partition (choose num_canonical as a multiple of every world "
                              "size the run may use)")

    # -- the epoch's order ----------------------------------------------------------------------

    def _groups(self, epoch: int) -> Groups:
        raise NotImplementedError

    def _identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def epoch_order(self) -> EpochOrder:
        """The current epoch's global sequence (see :mod:`shardkit.read.order`)."""
        if self._lone and (_group_world() or 1) > 1:
            # Made before init_process_group: every rank would read the whole epoch.
            raise OptionError(f"{type(self).__name__} was made before torch.distributed was "
                              "initialised, so it took one replica, and the process group now "
                              f"has {_group_world()}: make it after init_process_group, or pass "
                              "num_replicas and rank")
        key = (self.epoch, self.num_canonical, self.canonical_world)
        if self._order_cache is None or self._order_cache[0] != key:
            order = EpochOrder(self._groups(self.epoch), self.seed, self.epoch,
                               self.num_canonical, self.shuffle, self.canonical_world)
            self._order_cache = (key, order)
        return self._order_cache[1]

    def indices(self) -> np.ndarray:
        """This rank's indices for the rest of the current epoch, in order (``len(self)``)."""
        check_sampler_consumer(self)  # a loader rebuilt by accelerate would split them again
        if self._bridge is not None:
            sequence = self._bridge.indices
            return sequence[places(len(sequence), self._origin, self.rank, self.num_replicas,
                                   self.drop_last, self._skip)]
        return self.epoch_order().indices(self._origin, self.rank, self.num_replicas,
                                          self.drop_last, self._skip)

    def _epoch_total(self) -> int:
        """Samples in the current epoch's global sequence (a bridged one: the bridge's)."""
        return self.total if self._bridge is None else len(self._bridge.indices)

    def __iter__(self) -> Iterator[int]:
        # The resume position belongs to the epoch, not to one iter(): a DataLoader with
        # batch_size=None and workers calls iter(sampler) twice.
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return per_rank(self._epoch_total(), self._origin, self.num_replicas,
                        self.drop_last) - self._skip

    def global_places(self) -> tuple[int, int]:
        """``(first, step)``: the ``k``-th sample the next ``iter()`` yields is at place
        ``first + k * step`` of the epoch's global sequence, the same place at every world size
        dividing ``num_canonical`` (a place past the end is padding, numbered on). What a
        ``ds.loader`` keys each sample's augmentation draws by (:mod:`shardkit.read.draws`)."""
        w = self.num_replicas
        return self._origin + self.rank + w * self._skip, w

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (call before each epoch, with the same value on every rank).

        Changing the epoch resets ``consumed`` and the resume position; setting the epoch a
        resumed state already holds keeps them.
        """
        if int(epoch) != self.epoch:
            self.consumed = 0
            self._origin = self._skip = 0
            self._bridge = None
        self.epoch = int(epoch)

    # -- checkpointing --------------------------------------------------------------------------

    def position(self, consumed: int | None = None) -> int:
        """Global position in the epoch's sequence after this rank consumed ``consumed``
        samples (every rank consumes the same number)."""
        consumed = self.consumed if consumed is None else consumed
        if isinstance(consumed, bool) or not isinstance(consumed, (int, np.integer)):
            raise OptionError(f"consumed must be an integer, got {consumed!r}")
        total = self._epoch_total()
        most = per_rank(total, self._origin, self.num_replicas, self.drop_last)
        if not 0 <= consumed <= most:
            raise OptionError(f"consumed={consumed} is outside 0..{most} (samples per rank "
                              "this epoch)")
        return min(self._origin + int(consumed) * self.num_replicas, total)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where to resume: the epoch and the global position the ranks reached in it.

        Args:
            consumed: samples of the current epoch this rank's loop has consumed, counted from
                the start of the epoch (after a resume, from the count ``load_state_dict`` set
                in ``self.consumed``), e.g. ``batches_done * batch_size``. Default:
                ``self.consumed``.

        The state does not depend on the rank (one rank may save it for all), and it resumes at
        any world size that divides ``num_canonical``. JSON-serialisable.
        """
        return {"version": STATE_VERSION, "epoch": self.epoch,
                "position": self.position(consumed), "consumed": int(
                    self.consumed if consumed is None else consumed),
                "num_replicas": self.num_replicas, "num_canonical": self.num_canonical,
                "canonical_world": self.canonical_world, "seed": self.seed,
                "shuffle": self.shuffle, "drop_last": self.drop_last,
                **self._identity(), **({} if self._bridge is None else {"bridge": {
                    "state": self._bridge.state, "length": len(self._bridge.indices)}})}

    def load_state_dict(self, state: dict[str, Any], across_versions: bool = False) -> None:
        """Continue from ``state``: the next ``iter()`` yields the rest of that epoch.

        At another world size the ranks together yield exactly the samples the saved run had
        not consumed, in the same global order. ``self.consumed`` is set to this rank's count
        at the resume point (keep adding to it).

        Args:
            across_versions: a state saved over another version of the store resumes on the
                records both versions share: the saved run's unconsumed samples, in its order,
                less those this version no longer holds (:mod:`shardkit.read.bridge`). Without
                it such a state is refused.
        """
        if not isinstance(across_versions, bool):
            raise OptionError(f"across_versions must be true or false, got {across_versions!r}")
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            got = state.get("version") if isinstance(state, dict) else state
            raise OptionError(f"unsupported {type(self).__name__} state version {got!r} "
                              f"(this shardkit writes {STATE_VERSION}; an older state's order "
                              "differs)")
        self._check_state(state)
        canonical = state["num_canonical"]
        grouped = state.get("canonical_world", canonical)  # absent: an older state, V = C
        if canonical % grouped:
            raise OptionError(f"cannot resume: the saved canonical_world={grouped} does not "
                              f"divide num_canonical={canonical}")
        if not self._canonical_given:
            try:
                self._check_canonical(canonical, "the saved num_canonical")
            except OptionError as exc:
                raise OptionError(f"cannot resume: {exc}") from None
        identity = self._identity()
        saved_versions, versions = state.get("store_version"), identity.pop("store_version", None)
        other = saved_versions != versions  # absent: version 1 (or a store that has none)
        if other and not across_versions:
            raise OptionError(f"cannot resume: saved store_version={saved_versions or [1]!r}, "
                              f"this sampler has {versions or [1]!r} (another version of the "
                              "store: open the saved one with ShardDataset(path, version=N) to "
                              "resume it, or pass across_versions=True to resume on the "
                              "records both versions share)")
        mine = {"num_canonical": canonical if not self._canonical_given else self.num_canonical,
                "canonical_world": grouped if not self._canonical_given
                else self.canonical_world, "seed": self.seed, "shuffle": self.shuffle,
                "drop_last": self.drop_last,
                **({} if other else identity)}  # the saved version's own: checked there
        for key, value in mine.items():
            if state.get(key, grouped if key == "canonical_world" else None) != value:
                why = ("another dataset: its shards' contents or sizes, layout or subset differ"
                       if key == "fingerprint" else "the order would differ")
                raise OptionError(f"cannot resume: saved {key}={state.get(key)!r}, this "
                                  f"sampler has {value!r} ({why})")
        found = bridge.resumed(state, other, self._bridge_from)
        total = self.total if found is None else len(found.indices)
        position = 0 if other else int(state["position"])
        if not 0 <= position <= total:
            raise OptionError(f"cannot resume: saved position {position!r} is outside "
                              f"0..{total}")
        if not self._canonical_given:
            self.num_canonical, self.canonical_world = int(canonical), int(grouped)
        self.epoch = int(state["epoch"])
        self._bridge = found
        w = self.num_replicas
        self._origin, self._skip = position % w, position // w
        self.consumed = self._skip

    def _bridge_from(self, state: dict[str, Any]) -> bridge.Bridge:
        """The rest of ``state``'s epoch, saved over another store version, on this one."""
        raise OptionError(f"across_versions: a {type(self).__name__} does not resume a state "
                          "saved over another store version")


    def _check_state(self, state: dict[str, Any]) -> None:
        """Every key a state holds, of its type (a hand-edited or damaged state is refused by
        name, before any of it is used)."""
        kinds: dict[str, tuple[str, Any]] = {
            "version": ("an integer", int), "epoch": ("an integer >= 0", 0),
            "position": ("an integer >= 0", 0), "consumed": ("an integer >= 0", 0),
            "num_replicas": ("an integer >= 1", 1), "num_canonical": ("an integer >= 1", 1),
            "seed": ("an integer", int), "shuffle": ("true or false", bool),
            "drop_last": ("true or false", bool)}
        if "canonical_world" in state:  # states written before it existed lack it
            kinds["canonical_world"] = ("an integer >= 1", 1)
        # store_version: absent from a state saved over version 1 (or its sampler's identity)
        expected = [*kinds, *(k for k in self._identity() if k != "store_version")]
        unknown = [key for key in state
                   if key not in [*expected, "canonical_world", "store_version", "bridge"]]
        missing = [key for key in expected if key not in state]
        name = type(self).__name__
        if unknown or missing:
            parts = ([f"no {', '.join(missing)}"] if missing else []) + \
                ([f"unknown {', '.join(map(str, unknown))}"] if unknown else [])
            raise OptionError(f"cannot resume: not a {name} state ({'; '.join(parts)})")
        for key, (what, kind) in kinds.items():
            value = state[key]
            if kind is bool:
                ok = isinstance(value, bool)
            else:
                ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) \
                    and (kind is int or value >= kind)
            if not ok:
                raise OptionError(f"cannot resume: the {name} state's {key} must be {what}, "
                                  f"got {value!r}")


class ShardSampler(OrderedSampler):
    """Distributed sampler that gives each rank a few whole shards (drop-in for DistributedSampler).

    Args:
        dataset: a ``ShardDataset`` (also a subset), a ``ConcatDataset`` of them, or any dataset
            with ``len()`` (one shard).
        num_replicas: number of ranks (default: ``torch.distributed`` world size).
        rank: this rank (default: ``torch.distributed`` rank).
        shuffle: shuffle shard order and each canonical run, per epoch. Without it, with the
            default ``num_canonical``, rank ``r`` reads one contiguous range in order.
        seed: base seed; must be the same on every rank.
        drop_last: drop the tail so every rank gets ``floor(N / R)`` distinct samples, instead of
            padding to ``ceil(N / R)`` by repeating samples.
        num_canonical: the canonical partition ``C``; the world size must divide it. The order,
            and exact resume, are the same at every world size that divides ``C``; each rank
            reads ``C / R`` runs (about ``S / R + C / R`` shards). Default: ``lcm(2R, 24)``
            with shuffle (resumes at ``R / 2``, ``2R`` and every divisor of 24), ``R`` without
            (each rank one contiguous range); see :func:`default_canonical`.

    Call ``set_epoch(epoch)`` before each epoch, as with ``DistributedSampler``. To checkpoint,
    save ``state_dict(consumed=samples_this_epoch)`` (or maintain ``sampler.consumed``); after
    ``load_state_dict`` the next ``iter()`` continues at exactly the next sample of that epoch;
    a state saved over another version of the store is refused, or resumed on the records both
    versions share with ``load_state_dict(state, across_versions=True)``
    (:mod:`shardkit.read.bridge`).
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 num_canonical: int | None = None) -> None:
        self.dataset = dataset
        self.groups = shard_groups(dataset)
        self.starts = self.groups.starts
        self._setup(self.groups.total, num_replicas, rank, shuffle, seed, drop_last,
                    num_canonical)
        store = getattr(dataset, "store", None)
        # A remote store's reads follow this rank's order, not k, k+1: the sampler prefetches.
        self._remote = store if getattr(store, "cache", None) is not None else None
        if self._remote is not None:
            self._remote.prefetch_next = False  # before the DataLoader sends it to its workers
        self._fingerprint = fingerprint(dataset, self.groups)

    def _groups(self, epoch: int) -> Groups:
        return self.groups

    def _bridge_from(self, state: dict[str, Any]) -> bridge.Bridge:
        return bridge.build(self.dataset, state, ShardSampler)

    def _identity(self) -> dict[str, Any]:
        versions = store_versions(self.dataset)
        return {**({"store_version": versions} if versions else {}),  # checked first
                "dataset_len": self.total, "num_shards": len(self.starts) - 1,
                "fingerprint": self._fingerprint}

    def __iter__(self) -> Iterator[int]:
        if self._remote is None or self._bridge is not None:
            return super().__iter__()
        return self._prefetching()

    def _prefetching(self) -> Iterator[int]:
        """This rank's indices; as the first index of each shard is handed out (to the
        DataLoader, which runs ahead of the workers' reads), the next shard starts downloading."""
        check_sampler_consumer(self)
        order = self.epoch_order()
        positions = order.at(order.places(self._origin, self.rank, self.num_replicas,
                                          self.drop_last, self._skip))
        shards = self.groups.group_of(positions)
        indices = self.groups.index(positions)
        first = np.sort(np.unique(shards, return_index=True)[1])
        sequence = shards[first].tolist()
        ends = [*first.tolist()[1:], len(indices)]
        for j, (start, end) in enumerate(zip(first.tolist(), ends)):
            self._remote.read_ahead(sequence[j:])  # this shard and the next few, several at once
            yield from indices[start:end].tolist()

    def shards_of_rank(self) -> list[int]:
        """Shard numbers this rank reads in the rest of the current epoch (sorted)."""
        if self._bridge is not None:  # positions of the bridged indices
            members = self.groups.members
            indices = self.indices()
            positions = indices if members is None else np.argsort(members)[indices]
            return np.unique(self.groups.group_of(positions)).tolist()
        order = self.epoch_order()
        positions = order.at(order.places(self._origin, self.rank, self.num_replicas,
                                          self.drop_last, self._skip))
        return np.unique(self.groups.group_of(positions)).tolist()
