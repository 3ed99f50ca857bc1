"""The machine-wide cache of a remote store's shards (see :mod:`shardkit.remote`)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
import uuid
from typing import Any

from ..errors import StoreError
from ..fileutil import has_size, sha256_file, unlink
from . import access
from .access import RemoteFolder, default_cache_dir
from .locks import evict_unused, locked, open_lock, scandir


class ShardCache:
    """Shards of one :class:`RemoteFolder`, staged in a local folder shared by all processes.

    Picklable: a DataLoader worker gets its own locks and filesystem on first use.
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
        self.root = os.path.abspath(os.fspath(cache_dir) if cache_dir is not None
                                    else default_cache_dir())
        key = hashlib.sha256(f"{remote.url}\n{remote.manifest_sha256}".encode()).hexdigest()
        self.folder = os.path.join(self.root, key[:24])
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the cache folder {self.folder}: {exc.strerror}") \
                from None
        self._pid: int | None = None
        self._claim()

    # -- per-process state --------------------------------------------------------------------

    def _claim(self) -> None:
        if self._pid != os.getpid():
            # Inherited descriptors share the parent's locks: closing ours leaves the parent's.
            for fd in getattr(self, "_held", {}).values():
                os.close(fd)
            self._held: dict[int, int] = {}
            self._prefetching: dict[int, threading.Thread] = {}
            self._lock = threading.Lock()
            self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_held", "_prefetching", "_lock"):
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

    def fetch(self, k: int) -> str:
        """Local path of shard ``k``, downloaded and checked first if needed.

        The shard stays in use (never evicted) until :meth:`release` or the process exits.
        """
        self._claim()
        entry = self.remote.meta["shards"][k]
        path = self.path(k)
        fd = open_lock(self.side_file(entry["file"], "use"), fcntl.LOCK_SH)
        try:
            if not has_size(path, entry["bytes"]):
                self._download(entry["file"], entry["bytes"], entry["sha256"])
            try:
                os.utime(path)  # last use, for LRU eviction
            except OSError:
                pass  # another user's file in a shared cache: its order stays as it was
        except BaseException:
            os.close(fd)
            raise
        old = self._held.pop(k, None)
        if old is not None:
            os.close(old)
        self._held[k] = fd
        return path

    def release(self, k: int) -> None:
        """This process no longer reads shard ``k``: it may be evicted."""
        self._claim()
        fd = self._held.pop(k, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self._claim()
        for k in list(self._held):
            self.release(k)

    def prefetch(self, k: int) -> threading.Thread | None:
        """Download shard ``k`` in a background thread, unless cached or already under way.

        Errors are dropped here: the :meth:`fetch` that needs the shard retries and reports them.
        """
        self._claim()
        entry = self.remote.meta["shards"][k]
        if has_size(self.path(k), entry["bytes"]):
            return None
        with self._lock:
            running = self._prefetching.get(k)
            if running is not None and running.is_alive():
                return running
            thread = threading.Thread(target=self._prefetch, args=(entry,), daemon=True,
                                      name=f"shardkit-prefetch-{k}")
            self._prefetching[k] = thread
        thread.start()
        return thread

    def _prefetch(self, entry: dict[str, Any]) -> None:
        try:
            with locked(self.side_file(entry["file"], "use"), fcntl.LOCK_SH):
                if not has_size(os.path.join(self.folder, entry["file"]), entry["bytes"]):
                    self._download(entry["file"], entry["bytes"], entry["sha256"])
        except Exception:  # noqa: BLE001 - see prefetch()
            pass

    def labels(self) -> str:
        """Local path of the store's ``labels.npy``, downloaded and checked first if needed."""
        labels = self.remote.meta["labels"]
        path = os.path.join(self.folder, labels["file"])
        if not os.path.exists(path):
            self._download(labels["file"], None, labels["sha256"])
        return path

    def side_file(self, name: str, kind: str) -> str:
        """The lock file of cached file ``name``: kind "dl" (held while downloading) or "use"."""
        return os.path.join(self.folder, f".{name}.{kind}")

    def _download(self, name: str, size: int | None, sha256: str) -> None:
        """Download ``name`` into the cache once (whoever holds ``.NAME.dl`` does it)."""
        path = os.path.join(self.folder, name)
        where = self.remote.where(name)
        with locked(self.side_file(name, "dl"), fcntl.LOCK_EX):
            if has_size(path, size):
                return  # another process or thread finished it while we waited
            for entry in os.scandir(self.folder):  # left by a killed download
                if entry.name.startswith(f".{name}.") and entry.name.endswith(".part"):
                    unlink(entry.path)
            part = self._reserve(name, size or 0)
            try:
                for attempt in range(len(access.RETRY_DELAYS) + 1):
                    self.remote.get(name, part)
                    got = os.path.getsize(part)
                    if (size is None or got == size) and sha256_file(part) == sha256:
                        with open(part, "rb") as f:
                            os.fsync(f.fileno())
                        os.replace(part, path)
                        return
                    if attempt < len(access.RETRY_DELAYS):
                        time.sleep(access.RETRY_DELAYS[attempt])
                raise StoreError(f"{where}: object is damaged or replaced: its size or SHA-256 "
                                 f"differs from the manifest ({attempt + 1} downloads)")
            finally:
                unlink(part)

    # -- cache limit --------------------------------------------------------------------------

    def _reserve(self, name: str, size: int) -> str:
        """A ``.part`` name for a download of ``size`` bytes; room made for it under the limit."""
        part = os.path.join(self.folder, f".{name}.{size}-{uuid.uuid4().hex[:12]}.part")
        if self.cache_limit is not None:
            with locked(os.path.join(self.root, ".evict.lock"), fcntl.LOCK_EX):
                self._evict(size)
                open(part, "wb").close()  # counted by other processes' evictions from now on
        return part

    def _evict(self, incoming: int) -> None:
        assert self.cache_limit is not None
        total, shards = incoming, []
        for folder in scandir(self.root):
            if not folder.is_dir(follow_symlinks=False):
                continue
            entries = list(scandir(folder.path))
            names = {e.name for e in entries}
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.name.endswith(".part"):
                    reserved = entry.name[:-len(".part")].rsplit(".", 1)[-1].split("-")[0]
                    total += max(st.st_size, int(reserved) if reserved.isdigit() else 0)
                elif f".{entry.name}.use" in names:
                    total += st.st_size
                    shards.append((st.st_mtime_ns, st.st_size, entry.path))
        for _, size, path in sorted(shards):
            if total <= self.cache_limit:
                break
            if evict_unused(path):
                total -= size

