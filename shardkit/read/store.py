"""A packed store opened for reading: one shard file, or a folder of shards with a manifest.

Creating a Store reads only metadata and keeps no file handle or lock; it remembers which file
(device, inode, size, mtime) or which manifest (its SHA-256) that metadata came from. The first
use in a process checks that the store is still that one (else ``StoreError``: "... was
replaced ...", never new records under old metadata) and pins it: a descriptor of the single
file, or a shared ``flock`` on the manifest (see :mod:`shardkit.swap`). ``close()`` releases every
descriptor and lock. Handles are tagged with the owning pid, so one inherited over fork is never
read from; a pin inherited from a parent that had opened the store is adopted, so a forked worker
keeps reading what its parent read.

At most ``max_open_shards`` shards are open per process (the least recently used is closed
first; by default a quarter of the open-file limit), one descriptor each. Index arrays are
memory-mapped views of the shard file, never Python objects: a worker's private memory does not
grow with the number of records. Opening and checking one shard file is :mod:`shardkit.read.shard`.

Many threads may read one store at once (``ds.loader(engine="threads")``): the open shards and
their LRU order change under one lock, and a shard is opened by one thread while the others
wait for it (only those: a download of a remote shard does not stop reads of open ones). The
LRU *retires* a shard rather than closing it: the store lets go of it, and its reader closes
when the last batch still reading it (in another thread) lets go too, by reference count (at
once when none does, so one thread reads exactly as before). Closing it under a reader would
leave that reader's LMDB transaction reading unmapped memory. ``close()`` closes every shard at
once, as before.

A URL (``s3://bucket/prefix``, any fsspec URL) is a folder store in object storage, read through
a local :class:`shardkit.remote.ShardCache`: the manifest and ``labels.npy`` are fetched at
construction; a shard is downloaded (once per machine, SHA-256 checked) when a process first
opens it, and released to the cache's LRU eviction when it is closed. Nothing is pinned: a cached
shard never changes (its folder is keyed by the manifest's SHA-256). When a process opens shard k
as its first shard, or right after k-1 (reading in order), shards k+1.. are read ahead (several
downloads at once, :meth:`Store.read_ahead`); under a ``ShardSampler``, the sampler instead reads
ahead its rank's next shards as it hands out the first index of each (see
:mod:`shardkit.read.sampler`). A full cache closes this process's least recently used shards
before it downloads another (``cache_limit`` holds machine-wide).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .. import metadata, storemeta, swap, versions
from ..errors import OptionError, StoreError
from ..fileutil import file_size, sha256_file
from ..forklock import ForkLock
from ..urls import is_url
from .indices import locate_many
from .shard import OpenShard, ShardEntry, checked_array, open_pinned
# disk_bytes: a name this module has always offered
from .storefiles import check_record_arrays, default_max_open_shards, disk_bytes  # noqa: F401


# Serialises each store's first use in a process (threads may start it together); made again in
# a forked child, where a thread of the parent may have held it.
_CLAIMING = ForkLock()


class Store:
    """Metadata of a store plus lazy, per-process access to its shards.

    Picklable: pickling drops every open shard and pin; the receiving process reopens on first
    use (and refuses a store replaced since this one was created).
    """

    def __init__(self, path: str | os.PathLike, max_open_shards: int | None = None, *,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None,
                 storage_options: dict[str, Any] | None = None,
                 version: int | None = None) -> None:
        if max_open_shards is not None and (isinstance(max_open_shards, bool) or not isinstance(
                max_open_shards, int) or max_open_shards < 1):
            raise OptionError("max_open_shards must be a positive integer or None, "
                              f"got {max_open_shards!r}")
        self.path = os.fspath(path)
        self.max_open_shards = max_open_shards
        #: The local cache of a remote store (None for a local one).
        self.cache: Any = None
        versions.check_version(version, self.path, is_url(self.path))
        if is_url(self.path):
            self._init_remote(cache_dir, cache_limit, storage_options, version)
        elif os.path.isdir(self.path):
            self._init_sharded(version)
        elif os.path.exists(self.path):
            self._init_single()
        else:
            raise StoreError(f"store not found: {self.path}")
        self.count: int = self.meta["count"]
        self.classes: list[str] = self.meta["classes"]
        self.class_to_idx: dict[str, int] = self.meta["class_to_idx"]
        self.settings: dict[str, Any] = self.meta["settings"]
        self.encoding: str = self.settings["encoding"]
        self.skipped: list[dict[str, str]] = self.meta.get("skipped", [])
        #: which version of the store this is (:mod:`shardkit.versions`; 1: never changed)
        self.version: int = versions.number_of(self.meta)
        self.starts = np.array([e.start for e in self.shards] + [self.count], dtype=np.int64)
        #: A remote store prefetches shard k+1 while reads go k-1, k; a ``ShardSampler`` turns
        #: this off and prefetches the next shard of its rank's own order instead.
        self.prefetch_next = True
        self._pid: int | None = None
        self._pin: swap.Pin | None = None
        self._open: OrderedDict[int, OpenShard] = OrderedDict()
        self._lock = threading.RLock()  # per process: made again by _claim after a fork
        self._opening: dict[int, threading.Lock] = {}  # shard -> held by the thread opening it

    def _init_single(self) -> None:
        try:
            pin = swap.open_identity(self.path)
        except OSError as exc:
            raise StoreError(f"cannot open {self.path}: {exc.strerror}") from None
        try:
            reader = open_pinned(ShardEntry(self.path, None, 0, 0), pin)
            try:
                meta = storemeta.parse_shard_meta(reader.meta_json(), self.path)
                self._labels = np.array(checked_array(reader, "labels", meta["arrays"]["labels"],
                                                      self.path))
            finally:
                reader.close()
        finally:
            pin.close()
        if meta["kind"] != "single":
            raise StoreError(f"{self.path} is one shard of a multi-shard store; open the folder "
                             "that holds its manifest.json")
        self._identity: tuple[int, ...] | str = pin.identity
        self.meta = meta
        self.shards = [ShardEntry(self.path, None, 0, meta["count"])]
        self._labels_file: str | None = None

    def _init_sharded(self, version: int | None = None) -> None:
        self._manifest_path = manifest_path = versions.manifest_path(self.path, version)
        limit = metadata.MAX_MANIFEST_BYTES
        try:
            size = file_size(manifest_path)
        except StoreError:
            if not os.path.lexists(manifest_path):
                raise StoreError(f"{self.path} is a folder without {metadata.MANIFEST_NAME}: "
                                 "not a shardkit store, or a pack that did not finish") from None
            raise
        if size > limit:  # refused unread
            raise StoreError(f"{manifest_path}: manifest is implausibly large ({size} bytes; at "
                             f"most {limit} are read)")
        try:
            raw, pin = swap.read_manifest_pinned(manifest_path, limit)
        except FileNotFoundError:
            raise StoreError(f"{self.path} is a folder without {metadata.MANIFEST_NAME}: not a "
                             "shardkit store, or a pack that did not finish") from None
        except OSError as exc:
            raise StoreError(f"cannot read {manifest_path}: {exc.strerror}") from None
        try:  # the first use locks the manifest again, and checks it is still these bytes
            if len(raw) > limit:  # grown since it was measured
                raise StoreError(f"{manifest_path}: manifest is implausibly large (over {limit} "
                                 "bytes)")
            self._identity = hashlib.sha256(raw).hexdigest()
            self.meta = storemeta.parse_manifest(raw, manifest_path)
            self.shards = [ShardEntry.of(os.path.join(self.path, e["file"]), e)
                           for e in self.meta["shards"]]
            self._labels_file = os.path.join(self.path, self.meta["labels"]["file"])
            self._real = os.path.realpath(self.path)
            kept = versions.path_of(self.path, versions.number_of(self.meta))
            if version is None and versions.KEY in self.meta and os.path.exists(kept):
                # The version this manifest is never changes: its readers keep reading it
                # while newer ones are installed (the same file while it is the latest).
                self._manifest_path = kept
            # While the manifest is locked: its files cannot be collected meanwhile.
            check_record_arrays(self.meta, lambda name, sha256: os.path.join(self.path, name),
                                manifest_path)
        finally:
            pin.close()

    def _init_remote(self, cache_dir: str | os.PathLike | None, cache_limit: int | None,
                     storage_options: dict[str, Any] | None, version: int | None) -> None:
        from ..remote import RemoteFolder, ShardCache

        # The cache is keyed by the manifest's SHA-256: each version read is its own, and a
        # reader keeps the version it opened while newer ones are installed.
        self.cache = cache = ShardCache(RemoteFolder(self.path, storage_options, version),
                                        cache_dir, cache_limit)
        if cache_limit is not None and self.max_open_shards is None:
            # Open shards are in use and never evicted: a process holds no more than fit.
            largest = max((e["bytes"] for e in cache.remote.meta["shards"]), default=1)
            self.max_open_shards = max(1, cache_limit // max(largest, 1))
        self.path = cache.remote.url
        self.meta = cache.remote.meta
        self._identity = cache.remote.manifest_sha256
        self.shards = [ShardEntry.of(cache.path(k), e) for k, e in enumerate(self.meta["shards"])]
        self._labels_file = cache.labels()  # so len, targets and classes need no shard
        check_record_arrays(self.meta, cache.file, cache.remote.where(metadata.MANIFEST_NAME))

    def _here(self, path: str) -> str:
        """``path`` (a file of this folder store) in the folder that now holds the manifest this
        process pinned: a store moved aside by ``pack --overwrite`` (replaced by a single file)
        is still read there, while its readers hold it."""
        if self._pin is None:
            return path
        try:
            folder = os.path.dirname(os.readlink(f"/proc/self/fd/{self._pin.fd}"))
        except OSError:  # no /proc (not Linux): where it was
            return path
        if os.path.dirname(self._manifest_path) != self.path:  # pinned: versions/<N>.json
            folder = os.path.dirname(folder)
        return path if folder == self._real else os.path.join(folder, os.path.basename(path))

    # -- labels -------------------------------------------------------------------------------

    @property
    def labels(self) -> np.ndarray:
        """All labels (int64), without opening shards of a multi-shard store."""
        labels = getattr(self, "_labels", None)
        if labels is None:
            labels = self._load_labels()
            self._labels = labels
        return labels

    def side_array(self, name: str, sha256: str) -> np.ndarray:
        """A ``.npy`` file the manifest names beside the shards (the record layout), checked
        against ``sha256`` and memory-mapped; read from the store this process pinned."""
        self.attach()
        path = (self.cache.file(name, sha256) if self.cache is not None
                else self._here(os.path.join(self.path, name)))
        try:
            if sha256_file(path) != sha256:
                raise StoreError(f"{path}: file is damaged or replaced (checksum differs from "
                                 "the manifest)")
            return np.load(path, mmap_mode="r", allow_pickle=False)
        except StoreError:
            raise
        except FileNotFoundError:
            raise StoreError(f"{path}: file is missing") from None
        except Exception as exc:  # noqa: BLE001 - numpy reports a bad header as many types
            raise StoreError(f"{path}: cannot load: {exc}") from None

    def _load_labels(self) -> np.ndarray:
        if self._labels_file is None:
            return np.array(self.shard(0).labels)
        self.attach()  # the manifest's lock keeps labels.npy from being replaced under us
        labels_file = (self.cache.labels() if self.cache is not None
                       else self._here(self._labels_file))
        expected = self.meta["labels"]["sha256"]
        try:
            # Checked against the manifest first: a damaged label would be silently wrong data.
            if sha256_file(labels_file) != expected:
                raise StoreError(f"{labels_file}: labels file is damaged or replaced "
                                 "(checksum differs from the manifest)")
            labels = np.load(labels_file, mmap_mode="r", allow_pickle=False)
        except StoreError:
            raise
        except FileNotFoundError:
            raise StoreError(f"{labels_file}: labels file is missing") from None
        except Exception as exc:  # noqa: BLE001 - numpy reports a bad header as many types
            raise StoreError(f"{labels_file}: cannot load labels: {exc}") from None
        if labels.dtype != np.int64 or labels.shape != (self.count,):
            raise StoreError(f"{labels_file}: labels are {labels.dtype}{list(labels.shape)}, "
                             f"expected int64[{self.count}]")
        return labels

    # -- shards -------------------------------------------------------------------------------

    def locate(self, index: int) -> tuple[int, int]:
        """Global record index -> (shard number, index within the shard)."""
        shards, local = locate_many(self.starts, (index,))
        return int(shards[0]), int(local[0])

    def locate_many(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """Global record indices -> (shard numbers, indices within those shards), vectorised."""
        return locate_many(self.starts, indices)

    def _claim(self) -> None:
        """Make this process the owner. Shards inherited over fork are closed (this process's
        copies only); an inherited pin is adopted, so the child reads what its parent opened."""
        pid = os.getpid()
        if self._pid == pid:
            return
        with _CLAIMING:
            if self._pid == pid:  # another thread claimed it meanwhile
                return
            # A lock inherited over fork may be held by a thread that does not exist here.
            self._lock = threading.RLock()
            self._opening = {}
            inherited, self._open = self._open, OrderedDict()
            for shard in inherited.values():
                shard.close()
            if self._pin is not None and not self._pin.adopt():
                self._pin = None
            self._limit = self.max_open_shards or default_max_open_shards()
            self._last_opened: int | None = None  # a remote store prefetches while it goes k-1, k
            self._pid = pid  # last: another thread sees the store claimed only when it is

    def attach(self) -> None:
        """Pin, in this process, the store this metadata came from (done by the first use), or
        raise ``StoreError`` if it was replaced since."""
        self._claim()
        if self._pin is not None or self.cache is not None:
            return
        with self._lock:  # one pin per process, whichever threads get here together
            self._attach()

    def _attach(self) -> None:
        if self._pin is not None:
            return
        pin = None
        try:
            if self._labels_file is None:
                pin = swap.open_identity(self.path)
                same = pin.identity == self._identity
            else:
                raw, pin = swap.read_manifest_pinned(self._manifest_path,
                                                     metadata.MAX_MANIFEST_BYTES)
                same = hashlib.sha256(raw).hexdigest() == self._identity
        except FileNotFoundError:
            same = False
        except OSError as exc:
            raise StoreError(f"cannot open {self.path}: {exc.strerror}") from None
        if not same:
            if pin is not None:
                pin.close()
            raise StoreError(f"{self.path} was replaced or removed (e.g. re-packed with "
                             "--overwrite) after this dataset was created; create the dataset "
                             "again to read the new store")
        self._pin = pin

    def shard(self, k: int) -> OpenShard:
        """Shard ``k`` opened in this process (opened now if needed, retiring the least recently
        used one when ``max_open_shards`` are open: see the module docstring)."""
        if self._pid != os.getpid():
            self._claim()
        with self._lock:
            shard = self._open.get(k)
            if shard is not None:
                self._open.move_to_end(k)
                return shard
            gate = self._opening.setdefault(k, threading.Lock())
        with gate:  # one thread opens shard k; the others asking for it wait here
            with self._lock:
                shard = self._open.get(k)
                if shard is not None:  # opened by the thread this one waited for
                    self._open.move_to_end(k)
                    return shard
                self.attach()
            shard = self._open_shard(k)  # outside the lock: a remote shard may download
            with self._lock:
                while len(self._open) >= self._limit:
                    self._retire(*self._open.popitem(last=False))
                self._open[k] = shard
                self._opening.pop(k, None)
            return shard

    def _open_shard(self, k: int) -> OpenShard:
        if self._labels_file is None:
            return OpenShard(self.shards[k], k, self.meta, self._pin)
        if self.cache is not None:
            return self._open_cached(k)
        entry = self.shards[k]
        return OpenShard(dataclasses.replace(entry, path=self._here(entry.path)), k, self.meta)

    def _retire(self, k: int, shard: OpenShard) -> None:
        """The LRU lets go of shard ``k``: its reader closes with the last reference to it (a
        batch in another thread may still read it); a remote shard may be evicted now (a
        reader's map keeps its bytes)."""
        del shard
        if self.cache is not None:
            self.cache.release(k)

    @property
    def open_shards(self) -> list[int]:
        """Shards open in this process, least recently used first."""
        if self._pid != os.getpid():
            return []
        with self._lock:
            return list(self._open)

    def _open_cached(self, k: int) -> OpenShard:
        """Shard ``k`` of a remote store: fetched into the cache (in use until closed), opened."""
        self.cache.fetch(k, on_full=self._close_lru)  # a full cache: this process's go first
        try:
            shard = OpenShard(self.shards[k], k, self.meta)
        except BaseException:
            self.cache.release(k)
            raise
        if self.prefetch_next and self._last_opened in (None, k - 1) and k + 1 < len(self.shards):
            self.cache.read_ahead(range(k + 1, len(self.shards)))
        self._last_opened = k
        return shard

    def _close_lru(self) -> bool:
        """Retire this process's least recently used shard (False when none is open)."""
        with self._lock:
            if not self._open:
                return False
            self._retire(*self._open.popitem(last=False))
            return True

    def prefetch(self, k: int) -> None:
        """Start downloading shard ``k`` of a remote store into the machine's cache, in the
        background (a local store: nothing to do)."""
        self.read_ahead([k])

    def read_ahead(self, shards: Any) -> None:
        """This process reads ``shards`` next, in this order: a remote store downloads the first
        few in the background, several at once (:meth:`shardkit.remote.ShardCache.read_ahead`)."""
        if self.cache is not None:
            self.cache.read_ahead(shards)

    def _close_shard(self, k: int, shard: OpenShard) -> None:
        shard.close()
        if self.cache is not None:
            self.cache.release(k)  # it may be evicted now

    def open(self) -> None:
        """Open in this process: pin the store now, and a single-shard store's file too."""
        self.attach()
        if len(self.shards) == 1:
            self.shard(0)

    def close(self) -> None:
        """Release every descriptor and lock this process holds for the store."""
        self._claim()
        with self._lock:
            for k, shard in self._open.items():
                self._close_shard(k, shard)
            self._open = OrderedDict()
            if self._pin is not None:
                self._pin.close()
                self._pin = None
            if self._labels_file is not None:
                self._labels = None  # a map of labels.npy (a descriptor); loaded again when needed
            self._pid = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        state["_pid"] = None
        state["_pin"] = None
        for key in ("_lock", "_opening"):  # made again by the first use (_claim)
            state.pop(key, None)
        state.pop("_labels", None)
        state.pop("_limit", None)  # per process: the receiver's own open-file limit
        state.pop("_last_opened", None)
        return state

    def __len__(self) -> int:
        return self.count
