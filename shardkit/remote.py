"""Folder stores in object storage (``s3://``, ``gs://``, any fsspec URL), read via a local cache.

A remote store is a folder store copied object for object under a URL prefix: the shard files,
``labels.npy`` and ``manifest.json`` (uploaded last). Nothing about the format changes.

Reading. LMDB and HDF5 need a local file to memory-map, so whole shards are staged:
:class:`RemoteFolder` reads and checks the manifest once; :class:`ShardCache` downloads a shard the
first time any process on the machine needs it, into ``cache_dir/<key>/``, where ``key`` hashes
the URL and the manifest's SHA-256 (a store replaced remotely never mixes with an old cache).
A download goes to a ``.part`` file, is checked against the manifest's size and SHA-256 and only
then renamed into place; a waiter re-checks after it gets the lock, so each shard is downloaded
once however many workers and processes ask. Locks are ``flock`` s on small side files, per shard:

- ``.NAME.dl``: exclusive while downloading;
- ``.NAME.use``: shared while a reader has the shard (from :meth:`ShardCache.fetch` to
  :meth:`ShardCache.release`, or process exit); eviction takes it exclusively without waiting, so
  a shard in use is never deleted.

``cache_limit`` (bytes, over the whole ``cache_dir``) is enforced before each download, under
``cache_dir/.evict.lock``: shards are deleted least recently fetched first (file mtime), skipping
shards in use; ``.part`` files count at their final size (it is in their name). When every shard
is in use the download goes ahead: the cache then exceeds the limit by the shards open at once.
Once fetched, a shard is served from disk, so a warm cache reads later epochs without network.

The manifest and labels are always read from the remote at construction, never from the cache:
the cache key depends on the manifest's checksum, and a stale local manifest would hide a store
replaced remotely.

Failures. Every remote call is retried (``RETRY_DELAYS``) and then raises ``StoreError`` naming
the URL and the object. For ``s3://`` connect/read timeouts and botocore's retries are set unless
``storage_options`` says otherwise (``config_kwargs``), and s3fs's own retry loop is turned off on
shardkit's private filesystem instance, so an unreachable endpoint fails in seconds and a stalled
one within minutes, never a hang. A missing object is reported at once; a damaged one (checksum
mismatch) after the retries.

Writing. :class:`Uploader` puts finished shard files as they come (s3fs switches to concurrent
multipart uploads of 50 MiB parts for files of 100 MiB and more), then ``labels.npy``, then
``manifest.json``: a killed pack leaves no manifest, and readers refuse a prefix without one.
After each shard a record ``.shardkit-upload/NAME.json`` (bytes, sha256) is written; with
``resume=True`` a shard whose record and remote size match is not uploaded again. The records
are removed once the manifest is up.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

from . import metadata
from .errors import PackError, ShardkitError, StoreError
from .fileutil import has_size, sha256_file, unlink
from .urls import is_url

__all__ = ["is_url", "RemoteFolder", "ShardCache", "Uploader", "upload_folder_store",
           "check_target", "default_cache_dir", "ObjectNotFound"]

RETRY_DELAYS = (1.0, 2.0)  # seconds slept between the attempts of one remote call
RECORDS = ".shardkit-upload"
# A stalled endpoint fails one attempt after total_max_attempts * read_timeout (read_timeout bounds
# a read that gets no byte, not a whole transfer): with RETRY_DELAYS about 3 minutes in all.
_S3_CONFIG = {"connect_timeout": 10, "read_timeout": 30,
              "retries": {"total_max_attempts": 2, "mode": "standard"}}

T = TypeVar("T")


class ObjectNotFound(StoreError):
    """The remote object does not exist (reported at once, not retried)."""


def default_cache_dir() -> str:
    """``$SHARDKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardkit``, else ``~/.cache/shardkit``."""
    explicit = os.environ.get("SHARDKIT_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardkit")


def _options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` plus bounded timeouts and retries for S3 (the user's keys win).

    Our own filesystem instance: fsspec's shared one would keep the endpoint it first resolved
    and would be shared with the user's code.
    """
    options = {"skip_instance_cache": True} | dict(storage_options or {})
    scheme = url.split("://", 1)[0]
    if _is_s3(url):
        options["config_kwargs"] = _S3_CONFIG | dict(options.get("config_kwargs") or {})
    elif scheme in ("file", "local"):
        options.setdefault("auto_mkdir", True)  # object stores need no folders; a disk does
    return options


def _is_s3(url: str) -> bool:
    return url.split("://", 1)[0] in ("s3", "s3a")


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Remote:
    """An fsspec filesystem for one URL prefix (made per process), and retried calls on it."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None):
        self.url = os.fspath(url).rstrip("/")
        if not is_url(self.url):
            raise ValueError(f"url must be scheme://..., got {self.url!r}")
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._root = ""
        self._fs_pid: int | None = None

    @property
    def fs(self) -> Any:
        """This process's filesystem (fsspec's hold event loops and connections: not forked)."""
        if self._fs is None or self._fs_pid != os.getpid():
            try:
                import fsspec

                self._fs, self._root = fsspec.core.url_to_fs(
                    self.url, **_options(self.url, self.storage_options))
                if _is_s3(self.url):
                    # s3fs retries every call 5 times on top of botocore's retries and ours:
                    # with timeouts that multiplies to many minutes. This instance is ours.
                    self._fs.retries = 1
            except (ImportError, ValueError) as exc:
                need = ("pip install 'shardkit[remote]'" if _is_s3(self.url) else
                        "fsspec and the package for this protocol")
                raise ShardkitError(f"{self.url}: {_describe(exc)} (remote stores need "
                                    f"{need})") from None
            self._fs_pid = os.getpid()
        return self._fs

    def path(self, name: str) -> str:
        """The filesystem path of object ``name`` (what ``fs`` methods take)."""
        if self._fs is None:
            self.fs  # noqa: B018 - creating the filesystem sets _root
        return f"{self._root.rstrip('/')}/{name}"

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def retry(self, name: str, call: Callable[[], T]) -> T:
        """``call()``, retried on transport errors; ``StoreError`` naming the object otherwise."""
        for attempt in range(len(RETRY_DELAYS) + 1):
            try:
                return call()
            except ShardkitError:
                raise
            except FileNotFoundError:
                raise ObjectNotFound(f"{self.where(name)}: object not found") from None
            except PermissionError as exc:
                raise StoreError(f"{self.where(name)}: access denied ({_describe(exc)})") from None
            # Backends raise their own types (botocore, aiohttp, gcsfs...): any other is transient.
            except Exception as exc:  # noqa: BLE001
                if attempt == len(RETRY_DELAYS):
                    raise StoreError(f"{self.where(name)}: {_describe(exc)} (gave up after "
                                     f"{attempt + 1} attempts)") from None
                time.sleep(RETRY_DELAYS[attempt])
        raise AssertionError("unreachable")

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_fs": None, "_fs_pid": None}


class RemoteFolder(_Remote):
    """A folder store under ``url``: its manifest, read and checked at construction."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None):
        super().__init__(url, storage_options)
        name = metadata.MANIFEST_NAME
        try:
            raw = self.retry(name, lambda: self.fs.cat_file(self.path(name)))
        except ObjectNotFound:
            raise StoreError(f"{self.url} has no {name}: not a shardkit store, or a pack "
                             "that did not finish") from None
        self.meta = metadata.parse_manifest(raw, self.where(name))
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        self.manifest_bytes = len(raw)

    def get(self, name: str, local_path: str) -> None:
        """Download object ``name`` to ``local_path`` (retried)."""
        self.retry(name, lambda: self.fs.get_file(self.path(name), local_path))


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
        fd = _open_lock(self.side_file(entry["file"], "use"), fcntl.LOCK_SH)
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
            with _locked(self.side_file(entry["file"], "use"), fcntl.LOCK_SH):
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
        with _locked(self.side_file(name, "dl"), fcntl.LOCK_EX):
            if has_size(path, size):
                return  # another process or thread finished it while we waited
            for entry in os.scandir(self.folder):  # left by a killed download
                if entry.name.startswith(f".{name}.") and entry.name.endswith(".part"):
                    unlink(entry.path)
            part = self._reserve(name, size or 0)
            try:
                for attempt in range(len(RETRY_DELAYS) + 1):
                    self.remote.get(name, part)
                    got = os.path.getsize(part)
                    if (size is None or got == size) and sha256_file(part) == sha256:
                        with open(part, "rb") as f:
                            os.fsync(f.fileno())
                        os.replace(part, path)
                        return
                    if attempt < len(RETRY_DELAYS):
                        time.sleep(RETRY_DELAYS[attempt])
                raise StoreError(f"{where}: object is damaged or replaced: its size or SHA-256 "
                                 f"differs from the manifest ({attempt + 1} downloads)")
            finally:
                unlink(part)

    # -- cache limit --------------------------------------------------------------------------

    def _reserve(self, name: str, size: int) -> str:
        """A ``.part`` name for a download of ``size`` bytes; room made for it under the limit."""
        part = os.path.join(self.folder, f".{name}.{size}-{uuid.uuid4().hex[:12]}.part")
        if self.cache_limit is not None:
            with _locked(os.path.join(self.root, ".evict.lock"), fcntl.LOCK_EX):
                self._evict(size)
                open(part, "wb").close()  # counted by other processes' evictions from now on
        return part

    def _evict(self, incoming: int) -> None:
        assert self.cache_limit is not None
        total, shards = incoming, []
        for folder in _scandir(self.root):
            if not folder.is_dir(follow_symlinks=False):
                continue
            entries = list(_scandir(folder.path))
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
            if _evict_unused(path):
                total -= size


# -- writing ----------------------------------------------------------------------------------

class Uploader:
    """Uploads a folder store to ``url``: shards as they finish, then labels, manifest last.

    ``overwrite`` deletes an existing remote manifest first (so a killed upload leaves none);
    without it a prefix that holds a store is refused. ``resume`` keeps shards whose upload
    record and remote size match. Picklable, so workers can upload their own shards.
    """

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None, *,
                 resume: bool = False, overwrite: bool = False) -> None:
        self.remote = _Remote(url, storage_options)
        self.resume = resume
        manifest = metadata.MANIFEST_NAME
        if _holds_store(self.remote, overwrite):
            self.remote.retry(manifest, lambda: self.remote.fs.rm_file(self.remote.path(manifest)))
        if not resume:
            self._remove_records()

    def put_shard(self, local_path: str, name: str, sha256: str, size: int) -> bool:
        """Upload one finished shard file; False when ``resume`` found it uploaded already."""
        if self.resume and self.uploaded(name, sha256, size):
            return False
        self._put(local_path, name, size)
        record = self._record(name)
        self.remote.retry(record, lambda: self.remote.fs.pipe_file(
            self.remote.path(record), _record_bytes(name, sha256, size)))
        return True

    def uploaded(self, name: str, sha256: str, size: int) -> bool:
        """Is this shard (same name, size, SHA-256) uploaded by this or an interrupted run?"""
        fs, record = self.remote.fs, self._record(name)
        try:
            found = self.remote.retry(record, lambda: fs.cat_file(self.remote.path(record)))
            remote_size = self.remote.retry(name, lambda: fs.size(self.remote.path(name)))
        except ObjectNotFound:
            return False
        return found == _record_bytes(name, sha256, size) and remote_size == size

    @staticmethod
    def _record(name: str) -> str:
        return f"{RECORDS}/{name}.json"

    def finish(self, local_folder: str | os.PathLike) -> None:
        """Upload ``labels.npy`` and then ``manifest.json`` of the finished local folder store."""
        manifest_path = os.path.join(os.fspath(local_folder), metadata.MANIFEST_NAME)
        with open(manifest_path, "rb") as f:
            meta = metadata.parse_manifest(f.read(), manifest_path)
        labels = meta["labels"]["file"]
        local = os.path.join(os.fspath(local_folder), labels)
        self._put(local, labels, os.path.getsize(local))
        self._put(manifest_path, metadata.MANIFEST_NAME, os.path.getsize(manifest_path))
        self._remove_records()

    def _put(self, local_path: str, name: str, size: int) -> None:
        fs = self.remote.fs
        self.remote.retry(name, lambda: fs.put_file(local_path, self.remote.path(name)))
        got = self.remote.retry(name, lambda: fs.size(self.remote.path(name)))
        if got != size:
            raise StoreError(f"{self.remote.where(name)}: uploaded {size} bytes, the store "
                             f"holds {got}")

    def _remove_records(self) -> None:
        fs, path = self.remote.fs, self.remote.path(RECORDS)
        try:
            self.remote.retry(RECORDS, lambda: fs.rm(path, recursive=True))
        except ObjectNotFound:
            pass


def _holds_store(remote: _Remote, overwrite: bool) -> bool:
    """Does ``remote`` hold a store (refused unless ``overwrite``)?"""
    manifest = metadata.MANIFEST_NAME
    if remote.retry(manifest, lambda: remote.fs.exists(remote.path(manifest))):
        if not overwrite:
            raise PackError(f"{remote.url} already holds a store ({manifest}); pass "
                            "`overwrite=True` to replace it")
        return True
    return False


def check_target(url: str | os.PathLike, storage_options: dict[str, Any] | None = None,
                 overwrite: bool = False) -> None:
    """Refuse an upload target before any work (its filesystem unavailable, unreachable, or
    holding a store without ``overwrite``); changes nothing."""
    _holds_store(_Remote(url, storage_options), overwrite)


def upload_folder_store(local_folder: str | os.PathLike, url: str | os.PathLike,
                        storage_options: dict[str, Any] | None = None, *, resume: bool = False,
                        overwrite: bool = False) -> int:
    """Upload a finished local folder store to ``url`` (manifest last); returns shards uploaded."""
    folder = os.fspath(local_folder)
    manifest_path = os.path.join(folder, metadata.MANIFEST_NAME)
    try:
        with open(manifest_path, "rb") as f:
            meta = metadata.parse_manifest(f.read(), manifest_path)
    except FileNotFoundError:
        raise StoreError(f"{folder} is not a folder store (no {metadata.MANIFEST_NAME})") from None
    uploader = Uploader(url, storage_options, resume=resume, overwrite=overwrite)
    uploaded = sum(uploader.put_shard(os.path.join(folder, e["file"]), e["file"], e["sha256"],
                                      e["bytes"])
                   for e in meta["shards"])
    uploader.finish(folder)
    return uploaded


def _record_bytes(name: str, sha256: str, size: int) -> bytes:
    return metadata.dumps({"bytes": size, "file": name, "sha256": sha256})


# -- local helpers ----------------------------------------------------------------------------

def _open_lock(path: str, how: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, how)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def _locked(path: str, how: int) -> Iterator[None]:
    fd = _open_lock(path, how)
    try:
        yield
    finally:
        os.close(fd)


def _evict_unused(path: str) -> bool:
    """Delete a cached shard unless some process holds it (its ``.use`` lock)."""
    head, name = os.path.split(path)
    try:
        fd = _open_lock(os.path.join(head, f".{name}.use"), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    try:
        unlink(path)
    finally:
        os.close(fd)
    return True


def _scandir(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []
