"""The machine-wide cache of a remote store's shards (see :mod:`shardkit.remote`)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import threading
import time
import uuid
import weakref
from typing import Any, Callable

from ..errors import StoreError
from ..fileutil import has_size, sha256_file, unlink
from . import access, limit
from .access import LocalFault, RemoteFolder, default_cache_dir
from .background import Background
from .failures import local_fault
from .locks import locked, open_lock, read_side, remove_side, touch_side, try_lock, write_side
from .limit import release_held
from .locks import close as close_lock
from .readahead import ReadAheadWindow, default_read_ahead
from .slots import NO_PLACE, Place, Slots

#: A shard's seal is written this long after its last change (ctime) at the earliest: longer than
#: the kernel's coarse timestamp tick (a jiffy: 1-10 ms), so a later write changes its ctime.
SEAL_MARGIN_NS = 20_000_000


#: How often a read-ahead looks whether another process's download of its shard has its room.
AHEAD_POLL_SECONDS = 0.005


def _seal(st: os.stat_result, sha256: str) -> dict[str, Any]:
    return {"sha256": sha256, "bytes": st.st_size, "dev": st.st_dev, "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


class ShardCache:
    """Shards of one :class:`RemoteFolder`, staged in a local folder shared by all processes.

    Picklable: a DataLoader worker gets its own locks, threads and filesystem on first use.
    At most ``read_ahead_depth`` read-ahead downloads of this process run at once (as many more
    may be checking and storing what they received: :mod:`shardkit.remote.slots`).
    """

    def __init__(self, remote: RemoteFolder, cache_dir: str | os.PathLike | None = None,
                 cache_limit: int | None = None) -> None:
        if cache_limit is not None:
            if isinstance(cache_limit, bool) or not isinstance(cache_limit, int) or cache_limit < 1:
                raise ValueError(f"cache_limit must be a positive number of bytes, got "
                                 f"{cache_limit!r}")
            largest = max((e["bytes"] for e in remote.meta["shards"]), default=0)
            if largest > cache_limit:
                raise ValueError(f"cache_limit ({cache_limit} bytes) is smaller than the largest "
                                 f"shard of {remote.url} ({largest} bytes)")
        self.remote = remote
        self.cache_limit = cache_limit
        self.read_ahead_depth = default_read_ahead([e["bytes"] for e in remote.meta["shards"]])
        self.root = os.path.abspath(os.fspath(cache_dir) if cache_dir is not None
                                    else default_cache_dir())
        key = hashlib.sha256(f"{remote.url}\n{remote.manifest_sha256}".encode()).hexdigest()
        self.folder = os.path.join(self.root, key[:24])
        self._make_folder()
        self._pid: int | None = None
        self._claim()

    def _make_folder(self) -> None:
        """Make (or find) the cache root and this store's folder in it, private to this user:
        a folder another user may write to, or owns, is refused (they could plant a symbolic
        link at a side file's name, or replace a checked shard)."""
        for folder in (self.root, self.folder):
            try:
                os.makedirs(folder, mode=0o755, exist_ok=True)
                st = os.stat(folder)
            except OSError as exc:
                raise StoreError(f"cannot create the cache folder {folder}: {exc.strerror} "
                                 "(check cache_dir)") from None
            if st.st_uid != os.geteuid():
                raise StoreError(f"cache folder {folder} is owned by another user (uid "
                                 f"{st.st_uid}): refused, a cache must be this user's own "
                                 "(check cache_dir)")
            if st.st_mode & 0o022:
                raise StoreError(f"cache folder {folder} is writable by other users (mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}): refused, they could plant "
                                 f"files in it; make it private (chmod go-w) or choose another "
                                 "cache_dir")

    # -- per-process state --------------------------------------------------------------------

    def _claim(self) -> None:
        if self._pid != os.getpid():
            # Inherited lock descriptors were closed at the fork (see .locks); the parent's stay.
            self._held: dict[int, int] = {}
            self._pending: set[int] = set()
            self._pool: Background | None = None
            self._slots: Slots | None = None  # the read-ahead's places, made with _pool
            self._lock = threading.Lock()
            self._pid = os.getpid()
            # A cache dropped without close() releases its shards (descriptors, locks) too.
            self._finalizer = weakref.finalize(self, release_held, self._held, self._pid,
                                               self.root, self.cache_limit)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_held", "_pending", "_pool", "_slots", "_lock", "_finalizer"):
            state.pop(key, None)
        state["_pid"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._claim()

    # -- reading ------------------------------------------------------------------------------

    def path(self, k: int) -> str:
        """Where shard ``k`` lies once fetched."""
        return os.path.join(self.folder, self.remote.meta["shards"][k]["file"])

    def fetch(self, k: int, on_full: Callable[[], bool] | None = None) -> str:
        """Local path of shard ``k``, downloaded and checked first if needed.

        The shard stays in use (never evicted) until :meth:`release` or the process exits.
        When the cache is full of shards in use, ``on_full()`` is called to release one of this
        process's (True if it did) before the download goes over the limit.
        """
        self._claim()
        entry = self.remote.meta["shards"][k]
        path = self.path(k)
        fd = self._use_lock(entry["file"])
        try:
            if not has_size(path, entry["bytes"]) or not self._sealed(entry["file"],
                                                                      entry["sha256"]):
                self._download(entry["file"], entry["bytes"], entry["sha256"], on_full=on_full,
                               cached=lambda: self._checked(entry["file"], entry["bytes"],
                                                            entry["sha256"]))
            limit.touch(path)  # last use, for LRU eviction
            remove_side(self.side_file(entry["file"], "ahead"))  # read now: evicted as any other
        except BaseException:
            close_lock(fd)
            raise
        old = self._held.pop(k, None)
        if old is not None:
            close_lock(old)
        self._held[k] = fd
        return path

    def _use_lock(self, name: str) -> int:
        """Hold ``.NAME.use`` shared; a cache folder removed while in use is made again."""
        if not os.path.isdir(self.folder):
            self._make_folder()
        return open_lock(self.side_file(name, "use"), fcntl.LOCK_SH)

    def release(self, k: int) -> None:
        """This process no longer reads shard ``k``: it may be evicted (the cache is brought
        back under ``cache_limit`` now)."""
        self._claim()
        fd = self._held.pop(k, None)
        if fd is not None:
            close_lock(fd)
            if self.cache_limit is not None:
                limit.trim(self.root, self.cache_limit)

    def close(self) -> None:
        self._claim()
        release_held(self._held, self._pid, self.root, self.cache_limit)

    def read_ahead(self, shards: Any) -> None:
        """This process reads ``shards`` next, in this order: download the first
        ``read_ahead_depth`` of them that are not cached yet, several at once, in background
        threads. A shard another process downloads is left to it, and a download that would go
        over ``cache_limit`` is not started. Room is given in this order
        (:class:`~.readahead.ReadAheadWindow`): a shard is not downloaded ahead of one before it
        that found no room, which its fetch would then evict. Errors are dropped here: the :meth:`fetch` that needs the shard reports them."""
        self._claim()
        meta = self.remote.meta["shards"]
        window = [int(k) for k in list(shards)[:self.read_ahead_depth]]
        todo = [k for k in window if not has_size(self.path(k), meta[k]["bytes"])]
        with self._lock:
            todo = [k for k in todo if k not in self._pending]
            if not todo:
                return
            if self._pool is None:  # twice the threads of the places: see Slots
                self._slots = Slots(self.read_ahead_depth)
                # daemon threads: exit does not wait for a stalled download (see .background)
                self._pool = Background(2 * self.read_ahead_depth, "shardkit-prefetch")
            self._pending.update(todo)
            order = ReadAheadWindow(len(todo))
            for j, k in enumerate(todo):  # FIFO: position j starts no later than j + 1
                self._pool.submit(self._prefetch, k, order, j, self._slots.place())

    def prefetch(self, k: int) -> None:
        """Start downloading shard ``k`` in the background (:meth:`read_ahead` of one)."""
        self.read_ahead([k])

    def wait_read_ahead(self) -> None:
        """Block until this process's background downloads are done (for tests and tools)."""
        self._claim()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _prefetch(self, k: int, order: ReadAheadWindow, j: int, place: Place) -> None:
        entry = self.remote.meta["shards"][k]
        try:
            place.take()  # in reading order, like the window's room
            if order.wait(j):
                self._download(entry["file"], entry["bytes"], entry["sha256"], wait=False,
                               placed=lambda: order.decide(j, True), place=place)
        except Exception:  # noqa: BLE001 - see read_ahead()
            pass
        finally:
            order.decide(j, False)  # no room, a failure, an error: the rest of the window waits
            place.close()
            with self._lock:
                self._pending.discard(k)

    def labels(self) -> str:
        """Local path of the store's ``labels.npy``, downloaded and checked first if needed."""
        labels = self.remote.meta["labels"]
        return self.file(labels["file"], labels["sha256"])

    def file(self, name: str, sha256: str) -> str:
        """Local path of another file the manifest names (``labels.npy``, ``layout.npy``),
        downloaded and checked first if needed (a damaged cached copy is fetched again)."""
        path = os.path.join(self.folder, name)
        if not (has_size(path, None) and sha256_file(path) == sha256):
            self._download(name, None, sha256, cached=lambda: has_size(path, None)
                           and sha256_file(path) == sha256)
        return path

    def side_file(self, name: str, kind: str) -> str:
        """The side file of cached file ``name``: kind "dl" (locked while downloading), "use"
        (locked shared while in use), "failed" (the last download's failure), "ahead"
        (downloaded ahead, not read yet) or "seal" (the shard file as it was checked)."""
        return os.path.join(self.folder, f".{name}.{kind}")

    # -- the seal of a checked shard ----------------------------------------------------------

    def _sealed(self, name: str, sha256: str) -> bool:
        """Whether cached shard ``name`` is the very file that was checked against ``sha256``
        (its seal: size, device, inode, mtime and ctime then): a file written, replaced or given
        back its old mtime since has another ctime or inode. One stat and one small read."""
        try:
            st = os.stat(os.path.join(self.folder, name))
        except OSError:
            return False
        raw = read_side(self.side_file(name, "seal"))
        try:
            return raw is not None and json.loads(raw) == _seal(st, sha256)
        except ValueError:
            return False

    def _checked(self, name: str, size: int, sha256: str) -> bool:
        """Whether cached shard ``name`` is sound (under its download lock): sealed, or else
        hashed now (a cache from before seals, or a file changed on disk) and sealed when it
        matches; False when it must be downloaded again."""
        path = os.path.join(self.folder, name)
        if not has_size(path, size):
            return False
        if self._sealed(name, sha256):
            return True
        if sha256_file(path) != sha256:
            return False
        self._seal(name, sha256)
        return True

    def _seal(self, name: str, sha256: str) -> None:
        """Record cached shard ``name`` as checked. The kernel's file times are coarse (a
        write within the same tick as the check would keep its ctime): the record is written
        only once that tick is over, so any later change shows."""
        path = os.path.join(self.folder, name)
        st = os.stat(path)
        early = SEAL_MARGIN_NS - (time.time_ns() - st.st_ctime_ns)
        if early > 0:
            time.sleep(early / 1e9)
        try:
            write_side(self.side_file(name, "seal"), json.dumps(_seal(st, sha256)).encode())
        except OSError:
            pass  # unsealed: hashed again at its next open

    def _download(self, name: str, size: int | None, sha256: str, *, wait: bool = True,
                  on_full: Callable[[], bool] | None = None,
                  cached: Callable[[], bool] | None = None,
                  placed: Callable[[], None] = lambda: None,
                  place: Place = NO_PLACE) -> bool:
        """Download ``name`` into the cache once per machine (whoever holds ``.NAME.dl`` does it).

        ``wait=False`` (read-ahead): skip when another download of it is under way or it would
        not fit under the limit; returns whether the file is there. ``placed()`` is called once
        the file has its room: cached, downloading elsewhere, or reserved here. A process that waited for
        another's download that failed gets that failure, not a retry chain of its own: one
        deadline per shard per machine.
        """
        path = os.path.join(self.folder, name)
        if cached is None:
            def cached() -> bool:
                return has_size(path, size)
        started = time.time_ns()
        dl = self.side_file(name, "dl")
        if wait:
            fd = self._wait_download(name, size, dl)
        else:
            fd = self._lock_ahead(name, size, dl, placed)
            if fd is None:
                return False
        try:
            if cached():
                placed()
                return True  # another process or thread finished it while we waited
            failure = self._failure(name, started)
            if failure is not None:
                if not wait:
                    return False
                raise StoreError(failure)
            reserved = self._reserve(name, size or 0, force=wait, on_full=on_full)
            if reserved is None:
                return False
            placed()
            part, part_fd = reserved
            try:
                self._transfer(name, size, sha256, part, path, ahead=not wait, place=place)
            except LocalFault:
                raise
            except StoreError as exc:
                self._record_failure(name, str(exc))
                raise
            finally:
                unlink(part)
                close_lock(part_fd)
            return True
        finally:
            close_lock(fd)

    def _lock_ahead(self, name: str, size: int | None, dl: str,
                    placed: Callable[[], None]) -> int | None:
        """``dl`` held exclusively for a read-ahead, or None when another download of ``name``
        holds it. That download has room for the shard once its ``.part`` (or the shard) is
        there, and only then is ``placed()`` called: room given to the later shards of the window
        before it would be evicted again by that download (each downloaded twice). A holder that
        neither makes room nor lets go within one download's deadline (a stopped process) leaves
        the window without room."""
        path = os.path.join(self.folder, name)
        deadline = time.monotonic() + access.transfer_deadline(size or 0)
        while True:
            fd = try_lock(dl, fcntl.LOCK_EX, create=True)
            if fd is not None:
                return fd
            if has_size(path, size) or limit.in_flight(self.folder, name, size or 0):
                placed()
                return None
            if time.monotonic() > deadline:
                return None
            time.sleep(AHEAD_POLL_SECONDS)

    def _wait_download(self, name: str, size: int | None, dl: str) -> int:
        """Hold ``dl`` exclusively, waiting for another download of ``name`` no longer than its
        whole retry chain may take (every attempt at its deadline, the pauses between them, and
        as long again for checking and storing): a downloader that is stuck (a stopped process)
        is reported, not waited for forever."""
        delays = access.RETRY_DELAYS
        bound = ((len(delays) + 1) * 2 * access.transfer_deadline(size or 0) + sum(delays))
        fd = open_lock(dl, fcntl.LOCK_EX, wait=bound)
        if fd is None:
            raise StoreError(f"{self.remote.where(name)}: another process has been downloading "
                             f"it into {self.folder} for {bound:g} s, longer than its downloads "
                             "may take (SHARDKIT_TRANSFER_TIMEOUT, SHARDKIT_TRANSFER_MIN_RATE); "
                             f"check for a stopped process holding {dl}")
        return fd

    def _transfer(self, name: str, size: int | None, sha256: str, part: str, path: str,
                  ahead: bool, place: Place = NO_PLACE) -> None:
        """Get ``name`` into ``part`` holding ``place`` (a read-ahead's), then give it up and
        check and store it as ``path``: the next download need not wait for the check."""
        delays = access.RETRY_DELAYS
        for attempt in range(len(delays) + 1):
            place.take()  # a retry's
            try:
                self.remote.get(name, part, local=lambda exc: local_fault(exc, part, self.remote.where),
                                size=size)
            finally:
                place.give()
            try:
                if (size is None or os.path.getsize(part) == size) and \
                        sha256_file(part) == sha256:
                    with open(part, "rb") as f:
                        os.fsync(f.fileno())
                    if size is not None:  # a shard: counted and evicted from now on
                        touch_side(self.side_file(name, "use"))
                    if ahead:
                        touch_side(self.side_file(name, "ahead"))
                    os.replace(part, path)
                    limit.touch(path)
                    if size is not None:
                        self._seal(name, sha256)
                    remove_side(self.side_file(name, "failed"))
                    return
            except OSError as exc:
                raise LocalFault(local_fault(exc, part, self.remote.where) or
                                 f"cache file {part}: {exc.strerror}") from None
            if attempt < len(delays):
                time.sleep(delays[attempt])
        raise StoreError(f"{self.remote.where(name)}: object is damaged or replaced: its size or "
                         f"SHA-256 differs from the manifest ({attempt + 1} downloads)")

    def _failure(self, name: str, since_ns: int) -> str | None:
        """The failure another download of ``name`` recorded after ``since_ns``, if any."""
        raw = read_side(self.side_file(name, "failed"))
        try:
            record = json.loads(raw) if raw is not None else None
            return record["message"] if record and record["time_ns"] >= since_ns else None
        except (ValueError, KeyError, TypeError):
            return None

    def _record_failure(self, name: str, message: str) -> None:
        try:
            write_side(self.side_file(name, "failed"),
                       json.dumps({"time_ns": time.time_ns(), "message": message}).encode())
        except OSError:
            pass  # waiters then try on their own

    # -- cache limit --------------------------------------------------------------------------

    def _reserve(self, name: str, size: int, force: bool,
                 on_full: Callable[[], bool] | None = None) -> tuple[str, int] | None:
        """A locked ``.part`` file for a download of ``size`` bytes, with room made for it.

        Without room (every cached shard in use): ``on_full()`` releases this process's own
        shards one by one; then a fetch (``force``) goes over the limit by this one shard, and
        a read-ahead gives up (None).
        """
        part = os.path.join(self.folder, limit.part_name(name, size, uuid.uuid4().hex[:12]))
        while True:
            if self.cache_limit is None:
                return part, open_lock(part, fcntl.LOCK_EX, new=True)
            with locked(os.path.join(self.root, limit.LOCK_NAME), fcntl.LOCK_EX):
                fits = limit.make_room(self.root, self.cache_limit, size, ahead=not force)
                if fits or (force and on_full is None):
                    # created under the evict lock: counted by every later eviction
                    return part, open_lock(part, fcntl.LOCK_EX, new=True)
                if not force:
                    return None
            if not on_full():  # outside the evict lock: a release trims under it
                on_full = None
