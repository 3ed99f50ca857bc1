"""One pack per URL prefix, wherever it runs: a lock object in the store itself.

A pack to a URL (and :func:`~shardkit.remote.upload_folder_store`) claims the prefix with the
object ``LOCK_NAME`` before it writes anything there, and checks that the claim is still its own
before it installs each shard, ``labels.npy``, ``layout.npy`` and ``manifest.json``. A second pack
to the same prefix is refused with one line naming the holder, whatever endpoint string it uses
(``127.0.0.1`` or ``localhost``) and whichever machine it runs on.

Taking it. On S3 the lock is written with ``If-None-Match: *`` where the server honours it; that
is found out per pack with a probe object, whose second conditional PUT must be refused with 412
(a server that accepts it ignores the header, and is not trusted). Elsewhere (such servers, other
filesystems) the lock is written, then read back after ``SETTLE_SECONDS``: of packs that wrote it
at the same moment only the last writer reads its own token back and goes on; the check before
every install stops any other.

The object is JSON: host, pid, a random token, started and heartbeat (Unix times). The holder
rewrites it every ``HEARTBEAT_SECONDS``; a lock whose heartbeat is older than ``STALE_SECONDS``
is stale (its pack is presumed dead). A live lock is never taken over. A stale one is taken over
only by a pack given ``resume`` or ``overwrite``; without them that pack is refused, naming them.
A pack that died on this machine is known dead at once: every holder keeps an ``flock`` on a
local file (``<cache folder>/pack-locks/``, one per URL and endpoint) that lists its token, so
the next pack there, which gets that ``flock``, knows that no live pack holds a lock with a token
listed there and takes it over (a ``resume`` after a kill goes on at once).

The lock is deleted when its pack ends (finished, failed or interrupted), and only while it holds
that pack's token: a pack never deletes another's lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import socket
import threading
import time
import uuid
from typing import Any

from ..errors import PackError, StoreError
from .access import ObjectNotFound, RemoteTarget, default_cache_dir, endpoint, is_s3
from .locks import close, open_lock

#: The lock object, under the store's prefix (no shard, side file or manifest has this name).
LOCK_NAME = ".shardkit-lock.json"
#: How often the holder rewrites its heartbeat, and the age at which a lock is stale (seconds).
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0
#: Seconds between writing the lock without a condition and reading it back.
SETTLE_SECONDS = 1.0
_KIND = "shardkit pack lock"
_READ_LIMIT = 1 << 16
_KEEP_TOKENS = 4  # tokens of earlier packs kept in the local file
# Codes of a server that refuses the If-None-Match header itself (it cannot take it).
_UNSUPPORTED = {"NotImplemented", "InvalidArgument", "InvalidRequest", "400", "BadRequest",
                "501"}


def local_claim_path(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """The local file a pack to ``url`` holds its ``flock`` on and lists its token in."""
    where = f"{endpoint(url, storage_options)}\0{os.fspath(url).rstrip('/')}"
    key = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(os.path.abspath(default_cache_dir()), "pack-locks", f"{key}.lock")


class PackLock:
    """The lock of one pack on the prefix ``url``: :meth:`acquire`, :meth:`check` before each
    install, :meth:`release` at the end. Picklable: a copy (a Dask worker's) only checks."""

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None):
        self.remote = RemoteTarget(url, storage_options)
        self.url = self.remote.url
        self.token = uuid.uuid4().hex
        self.started = time.time()
        self.conditional: bool | None = None  # whether it was taken with If-None-Match
        self.held = False
        self._fd: int | None = None
        self._earlier: list[str] = []  # tokens of packs through the local file, all dead now
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_fd": None, "_stop": None, "_thread": None, "held": False}

    # -- taking and giving back ----------------------------------------------------------------

    def check_free(self, resume: bool = False, overwrite: bool = False) -> None:
        """Refuse (``PackError``, one line) when :meth:`acquire` would: nothing is written."""
        self._claim_here()
        try:
            self._verdict(self.read(), resume, overwrite)
        finally:
            self._close_here()

    def acquire(self, resume: bool = False, overwrite: bool = False) -> None:
        """Take the lock, or raise ``PackError`` naming its holder; starts the heartbeat."""
        self._claim_here()
        wrote = False
        try:
            free = self._verdict(self.read(), resume, overwrite)
            self.conditional = self._honours_if_none_match()
            self._list_here(self._earlier + [self.token])
            wrote = True
            if free and self.conditional:
                if not self._put_if_absent(LOCK_NAME, self._body()):
                    found = self.read()  # a pack that got in first (or this one's PUT, retried)
                    if not self._ours(found):
                        raise PackError(self._refusal(found))
            else:
                self._put()
                time.sleep(SETTLE_SECONDS)
                found = self.read()
                if not self._ours(found):
                    raise PackError(self._refusal(found))
            self.held = True
        except BaseException:
            if wrote:  # interrupted after its PUT, or outrun: removed only if it is ours
                self._delete_if_ours()
            self._close_here()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(self._stop,), daemon=True,
                                        name="shardkit-pack-lock")
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and delete the lock if it still holds this pack's token (a lock
        that cannot be deleted now is taken over by the next pack here, or goes stale)."""
        if self._stop is not None:
            self._stop.set()
            if self._thread is not None:
                self._thread.join(10)
            self._stop = self._thread = None
        if self.held:
            self.held = False
            self._delete_if_ours()
        self._close_here()

    def _delete_if_ours(self) -> None:
        try:
            if self._ours(self.read()):
                self.remote.retry(LOCK_NAME, lambda: self.remote.fs.rm_file(
                    self.remote.path(LOCK_NAME)))
        except StoreError:
            pass

    def check(self, name: str) -> None:
        """Raise ``PackError`` (one line, naming the holder) unless this pack still holds the
        lock; called before object ``name`` is installed."""
        found = self.read()
        if self._ours(found):
            return
        holder = ("it was deleted" if found is None else
                  f"it is held by {describe(found)}" if isinstance(found, dict) else
                  "it was replaced by an object that is not a pack lock")
        raise PackError(f"{self.url}: this pack no longer holds its lock {LOCK_NAME} ({holder}); "
                        f"stopped before writing {name}: another pack may be writing there")

    # -- the lock object -----------------------------------------------------------------------

    def read(self) -> dict[str, Any] | str | None:
        """The lock's owner; None when there is no lock, "" when the object is not a lock."""
        fs, path = self.remote.fs, self.remote.path(LOCK_NAME)
        try:
            raw = self.remote.retry(LOCK_NAME, lambda: fs.cat_file(path, start=0,
                                                                   end=_READ_LIMIT))
        except ObjectNotFound as exc:
            if exc.code == "NoSuchBucket":
                raise
            return None
        try:
            found = json.loads(raw)
        except (ValueError, RecursionError):
            return ""
        if not isinstance(found, dict) or found.get("kind") != _KIND or \
                not isinstance(found.get("token"), str) or \
                not all(_number(found.get(k)) for k in ("pid", "started", "heartbeat")):
            return ""
        return found

    def _ours(self, found: Any) -> bool:
        return isinstance(found, dict) and found["token"] == self.token

    def _body(self) -> bytes:
        return json.dumps({"kind": _KIND, "url": self.url, "host": socket.gethostname(),
                           "pid": os.getpid(), "token": self.token, "started": self.started,
                           "heartbeat": time.time()}, sort_keys=True).encode()

    def _put(self) -> None:
        body = self._body()
        self.remote.retry(LOCK_NAME, lambda: self.remote.fs.pipe_file(
            self.remote.path(LOCK_NAME), body))

    def _put_if_absent(self, name: str, body: bytes) -> bool | None:
        """PUT ``name`` with ``If-None-Match: *``: True when written, False when refused with
        412, None when the server refuses the header itself."""
        fs = self.remote.fs
        bucket, key, _ = fs.split_path(self.remote.path(name))

        def put() -> bool | None:
            try:
                fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
                return True
            except Exception as exc:  # noqa: BLE001 - classified here, else by retry
                code = self.remote.failure(exc, name).code
                if code in ("PreconditionFailed", "412"):
                    return False
                if code in _UNSUPPORTED:
                    return None
                raise

        return self.remote.retry(name, put)

    def _honours_if_none_match(self) -> bool:
        """Whether the server refuses a second conditional PUT of a probe object with 412."""
        if not is_s3(self.url):
            return False
        probe = f".shardkit-lock-probe-{self.token[:16]}"
        try:
            first = self._put_if_absent(probe, b"probe")
            return bool(first) and self._put_if_absent(probe, b"probe") is False
        finally:  # written by this pack under its own name
            try:
                self.remote.retry(probe, lambda: self.remote.fs.rm_file(self.remote.path(probe)))
            except ObjectNotFound:
                pass

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                if not self._ours(self.read()) or stop.is_set():
                    return  # taken over: the next install's check stops this pack
                self._put()
            except Exception:  # noqa: BLE001 - the next beat tries again; installs check
                continue

    # -- verdicts ------------------------------------------------------------------------------

    def _verdict(self, found: dict[str, Any] | str | None, resume: bool, overwrite: bool
                 ) -> bool:
        """True when there is no lock, False when it may be taken over; else ``PackError``."""
        if found is None:
            return True
        if not isinstance(found, dict):
            raise PackError(f"{self.url}/{LOCK_NAME} is not a pack lock shardkit can read; if no "
                            f"pack is writing {self.url}, delete that object and pack again")
        if found["token"] in self._earlier:
            return False  # its pack ran on this machine and is dead: it held the flock we hold
        age = time.time() - found["heartbeat"]
        if age <= STALE_SECONDS:
            raise PackError(self._refusal(found))
        if not (resume or overwrite):
            raise PackError(f"{self.url} is locked by a pack that stopped sending heartbeats "
                            f"{age:.0f} s ago ({describe(found)}; {LOCK_NAME}); if that pack is "
                            "dead, rerun with `resume=True` to continue it or `overwrite=True` to "
                            "start over")
        return False

    def _refusal(self, found: Any) -> str:
        if not isinstance(found, dict):
            return f"another pack is taking the lock of {self.url} ({LOCK_NAME}); pack again"
        return (f"another pack is writing {self.url} ({describe(found)}; its lock {LOCK_NAME}); "
                f"wait for it to finish (a lock without a heartbeat for {STALE_SECONDS:.0f} s is "
                "stale: a rerun with `resume=True` then takes it over)")

    # -- the local file -------------------------------------------------------------------------

    def _claim_here(self) -> None:
        path = local_claim_path(self.url, self.remote.storage_options)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._fd = open_lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PackError(f"another pack to {self.url} is running on this machine ({path} is "
                            "locked); wait for it to finish") from None
        except StoreError as exc:
            raise PackError(f"cannot write {self.url}: {exc}") from None
        except OSError as exc:
            raise PackError(f"cannot write {self.url}: {os.path.dirname(path)}: "
                            f"{exc.strerror or exc}") from None
        raw = os.pread(self._fd, _READ_LIMIT, 0).decode("ascii", "replace")
        self._earlier = [t for t in raw.split() if len(t) == 32][-_KEEP_TOKENS:]

    def _list_here(self, tokens: list[str]) -> None:
        assert self._fd is not None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, "".join(f"{t}\n" for t in tokens).encode(), 0)

    def _close_here(self) -> None:
        if self._fd is not None:
            close(self._fd)
            self._fd = None


def describe(found: dict[str, Any]) -> str:
    """The holder of a lock, for messages: host, pid, age of its heartbeat."""
    age = max(0.0, time.time() - found["heartbeat"])
    return (f"host {str(found.get('host', '?'))[:80]}, pid {int(found['pid'])}, last heartbeat "
            f"{age:.0f} s ago")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)
