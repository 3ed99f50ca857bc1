"""Places for read-ahead downloads, given in the order the downloads were asked for.

A read-ahead keeps ``n`` downloads at once. A download holds its place while it waits for its
turn, finds room and receives its bytes; checking and storing them (SHA-256, fsync, rename)
happens after it gave the place up, so the next download starts at once and the link is not
left idle meanwhile (its threads are more than ``n`` for that). Those extra threads must not
overtake: each download gets a ticket when it is asked for, and takes its place only once every
earlier ticket has taken one or given it up, so the shard read first is downloaded first.
"""

from __future__ import annotations

import threading


class Slots:
    """``n`` places, taken in ticket order (thread-safe)."""

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"read_ahead_depth must be a positive integer, got {n!r}")
        self._free = n
        self._next = 0  # the next ticket handed out
        self._turn = 0  # the lowest ticket that neither took a place nor closed
        self._resolved: set[int] = set()  # tickets resolved out of turn
        self._cond = threading.Condition()

    def place(self) -> "Place":
        """A place for one download, its ticket in the order of these calls."""
        with self._cond:
            self._next += 1
            return Place(self, self._next - 1)

    def _take(self, ticket: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._free > 0 and self._turn >= ticket)
            self._free -= 1
            self._resolve(ticket)

    def _give(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()

    def _resolve(self, ticket: int) -> None:
        with self._cond:
            if ticket >= self._turn:
                self._resolved.add(ticket)
            while self._turn in self._resolved:
                self._resolved.discard(self._turn)
                self._turn += 1
            self._cond.notify_all()


class Place:
    """One download's place: :meth:`take` (the first time once every earlier ticket is
    resolved; again, for a retry, as soon as a place is free), :meth:`give`, and :meth:`close`
    when the download is over or needed none (cached, another process's, no room, failed)."""

    def __init__(self, slots: Slots | None, ticket: int = 0) -> None:
        self._slots, self._ticket, self._held = slots, ticket, False

    def take(self) -> None:
        if self._slots is not None and not self._held:
            self._slots._take(self._ticket)
            self._held = True

    def give(self) -> None:
        if self._slots is not None and self._held:
            self._held = False
            self._slots._give()

    def close(self) -> None:
        if self._slots is not None:
            self.give()
            self._slots._resolve(self._ticket)  # later tickets need not wait for this one


#: The place of a download that is not a read-ahead's (a reader's own fetch): none to wait for.
NO_PLACE = Place(None)
