"""Access to one remote URL prefix: its fsspec filesystem (per process), retried calls, the
manifest of a remote folder store (:class:`RemoteFolder`)."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import replace
from typing import Any, Callable, TypeVar

from .. import metadata, storemeta
from ..errors import OptionError, ShardkitError, StoreError
from ..urls import is_url
from ..versionmeta import number_of
from ..versions import VERSIONS_DIR
from .failures import Failure, TransferDeadline, classify, describe

RETRY_DELAYS = (1.0, 2.0)  # seconds slept between the attempts of one remote call
# A stalled endpoint fails one attempt after total_max_attempts * read_timeout (read_timeout bounds
# a read that gets no byte, not a whole transfer): with RETRY_DELAYS about 3 minutes in all. A
# transfer that keeps getting bytes, too slowly, is bounded by its deadline (transfer_deadline).
#: Each download of an object must finish within TRANSFER_TIMEOUT seconds plus its size at
#: TRANSFER_MIN_RATE bytes/s, else it is cut and retried; the environment variables of these
#: names override them (DataLoader workers and the CLI inherit them).
TRANSFER_TIMEOUT = 60.0
TRANSFER_MIN_RATE = 1_000_000.0
#: Connections a process may hold open to S3 (botocore's default is 10): at least the
#: read-ahead's downloads in flight (``cache.READ_AHEAD_MAX``) plus the process's own fetches, or
#: the downloads past 10 would queue for a connection, a round trip each.
MAX_CONNECTIONS = 64
_S3_CONFIG = {"connect_timeout": 10, "read_timeout": 30, "max_pool_connections": MAX_CONNECTIONS,
              "retries": {"total_max_attempts": 2, "mode": "standard"}}

T = TypeVar("T")
# Error "codes" that are only an HTTP status: the server's own code is found by _diagnose.
_BARE_CODES = {"400", "403", "404", "BadRequest", "Forbidden", "NotFound"}


def _positive_env(name: str, default: float) -> float:
    raw = os.environ.get(f"SHARDKIT_{name}")
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise OptionError(f"SHARDKIT_{name} must be a positive number, got {raw!r}")
    return value


def transfer_deadline(size: int) -> float:
    """Seconds a download of ``size`` bytes may take in all: ``SHARDKIT_TRANSFER_TIMEOUT`` (60)
    plus the size at ``SHARDKIT_TRANSFER_MIN_RATE`` bytes/s (1,000,000)."""
    return (_positive_env("TRANSFER_TIMEOUT", TRANSFER_TIMEOUT)
            + max(size, 0) / _positive_env("TRANSFER_MIN_RATE", TRANSFER_MIN_RATE))


class ObjectNotFound(StoreError):
    """The remote object does not exist (reported at once, not retried); ``code`` is the
    server's error code (``NoSuchBucket``: the bucket itself is missing)."""

    code: str | None = None


class RetriesExhausted(StoreError):
    """A transient fault (a dropped connection, a timeout, a 5xx) outlasted the retries: the
    same call may succeed later, so a packing engine retries the whole task (a permanent fault,
    such as a missing object or refused credentials, is a plain ``StoreError``)."""


class LocalFault(StoreError):
    """A fault of this machine (the cache's disk or folder), not of the remote object."""


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
    if is_s3(url):
        options["config_kwargs"] = _S3_CONFIG | dict(options.get("config_kwargs") or {})
    elif scheme in ("file", "local"):
        options.setdefault("auto_mkdir", True)  # object stores need no folders; a disk does
    return options


def is_s3(url: str) -> bool:
    """Whether ``url`` is an S3 URL (s3:// or s3a://): those get S3-specific checks."""
    return url.split("://", 1)[0] in ("s3", "s3a")


class RemoteTarget:
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
                if is_s3(self.url):
                    # s3fs retries every call 5 times on top of botocore's retries and ours:
                    # with timeouts that multiplies to many minutes. This instance is ours.
                    self._fs.retries = 1
            except (ImportError, ValueError) as exc:
                need = ("pip install 'shardkit[remote]'" if is_s3(self.url) else
                        "fsspec and the package for this protocol")
                raise ShardkitError(f"{self.url}: {describe(exc)} (remote stores need "
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

    def read_timeout(self) -> float | None:
        """Seconds a read may get no byte before it fails (S3 only), for messages."""
        if not is_s3(self.url):
            return None
        return _options(self.url, self.storage_options)["config_kwargs"].get("read_timeout")

    def failure(self, exc: BaseException, name: str = "") -> Failure:
        failure = classify(exc, self.read_timeout())
        if failure.code in _BARE_CODES and is_s3(self.url):
            failure = self._diagnose(name) or failure
        return failure

    def _diagnose(self, name: str) -> Failure | None:
        """The server's own error code, when a response without a body (HEAD) or a streamed
        GET's error gave only the HTTP status: one listing of the key's prefix, whose error
        body botocore parses (``SignatureDoesNotMatch``, ``NoSuchBucket``...)."""
        try:
            bucket, key, _ = self.fs.split_path(self.path(name))
            self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=key, MaxKeys=1,
                            timeout=transfer_deadline(0))
        except Exception as exc:  # noqa: BLE001 - what we are after
            found = classify(exc, self.read_timeout())
            return found if found.code not in _BARE_CODES and found.code is not None else None
        return None

    def retry(self, name: str, call: Callable[[], T],
              local: Callable[[BaseException], str | None] | None = None,
              refusals: bool = False) -> T:
        """``call()``, retried while a retry can succeed; ``StoreError`` naming the object (or,
        when ``local(exc)`` names a fault of this machine, ``LocalFault`` with that text).
        ``refusals``: the object is known to exist (just listed), so a refusal that may pass
        (403 AccessDenied or ExpiredToken, 404) is retried too, ending in ``RetriesExhausted``."""
        for attempt in range(len(RETRY_DELAYS) + 1):
            try:
                return call()
            except ShardkitError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified below
                blame = local(exc) if local is not None else None
                if blame is not None:
                    raise LocalFault(blame) from None
                failure = self.failure(exc, name)
                if refusals and failure.refused:
                    failure = replace(failure, transient=True, missing=False)
                if failure.missing:
                    err = ObjectNotFound(f"{self.where(name)}: {failure.message}")
                    err.code = failure.code
                    raise err from None
                if not failure.transient:
                    raise StoreError(f"{self.where(name)}: {failure.message}") from None
                if attempt == len(RETRY_DELAYS):
                    raise RetriesExhausted(f"{self.where(name)}: {failure.message} (gave up after "
                                     f"{attempt + 1} attempts)") from None
                time.sleep(RETRY_DELAYS[attempt])
        raise AssertionError("unreachable")

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_fs": None, "_fs_pid": None}

    def bounded(self, name: str, call: Callable[[dict[str, float]], Any], size: int,
                local: Callable[[BaseException], str | None] | None = None,
                refusals: bool = False) -> Any:
        """``call(timeout)`` retried as :meth:`retry` does; on an asynchronous filesystem
        (``s3://``, ``gs://``) each attempt gets ``{"timeout": deadline}`` to pass to the fsspec
        call, which cuts it at :func:`transfer_deadline` of ``size`` bytes (a trickle of bytes
        never trips a read timeout); a synchronous one cannot be cut short and gets ``{}``."""
        if not getattr(self.fs, "async_impl", False):
            return self.retry(name, lambda: call({}), local, refusals)
        deadline = transfer_deadline(size)

        def attempt() -> Any:
            start = time.monotonic()
            try:
                return call({"timeout": deadline})
            except Exception as exc:  # noqa: BLE001 - fsspec's FSTimeoutError: the deadline
                # (a read timeout inside the call is an FSTimeoutError too, but sooner)
                if type(exc).__name__ != "FSTimeoutError" or \
                        time.monotonic() - start < deadline:
                    raise
                raise TransferDeadline(
                    f"the download did not finish within its deadline of {deadline:g} s "
                    f"({size} bytes: SHARDKIT_TRANSFER_TIMEOUT plus the size at "
                    "SHARDKIT_TRANSFER_MIN_RATE bytes/s); check the network and the endpoint, or "
                    "raise SHARDKIT_TRANSFER_TIMEOUT / lower SHARDKIT_TRANSFER_MIN_RATE") from None

        return self.retry(name, attempt, local, refusals)


def read_manifest(remote: RemoteTarget, name: str = metadata.MANIFEST_NAME) -> bytes:
    """The bytes of ``manifest.json`` (or the kept version ``name``) under ``remote``: its size
    is asked first (HEAD) and one over ``metadata.MAX_MANIFEST_BYTES`` is refused unread; the
    read itself is a ranged GET of at most that many bytes plus one (an object replaced by a
    larger one meanwhile)."""
    limit = metadata.MAX_MANIFEST_BYTES
    path = remote.path(name)
    size = remote.retry(name, lambda: remote.fs.size(path))
    if size is not None and size > limit:
        raise StoreError(f"{remote.where(name)}: manifest is implausibly large ({size} bytes; "
                         f"at most {limit} are read)")
    if size == 0:
        return b""
    raw = remote.bounded(name, lambda timeout: remote.fs.cat_file(
        path, start=0, end=limit + 1, **timeout), limit if size is None else size)
    if len(raw) > limit:
        raise StoreError(f"{remote.where(name)}: manifest is implausibly large (over {limit} "
                         "bytes)")
    return raw


def endpoint(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """The endpoint an ``s3://`` URL is reached at (``storage_options``' ``endpoint_url`` or
    ``client_kwargs.endpoint_url``, else ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``), "" for
    the default one and for other schemes: the same bucket on two servers is two stores."""
    if not is_s3(url):
        return ""
    options = storage_options or {}
    client = options.get("client_kwargs") or {}
    found = (options.get("endpoint_url") or client.get("endpoint_url")
             or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    return str(found or "")


class RemoteFolder(RemoteTarget):
    """A folder store under ``url``: its manifest, read and checked at construction;
    ``version``: that kept version's (``versions/<N>.json``; None: the current one)."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None,
                 version: int | None = None):
        super().__init__(url, storage_options)
        name = metadata.MANIFEST_NAME
        try:
            raw = read_manifest(self)
        except ObjectNotFound as exc:
            if exc.code == "NoSuchBucket":
                raise StoreError(f"{self.url}: {str(exc).split(': ', 1)[1]}") from None
            raise StoreError(f"{self.url} has no {name}: not a shardkit store, or a pack "
                             "that did not finish") from None
        self.meta = storemeta.parse_manifest(raw, self.where(name))
        if version is not None and number_of(self.meta) != version:
            name = f"{VERSIONS_DIR}/{int(version)}.json"
            try:
                raw = read_manifest(self, name)
            except ObjectNotFound:
                raise StoreError(f"{self.url} has no version {version} (the current one is "
                                 f"{number_of(self.meta)}; `shardkit log` lists the kept "
                                 "ones)") from None
            self.meta = storemeta.parse_manifest(raw, self.where(name))
            if number_of(self.meta) != version:
                raise StoreError(f"{self.where(name)} is version {number_of(self.meta)}, not "
                                 f"{version}: the store is damaged")
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        self.manifest_bytes = len(raw)

    def get(self, name: str, local_path: str,
            local: Callable[[BaseException], str | None] | None = None,
            size: int | None = None) -> None:
        """Download object ``name`` (``size`` bytes; None: asked of the server) to
        ``local_path`` (retried; ``local`` as in :meth:`retry`). On an asynchronous filesystem
        (``s3://``, ``gs://``) each attempt is cut at :func:`transfer_deadline` (a trickle of
        bytes never trips a read timeout)."""
        fs, path = self.fs, self.path(name)
        if size is None and getattr(fs, "async_impl", False):
            size = int(self.retry(name, lambda: fs.size(path)) or 0)
        self.bounded(name, lambda timeout: fs.get_file(path, local_path, **timeout), size or 0,
                     local)

