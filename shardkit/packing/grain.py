"""How many shards one Dask task packs: short shards are grouped into tasks of about a second.

Dask spends a few milliseconds of a worker's core on every task (its messages through the
worker's event loop; about 4 ms here), nothing beside a shard of seconds but 4 % of a 0.1 s one
(1,000 images of 8x8), and more where the scheduler and client share the workers' cores. Dask's
best practices count about 1 ms of overhead a task and ask for tasks of 100 ms or more; at the
4 ms measured here, a task of a second keeps it under 0.5 %. The shard size is the user's
choice (``shard_size``, ``num_shards``) and says nothing about time, so the grain is measured:
until a shard has finished, a task packs one shard; after that, the next shards in line go into
one task while their images at the median rate of the latest finished shards fit in
:data:`TASK_SECONDS`.

Caps keep a group from costing what it saves: at most :data:`MOST_SHARDS` shards (a lost worker
costs its whole task); at most twice the largest group so far, so that a rate measured on a few
unusually fast shards (skipped files, small images first) grows the tasks step by step; and at
most the pending shards over twice the worker threads, so the last tasks shrink and every
thread has work to the end.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Iterator, Mapping, Sequence

#: The time a task aims at, in seconds.
TASK_SECONDS = 1.0
#: Shards in one task at most.
MOST_SHARDS = 64
RATES_KEPT = 64  # finished shards whose rate counts: the latest, so the estimate follows the data


class Grain:
    """Takes the next task's shards from the pending ones.

    Args:
        sizes: shard number -> its number of sources.
        most: shards in one task at most (1: one shard a task, as for an upload, whose task
            hands its thread on while the network sends).
        seconds: the time a task aims at (default: :data:`TASK_SECONDS` as it is then).
    """

    def __init__(self, sizes: Mapping[int, int], most: int = MOST_SHARDS,
                 seconds: float | None = None) -> None:
        if most < 1:
            raise ValueError(f"`most` must be at least 1, got {most}")
        self.sizes = sizes
        self.most = most
        self.seconds = TASK_SECONDS if seconds is None else seconds
        self.rates: deque[float] = deque(maxlen=RATES_KEPT)
        self.largest = 1

    def finished(self, k: int, seconds: float) -> None:
        """Shard ``k`` took ``seconds`` in its task."""
        if self.sizes[k] > 0:
            self.rates.append(seconds / self.sizes[k])

    def take(self, pending: deque[int], threads: int) -> list[int]:
        """Pop the next task's shards (one at least) from the front of ``pending``, for a
        cluster of ``threads`` worker threads."""
        group = [pending.popleft()]
        if not self.rates:
            return group
        rate = statistics.median(self.rates)
        most = min(self.most, 2 * self.largest,
                   max(1, (len(pending) + 1) // (2 * max(1, threads))))
        budget = self.seconds - rate * self.sizes[group[0]]
        while pending and len(group) < most and rate * self.sizes[pending[0]] <= budget:
            budget -= rate * self.sizes[pending[0]]
            group.append(pending.popleft())
        self.largest = max(self.largest, len(group))
        return group


class ShardSizes(Mapping):
    """Shard number -> its number of sources, from a plan's shard bounds (``bounds[k]`` to
    ``bounds[k + 1]``), worked out when asked: no object per shard."""

    def __init__(self, bounds: Sequence[int]) -> None:
        self.bounds = bounds

    def __getitem__(self, k: int) -> int:
        if not 0 <= k < len(self.bounds) - 1:
            raise KeyError(k)
        return self.bounds[k + 1] - self.bounds[k]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.bounds) - 1))

    def __len__(self) -> int:
        return len(self.bounds) - 1


def named(shards: list[int]) -> str:
    """``shard 3``, ``shards 3-12`` (consecutive numbers) or ``shards 3, 5, 9`` (a resume's or
    a node's shards need not be): for messages."""
    if len(shards) == 1:
        return f"shard {shards[0]}"
    if shards == list(range(shards[0], shards[-1] + 1)):
        return f"shards {shards[0]}-{shards[-1]}"
    return "shards " + ", ".join(map(str, shards))
