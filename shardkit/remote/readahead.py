"""How far a :class:`~.cache.ShardCache` downloads ahead of its reads: the depth
(:func:`default_read_ahead`) and the order in which one window's downloads get room in a
bounded cache (:class:`ReadAheadWindow`)."""

from __future__ import annotations

import threading

#: Downloads a process keeps in flight ahead of its reads (:meth:`ShardCache.read_ahead`): as many
#: shards as fit in READ_AHEAD_BYTES, within [READ_AHEAD_MIN, READ_AHEAD_MAX]. Small shards are
#: bound by round trips (more in flight hide them), large ones by bandwidth (a few fill the link,
#: and the bytes bound keeps what is fetched ahead of the reads bounded).
READ_AHEAD_MIN, READ_AHEAD_MAX = 4, 32
READ_AHEAD_BYTES = 1 << 30


def default_read_ahead(shard_bytes: list[int]) -> int:
    """The read-ahead depth for shards of these sizes (the largest counts)."""
    largest = max(shard_bytes, default=0)
    fit = READ_AHEAD_BYTES // largest if largest else READ_AHEAD_MAX
    return int(min(READ_AHEAD_MAX, max(READ_AHEAD_MIN, fit)))


class ReadAheadWindow:
    """The order in which one read-ahead window's downloads get room: position ``j`` asks only
    once every position before it has room, and gives up when one of them found none (room it
    took would be evicted again by the fetch of the earlier shard: downloaded twice)."""

    def __init__(self, size: int) -> None:
        self._placed: list[bool | None] = [None] * size
        self._cond = threading.Condition()

    def wait(self, j: int) -> bool:
        """Block until position ``j - 1`` is decided; True if every position before ``j`` has
        room."""
        if j == 0:
            return True
        with self._cond:
            self._cond.wait_for(lambda: self._placed[j - 1] is not None)
            return bool(self._placed[j - 1])

    def decide(self, j: int, placed: bool) -> None:
        """Position ``j`` has room (``placed``) or not; the first decision stands."""
        with self._cond:
            if self._placed[j] is None:
                self._placed[j] = placed and (j == 0 or bool(self._placed[j - 1]))
                self._cond.notify_all()
