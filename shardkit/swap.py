"""Replacing a store that readers have open: atomic swaps for writers, pins for readers.

Single-file store: the new file is renamed over OUT (atomic). A process that opened the old file
keeps reading its inode; a ``Store`` remembers which file its metadata came from, pins that file
on first use in a process and never reads another (:func:`open_identity`,
``read.shard.open_pinned``).

Folder store: shard files are immutable once installed. An overwrite moves the new shard files
into OUT under names no live file uses (``shard-00000-<sha256 prefix>.<suffix>`` when the plain name
is taken by different bytes; identical files are kept as they are), then replaces
``manifest.json`` by rename: the switch is one atomic step, so a new reader sees either the old
or the new store, never a mix. Readers that use a store hold a shared ``flock`` on the manifest
inode they read, until closed (:func:`read_manifest_pinned`); the replaced manifest stays as a
hidden ``.retired-*.json`` hard link, and its files are deleted only once no reader holds that
lock any more (checked at every install into OUT, :func:`collect_garbage`).
"""

from __future__ import annotations

import os
import re
import uuid
import weakref
from typing import Any

from . import metadata, storemeta, versionmeta, versions
from .errors import PackError, StoreError
from .fields import added
from .fileutil import fsync_dir, has_size, open_regular, remove, unlink, write_synced

try:  # POSIX advisory locks; without them (Windows) replaced files are never deleted for you
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

RETIRED_PREFIX = ".retired-"
_OURS = re.compile(r"^(shard-\d+(-[0-9a-f]{16})?\.[A-Za-z0-9]+|(labels|layout|records|dedup-hashes|column-[A-Za-z0-9_.]+?)(-[0-9a-f]{16})?\.npy"
                   r"|\.retired-[0-9a-f]+\.json|\.manifest\.[0-9a-f]+\.tmp"
                   r"|shard-\d+[^/]*\.(spool|tmp))$")


# -- readers ----------------------------------------------------------------------------------

class Pin:
    """An open descriptor of a file a reader depends on (with a shared lock for manifests).

    Closed when the owning ``Store`` is closed or garbage-collected; a process forked meanwhile
    shares the open file (and its lock) and may ``adopt`` it.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pid = os.getpid()
        self.identity = _identity(os.fstat(fd))
        # A finalizer, not __del__: it runs at exit before modules are torn down (a __del__ run
        # then finds ``os`` gone and prints "Exception ignored in Pin.__del__").
        self._closer: weakref.finalize | None = weakref.finalize(self, _close_own, fd, self.pid)

    def valid_here(self) -> bool:
        """True when this process has the descriptor (it created it, or inherited it by fork)."""
        if self.fd < 0:
            return False
        try:
            st = os.fstat(self.fd)
        except OSError:
            return False
        return _identity(st) == self.identity

    def adopt(self) -> bool:
        """In a forked child: own the inherited descriptor (closing it here leaves the parent's
        open, and the lock stays while either holds it). False when it is not valid here."""
        if not self.valid_here():
            return False
        self.pid = os.getpid()
        if self._closer is not None:
            self._closer.detach()  # the parent's (it would not close the descriptor here)
        self._closer = weakref.finalize(self, _close_own, self.fd, self.pid)
        return True

    def proc_path(self) -> str | None:
        """A path that opens exactly the pinned inode in this process (Linux), if any."""
        path = f"/proc/self/fd/{self.fd}"
        return path if self.valid_here() and os.path.exists(path) else None

    def __getstate__(self) -> dict[str, Any]:
        # A descriptor means nothing in another process; the identity still guards opens there.
        return {"fd": -1, "pid": -1, "identity": self.identity, "_closer": None}

    def close(self) -> None:
        if self._closer is not None:
            self._closer()  # closes the descriptor in the process that owns it, once
            self._closer = None
        self.fd = -1


def _close_own(fd: int, pid: int) -> None:
    """Close a pin's descriptor, only in the process that owns it (a forked child holds a copy
    it has not adopted: closing that one is its parent's business, at the child's exit too)."""
    if os.getpid() == pid:
        try:
            os.close(fd)
        except OSError:
            pass


def identity(path: str) -> tuple[int, ...]:
    """What tells one file from another that replaced it: device, inode, size, mtime (an inode
    number is reused once a replaced file is deleted)."""
    return _identity(os.stat(path))


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def open_identity(path: str) -> Pin:
    """Pin the regular file at ``path`` (for a single-file store)."""
    fd, _ = open_regular(path)
    try:
        return Pin(fd)
    except BaseException:
        os.close(fd)
        raise


def read_manifest_pinned(path: str, limit: int) -> tuple[bytes, Pin]:
    """The manifest's bytes, read under a shared lock that is kept (see module docstring).

    Retries when the manifest was replaced between opening and locking it.
    """
    for _ in range(20):
        fd, _ = open_regular(path)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)
                except OSError:
                    pass  # a filesystem without flock: no protection from garbage collection
            pin = Pin(fd)
        except BaseException:
            os.close(fd)
            raise
        try:
            if identity(path) != pin.identity:
                pin.close()
                continue  # replaced meanwhile: read the new one
        except FileNotFoundError:
            pin.close()
            continue
        chunks, size = [], 0
        while size <= limit:
            block = os.read(pin.fd, 1 << 20)
            if not block:
                break
            chunks.append(block)
            size += len(block)
        return b"".join(chunks), pin
    raise StoreError(f"{path} keeps being replaced; try again")


# -- writers ----------------------------------------------------------------------------------

def _load_manifest(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            return storemeta.parse_manifest(f.read(), path)
    except (OSError, StoreError):
        return None


def _files_of(manifest: dict[str, Any]) -> dict[str, tuple[int | None, str]]:
    """File name -> (bytes or None, sha256) for every file a manifest refers to."""
    files = {e["file"]: (e["bytes"], e["sha256"]) for e in manifest["shards"]}
    for entry in side_entries(manifest):
        files[entry["file"]] = (None, entry["sha256"])
    return files


def side_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The file entries (``file``, ``sha256``) a manifest names beside its shards: labels, the
    layout, a version's live records, added fields' columns."""
    return [manifest[k] for k in metadata.SIDE_FILES if k in manifest] + added.files(manifest)


def is_folder_store(out: str) -> bool:
    return os.path.isdir(out) and not os.path.islink(out) and \
        _load_manifest(os.path.join(out, metadata.MANIFEST_NAME)) is not None


def install_folder(partial: str, out: str) -> None:
    """Overwrite the folder store ``out`` with the finished folder store ``partial``, atomically.

    See the module docstring. ``partial`` is emptied and removed.
    """
    manifest_path = os.path.join(out, metadata.MANIFEST_NAME)
    new = _load_manifest(os.path.join(partial, metadata.MANIFEST_NAME))
    if new is None:
        raise PackError(f"{partial}: finished store has no valid manifest")
    old = _load_manifest(manifest_path)
    if old is None:
        raise PackError(f"{out} is not a folder store")
    live = _live_files(out, old)
    entries = list(new["shards"]) + side_entries(new)
    moves: list[tuple[str, str | None]] = []  # (file in partial, its name in out or None)
    for entry in entries:
        name, sha = entry["file"], entry["sha256"]
        src = os.path.join(partial, name)
        if not os.path.lexists(src) and versions.KEY in new:
            # A new version names the files of the one it changes, installed already.
            if name in live and live[name][1] == sha:
                continue
            raise PackError(f"{partial}: {name} is neither in the new version nor in {out}")
        size = os.path.getsize(src)
        for candidate in (name, _unique_name(name, sha)):
            dst = os.path.join(out, candidate)
            if candidate in live:
                if live[candidate][1] == sha and live[candidate][0] in (None, size) \
                        and has_size(dst, size):
                    moves.append((src, None))  # identical bytes are installed already
                    break
                continue  # a file some reader may use: never touched
            moves.append((src, dst))
            break
        else:  # pragma: no cover - needs a SHA-256 prefix collision
            raise PackError(f"cannot find a free name for {name} in {out}")
        entry["file"] = candidate
    if versions.KEY not in new and (versions.KEY in old or versions.numbers(out)):
        # A store that keeps versions stays one: what replaces it is its next version.
        new = versionmeta.stamp(new, versions.number_of(old) + 1, {"kind": "overwrite"})
    new = metadata.seal(new)
    # What needs disk space is written before any file moves: if it fails (disk full), `partial`
    # is still a whole store and OUT is untouched.
    tmp = os.path.join(out, f".manifest.{uuid.uuid4().hex}.tmp")
    retired = os.path.join(out, f"{RETIRED_PREFIX}{uuid.uuid4().hex}.json")
    try:
        write_synced(tmp, metadata.dumps(new))
        try:
            os.link(manifest_path, retired)  # same inode: the lock its readers hold stays testable
        except OSError:  # no hard links here: a copy still lists the files (readers unprotected)
            import shutil

            shutil.copyfile(manifest_path, retired)
    except BaseException:
        unlink(tmp)
        unlink(retired)
        raise
    if versions.KEY in new:  # the version it changes is kept, whatever happens next
        versions.keep_current(out)
    for src, dst in moves:
        if dst is None:
            os.unlink(src)
        else:
            os.replace(src, dst)
    os.replace(tmp, manifest_path)  # the switch
    fsync_dir(out)
    if versions.KEY in new:
        versions.keep_current(out)
    remove(partial)
    collect_garbage(out)


def _unique_name(name: str, sha: str) -> str:
    stem, ext = os.path.splitext(name)
    stem = re.sub(r"-[0-9a-f]{16}$", "", stem)
    return f"{stem}-{sha[:16]}{ext}"


def _live_files(out: str, current: dict[str, Any] | None) -> dict[str, tuple[int | None, str]]:
    """Files of the current manifest, of every kept version (:mod:`shardkit.versions`) and of
    retired manifests that readers still hold."""
    live = _files_of(current) if current is not None else {}
    for kept in versions.kept_manifests(out):
        live.update({k: v for k, v in _files_of(kept).items() if k not in live})
    for retired in _retired(out):
        if _in_use(retired):
            manifest = _load_manifest(retired)
            if manifest is not None:
                live.update({k: v for k, v in _files_of(manifest).items() if k not in live})
    return live


def retire(path: str, out: str) -> None:
    """Take the manifest at ``path`` out of use: it moves to a hidden retired name in ``out``
    (the same inode, so the lock its readers hold stays testable), and its files are deleted
    by :func:`collect_garbage` once no reader holds it."""
    retired = os.path.join(out, f"{RETIRED_PREFIX}{uuid.uuid4().hex}.json")
    try:
        os.link(path, retired)
    except FileNotFoundError:
        return
    except OSError:  # no hard links: the copy lists the files (readers unprotected)
        import shutil

        shutil.copyfile(path, retired)
    unlink(path)


def _retired(out: str) -> list[str]:
    try:
        names = os.listdir(out)
    except OSError:
        return []
    return [os.path.join(out, n) for n in sorted(names) if n.startswith(RETIRED_PREFIX)]


def _in_use(path: str) -> bool:
    """Does any reader hold the shared lock on this (retired) manifest?"""
    if fcntl is None:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def collect_garbage(out: str) -> None:
    """Delete files of ``out`` that neither the manifest nor a still-read old one refers to.

    Only names shardkit itself writes are ever deleted.
    """
    if not _maybe_garbage(out):
        return
    current = _load_manifest(os.path.join(out, metadata.MANIFEST_NAME))
    if current is None:
        return
    live = _live_files(out, current)
    for path in _retired(out):
        if not _in_use(path):
            unlink(path)
    try:
        names = os.listdir(out)
    except OSError:
        return
    for name in names:
        if name not in live and not name.startswith(RETIRED_PREFIX) and _OURS.match(name):
            unlink(os.path.join(out, name))


_FILE_VALUE = re.compile(rb'"file": "([^"\\]*)"')  # as metadata.dumps writes an entry's file


def _maybe_garbage(out: str) -> bool:
    """Whether ``out`` holds a file :func:`collect_garbage` might delete: a name of ours that
    the manifest's text does not give as a ``"file"``, or a retired manifest. Else (a fresh
    install, each of its files named) the manifest is not parsed: parsing and checking its
    shards' records cost about 1.9 KB a shard, this about 250 bytes."""
    try:
        with open(os.path.join(out, metadata.MANIFEST_NAME), "rb") as f:
            named = set(_FILE_VALUE.findall(f.read()))
        names = os.listdir(out)
    except OSError:
        return True  # the full check decides (and deletes nothing without a manifest)
    return any(_OURS.match(name) and os.fsencode(name) not in named for name in names)


def _aside_prefix(out: str) -> tuple[str, str]:
    head, tail = os.path.split(os.path.abspath(out))
    return head, f".{tail}.old-"


def swap_aside(partial: str, out: str) -> None:
    """Replace ``out`` by ``partial`` when an atomic rename cannot (a file by a folder, or back).

    ``out`` is renamed to a hidden sibling first, so it is missing for a moment, never mixed.
    It is left there for :func:`collect_aside` (a folder store stays while readers hold it).
    """
    head, prefix = _aside_prefix(out)
    old = os.path.join(head, f"{prefix}{uuid.uuid4().hex[:12]}")
    os.rename(out, old)
    try:
        os.rename(partial, out)
    except BaseException:
        os.rename(old, out)
        raise
    fsync_dir(head)


def collect_aside(out: str) -> None:
    """Delete what :func:`swap_aside` moved away from ``out``, once no reader holds it.

    A file goes at once (its readers hold it open). A folder store goes when no reader holds the
    lock on its manifest or on a retired one: readers of a folder store open its shard files
    lazily, and find them through the manifest they hold, wherever the folder now is.
    """
    head, prefix = _aside_prefix(out)
    try:
        names = os.listdir(head)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and re.fullmatch(r"[0-9a-f]{12}", name[len(prefix):])):
            continue
        path = os.path.join(head, name)
        if not os.path.isdir(path) or os.path.islink(path):
            unlink(path)
        elif not any(_in_use(m) for m in [os.path.join(path, metadata.MANIFEST_NAME),
                                          *_retired(path)]):
            remove(path)

