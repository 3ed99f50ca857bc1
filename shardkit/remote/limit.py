"""``cache_limit``: what the whole cache folder holds, and making room in it (machine-wide).

Counted, over every store's folder under the cache root: each cached shard, and each download
in flight at its final size (``.NAME.SIZE-ID.part``, whose downloader holds an exclusive ``flock``
on it). A ``.part`` nobody holds was left by a killed download: it is deleted, not counted.
Eviction deletes the least recently *used* shards first (a fetch sets the mtime of the shard's
``.NAME.use``: the shard file itself is never changed once checked, see ``ShardCache``), never one
that some process holds (its ``.NAME.use`` lock); a shard downloaded ahead and not read yet
(``.NAME.ahead``) goes only after every other, the latest downloaded first (read-ahead runs in
reading order: the latest is read last), and never to make room for another read-ahead (which
would download what it then evicts). Every step runs under ``ROOT/.evict.lock``.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass

from ..fileutil import unlink
from .locks import close, evict_unused, locked, scandir, try_lock

LOCK_NAME = ".evict.lock"


@dataclass
class Usage:
    """What the cache root holds now."""

    total: int  # bytes: cached shards + downloads in flight (at their final size)
    evictable: list[tuple[bool, int, int, str]]  # (ahead, mtime_ns, bytes, path), in eviction order


def part_name(name: str, size: int, tag: str) -> str:
    return f".{name}.{size}-{tag}.part"


def in_flight(folder: str, name: str, size: int) -> bool:
    """Whether a download of ``name`` (``size`` bytes) into ``folder`` has its room: its
    ``.part`` file is there."""
    head = part_name(name, size, "")[:-len(".part")]
    return any(e.name.startswith(head) and e.name.endswith(".part") for e in scandir(folder))


def _reserved(part: str) -> int:
    size = part[:-len(".part")].rsplit(".", 1)[-1].split("-")[0]
    return int(size) if size.isdigit() else 0


def usage(root: str) -> Usage:
    """Scan the cache root (under the evict lock); orphaned ``.part`` files are deleted."""
    total, shards = 0, []
    for folder in scandir(root):
        if not folder.is_dir(follow_symlinks=False):
            continue
        entries = scandir(folder.path)
        names = {e.name: e for e in entries}
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.name.endswith(".part"):
                held = try_lock(entry.path, fcntl.LOCK_SH)
                if held is None:  # its downloader holds it: in flight
                    total += max(st.st_size, _reserved(entry.name))
                else:  # left by a killed download
                    unlink(entry.path)
                    close(held)
            elif f".{entry.name}.use" in names:
                total += st.st_size
                ahead = f".{entry.name}.ahead" in names
                try:
                    used = names[f".{entry.name}.use"].stat(follow_symlinks=False).st_mtime_ns
                except OSError:
                    used = st.st_mtime_ns
                shards.append((ahead, used, st.st_size, entry.path))
    shards.sort(key=lambda e: (e[0], -e[1] if e[0] else e[1]))
    return Usage(total, shards)


def make_room(root: str, limit: int, incoming: int, ahead: bool = False) -> bool:
    """Evict unused shards until ``incoming`` more bytes fit under ``limit``; True if they fit.
    ``ahead``: the room is for a read-ahead, which evicts no other read-ahead.

    The caller holds the evict lock."""
    use = usage(root)
    total = use.total + incoming
    for was_ahead, _, size, path in use.evictable:
        if total <= limit or (ahead and was_ahead):
            break
        if evict_unused(path):
            total -= size
    return total <= limit


def trim(root: str, limit: int) -> None:
    """Bring the cache back under ``limit`` (after shards were released)."""
    with locked(os.path.join(root, LOCK_NAME), fcntl.LOCK_EX):
        make_room(root, limit, 0)


def touch(path: str) -> None:
    """Mark cached shard ``path`` as just used, for least-recently-used eviction: the mtime of
    its ``.NAME.use`` (the shard's own times seal it as checked), an explicit nanosecond time
    (the kernel's own file times are coarse, and equal times would tie in the order)."""
    head, name = os.path.split(path)
    now = time.time_ns()
    try:
        os.utime(os.path.join(head, f".{name}.use"), ns=(now, now), follow_symlinks=False)
    except OSError:
        pass  # not there (a labels file: never evicted)


def release_held(held: dict[int, int], pid: int | None, root: str,
                 cache_limit: int | None) -> None:
    """Close the ``.use`` descriptors of ``held`` (in the process that took them) and trim."""
    if pid != os.getpid():
        return
    try:
        released = bool(held)
        for k in list(held):
            close(held.pop(k))
        if released and cache_limit is not None:
            trim(root, cache_limit)
    except Exception:  # noqa: BLE001 - also runs from a finalizer: never raise or print there
        pass
