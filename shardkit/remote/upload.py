"""Writing a folder store to a URL prefix: :class:`Uploader` (see :mod:`shardkit.remote`)."""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import Any

from .. import metadata, storemeta
from ..versions import VERSIONS_DIR
from ..errors import PackError, StoreError
from .access import ObjectNotFound, RemoteTarget, read_manifest
from .packlock import PackLock
from .verify import put_verified

RECORDS = ".shardkit-upload"
# The names of the replaced store's files an overwrite deletes once the new manifest is up (kept
# under RECORDS, so a rerun after a kill still knows them).
REPLACED = f"{RECORDS}/replaced.json"
# Names of the files a pack writes into a folder store (shardkit.packing.plan), besides the
# manifest: what a prefix must not hold already (unless ``overwrite``), and the only names an
# overwrite ever deletes.
_SHARD_NUMBER = re.compile(r"shard-(\d{5,})(\.[A-Za-z0-9]+)")
_STORE_FILE = re.compile(r"(shard-\d{5,}|labels|layout|records)(-[0-9a-f]{8,})?\.[A-Za-z0-9]+"
                         rf"|{VERSIONS_DIR}/\d{{1,9}}\.json")


class Uploader:
    """Uploads a folder store to ``url``: shards as they finish, then labels, manifest last.

    ``overwrite`` deletes an existing remote manifest first (so a killed upload leaves none)
    and, once the new manifest is up, the files that manifest named and the new store does not
    have; nothing else under the prefix is ever deleted. Without it a prefix that holds a store
    is refused. ``resume`` keeps shards whose upload record and remote size match. Every upload
    is checked against the file's SHA-256 (:mod:`shardkit.remote.verify`). Picklable, so
    workers can upload their own shards.

    The prefix's lock (:mod:`shardkit.remote.packlock`) is taken before anything is written
    there, checked before each shard, side file and the manifest is installed, and given back
    by :meth:`finish` or :meth:`close`.

    ``base``: the bytes of the manifest of the store under ``url`` that a new version is made
    of (an append): the store is kept, the new shards are uploaded under the names
    ``shard-<first_shard + k>`` (an object there is written over only where an upload record
    says a killed append of shardkit's left it), and :meth:`publish_version` installs the
    version, if the store's manifest is still ``base`` once the lock is taken and right before
    the switch.
    """

    def __init__(self, url: str | os.PathLike, storage_options: dict[str, Any] | None = None, *,
                 resume: bool = False, overwrite: bool = False, base: bytes | None = None,
                 first_shard: int = 0) -> None:
        self.remote = RemoteTarget(url, storage_options)
        self.resume = resume
        self.base, self.first_shard = base, first_shard
        self.lock = PackLock(url, storage_options)
        self.lock.acquire(resume=resume, overwrite=overwrite)
        try:
            if base is not None:  # before anything is uploaded: names of a newer version
                self.check_base("any shard")  # would be written over
            self._start(overwrite and base is None)
        except BaseException:
            self.lock.release()
            raise

    def _start(self, overwrite: bool) -> None:
        resume = self.resume
        old = None if self.base is not None else _existing_store(self.remote, overwrite)
        # An interrupted overwrite's list: its store's files are orphans now, still to delete.
        replaced = _read_names(self.remote, REPLACED) if overwrite or resume else set()
        if not resume and self.base is None:  # an append's mark its leftover shards as ours
            self._remove_records()
        if old is not None:
            replaced |= old
        if replaced:
            self.remote.retry(REPLACED, lambda: self.remote.fs.pipe_file(
                self.remote.path(REPLACED), json.dumps(sorted(replaced)).encode()))
        if old is not None:
            manifest = metadata.MANIFEST_NAME
            self.remote.retry(manifest, lambda: self.remote.fs.rm_file(
                self.remote.path(manifest)))
        self.replaced = replaced

    def remote_name(self, name: str) -> str:
        """The object a shard packed as ``name`` (``shard-NNNNN.ext``) is uploaded as."""
        found = _SHARD_NUMBER.fullmatch(name)
        if not self.first_shard or found is None:
            return name
        return f"shard-{int(found.group(1)) + self.first_shard:05d}{found.group(2)}"

    def put_shard(self, local_path: str, name: str, sha256: str, size: int) -> bool:
        """Upload one finished shard file; False when ``resume`` found it uploaded already."""
        name = self.remote_name(name)
        if self.resume and self.uploaded(name, sha256, size):
            return False
        self.lock.check(name)
        if self.base is not None:
            self._refuse_foreign(name)
        record = self._record(name)
        # The record first says the upload started: a pack killed while the PUT is in flight
        # (which may still complete on the server) leaves an object this prefix can tell is
        # its own, so `resume` replaces it instead of refusing it as the user's.
        self.remote.retry(record, lambda: self.remote.fs.pipe_file(
            self.remote.path(record), json.dumps({"file": name, "uploading": True}).encode()))
        put_verified(self.remote, local_path, name, size, sha256)
        self.remote.retry(record, lambda: self.remote.fs.pipe_file(
            self.remote.path(record), _record_bytes(name, sha256, size)))
        return True

    def uploaded(self, name: str, sha256: str, size: int) -> bool:
        """Is this shard (same name, size, SHA-256) uploaded by this or an interrupted run?"""
        name = self.remote_name(name)
        fs, record = self.remote.fs, self._record(name)
        try:
            found = self.remote.retry(record, lambda: fs.cat_file(self.remote.path(record)))
            remote_size = self.remote.retry(name, lambda: fs.size(self.remote.path(name)))
        except ObjectNotFound:
            return False
        return found == _record_bytes(name, sha256, size) and remote_size == size

    def _refuse_foreign(self, name: str) -> None:
        """PackError when object ``name``, a shard name no version uses that an append is about
        to write, exists without an upload record: shardkit did not write it (a killed append's
        shards keep their records until a version names them)."""
        fs = self.remote.fs
        try:
            fs.invalidate_cache(self.remote.path(name))
            self.remote.retry(name, lambda: fs.size(self.remote.path(name)))
        except ObjectNotFound:
            return
        record = self._record(name)
        try:
            self.remote.retry(record, lambda: fs.size(self.remote.path(record)))
        except ObjectNotFound:
            raise PackError(f"{self.remote.where(name)} exists and was not written by shardkit "
                            "(no version names it, no upload record); it is kept and nothing "
                            "was switched: move it, or append to another prefix") from None

    @staticmethod
    def _record(name: str) -> str:
        return f"{RECORDS}/{name}.json"

    def finish(self, local_folder: str | os.PathLike) -> None:
        """Upload ``labels.npy`` and then ``manifest.json`` of the finished local folder store."""
        manifest_path = os.path.join(os.fspath(local_folder), metadata.MANIFEST_NAME)
        with open(manifest_path, "rb") as f:
            meta = storemeta.parse_manifest(f.read(), manifest_path)
        sides = [meta["labels"]]
        if "layout" in meta:  # the record layout (shardkit.packing.layout), before the manifest
            sides.append(meta["layout"])
        for side in sides:
            local = os.path.join(os.fspath(local_folder), side["file"])
            self.lock.check(side["file"])
            put_verified(self.remote, local, side["file"], os.path.getsize(local), side["sha256"])
        self.lock.check(metadata.MANIFEST_NAME)
        put_verified(self.remote, manifest_path, metadata.MANIFEST_NAME,
                     os.path.getsize(manifest_path))
        keep = {e["file"] for e in meta["shards"]} | {side["file"] for side in sides}
        self._remove_replaced(keep)
        self._remove_records()
        self.close()

    def check_base(self, name: str) -> None:
        """PackError unless the store's manifest is still the one a new version is made of."""
        try:
            now = read_manifest(self.remote)
        except ObjectNotFound:
            now = None
        if now != self.base:
            raise PackError(f"{self.remote.url} changed while its next version was made (another "
                            f"version was installed meanwhile); stopped before writing {name}, "
                            "nothing was switched: run it again")

    def publish_version(self, local_folder: str | os.PathLike, sides: list[str], old: int,
                        old_raw: bytes, new: int) -> None:
        """Install the finished version ``new`` of the store in ``local_folder``: upload its
        side files ``sides``, the manifest of the version it replaces (``versions/<old>.json``,
        ``old_raw``; where missing), replace ``manifest.json`` (the switch), if it is still
        :attr:`base` (else PackError, nothing switched), then ``versions/<new>.json``. Nothing
        is deleted or written over but this pack's own upload records."""
        folder = os.fspath(local_folder)
        for name in sides:
            local = os.path.join(folder, name)
            self.lock.check(name)
            put_verified(self.remote, local, name, os.path.getsize(local))
        name = f"{VERSIONS_DIR}/{old}.json"
        if not self.remote.retry(name, lambda: self.remote.fs.exists(self.remote.path(name))):
            local = os.path.join(folder, f".version-{old}.json")
            with open(local, "wb") as f:
                f.write(old_raw)
            self.lock.check(name)
            put_verified(self.remote, local, name, len(old_raw))
        self.lock.check(metadata.MANIFEST_NAME)
        self.check_base(metadata.MANIFEST_NAME)
        manifest_path = os.path.join(folder, metadata.MANIFEST_NAME)
        size = os.path.getsize(manifest_path)
        put_verified(self.remote, manifest_path, metadata.MANIFEST_NAME, size)  # the switch
        # Kept after the switch: a version file is never one of a version not installed.
        put_verified(self.remote, manifest_path, f"{VERSIONS_DIR}/{new}.json", size)
        with open(manifest_path, "rb") as f:
            meta = json.loads(f.read())
        self._remove_records({e["file"] for e in meta["shards"]} | set(sides))
        self.close()

    def close(self) -> None:
        """Give the prefix's lock back (deleted if still this pack's); :meth:`finish` does."""
        self.lock.release()

    def _remove_replaced(self, keep: set[str]) -> None:
        """Delete the files the replaced store's manifest named that the new store does not."""
        fs = self.remote.fs
        for name in sorted(self.replaced - keep):
            if _STORE_FILE.fullmatch(name):
                try:
                    self.remote.retry(name, lambda n=name: fs.rm_file(self.remote.path(n)))
                except ObjectNotFound:
                    pass

    def _remove_records(self, named: set[str] | None = None) -> None:
        """Delete the upload records (``named``: only those of objects the installed version
        names; the others mark objects a killed append left as shardkit's, for the next one to
        write over)."""
        fs, path = self.remote.fs, self.remote.path(RECORDS)
        if named is not None:
            gone = [self.remote.path(f"{RECORDS}/{n}") for n in _listing(self.remote, RECORDS)
                    if n.removesuffix(".json") in named]
            if gone:
                self.remote.retry(RECORDS, lambda: fs.rm(gone))
            return
        try:
            self.remote.retry(RECORDS, lambda: fs.rm(path, recursive=True))
        except ObjectNotFound:
            pass


def _existing_store(remote: RemoteTarget, overwrite: bool) -> set[str] | None:
    """The files named by the store ``remote`` holds and by its kept versions, with those
    versions' manifests (refused unless ``overwrite``; an empty set for a manifest that cannot
    be read), or None when it holds none."""
    manifest = metadata.MANIFEST_NAME
    if not remote.retry(manifest, lambda: remote.fs.exists(remote.path(manifest))):
        return None
    if not overwrite:
        raise PackError(f"{remote.url} already holds a store ({manifest}); pass "
                        "`overwrite=True` to replace it")
    names: set[str] = set()
    kept = [f"{VERSIONS_DIR}/{n}" for n in _listing(remote, VERSIONS_DIR)
            if re.fullmatch(r"\d{1,9}\.json", n)]
    for name in [manifest, *kept]:
        try:
            meta = storemeta.parse_manifest(read_manifest(remote, name), remote.where(name))
        except StoreError:  # damaged or unreadable: none of its files can be told apart
            continue
        names |= {e["file"] for e in meta["shards"]}
        names |= {meta[k]["file"] for k in metadata.SIDE_FILES if k in meta}
    return names | set(kept)


def _read_names(remote: RemoteTarget, name: str) -> set[str]:
    """The list of names in the JSON object ``name`` (empty when missing or not such a list)."""
    try:
        found = json.loads(remote.retry(name, lambda: remote.fs.cat_file(remote.path(name))))
    except (ObjectNotFound, ValueError, RecursionError):
        return set()
    return {n for n in found if isinstance(n, str)} if isinstance(found, list) else set()


def _listing(remote: RemoteTarget, folder: str = "") -> list[str]:
    """Names of the objects directly under the prefix (or its ``folder``)."""
    fs, root = remote.fs, remote.path(folder)
    try:
        paths = remote.retry(folder, lambda: fs.ls(root, detail=False, refresh=True))
    except ObjectNotFound as exc:
        if exc.code == "NoSuchBucket":
            raise
        return []
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in paths]


def _foreign_objects(remote: RemoteTarget, overwrite: bool) -> list[str]:
    """Objects under the prefix named like a store's files that shardkit did not write there:
    not named by its manifest, an upload record of an interrupted pack, or an interrupted
    overwrite's list."""
    found = sorted(n for n in _listing(remote) if _STORE_FILE.fullmatch(n))
    if not found:
        return []
    ours = _existing_store(remote, overwrite) or set()
    ours |= {n.removesuffix(".json") for n in _listing(remote, RECORDS) if n.endswith(".json")}
    ours |= _read_names(remote, REPLACED)
    return [n for n in found if n not in ours]


def check_filesystem(url: str | os.PathLike, storage_options: dict[str, Any] | None = None
                     ) -> None:
    """Refuse, with no request sent and nothing made locally, a URL whose filesystem cannot be
    made here (an unknown protocol, its package not installed)."""
    RemoteTarget(url, storage_options).fs  # noqa: B018 - raises ShardkitError, one line


def check_target(url: str | os.PathLike, storage_options: dict[str, Any] | None = None,
                 overwrite: bool = False, resume: bool = False) -> None:
    """Refuse an upload target before any work: its filesystem unavailable, the endpoint
    unreachable, the bucket missing, a store there without ``overwrite``, another pack holding
    its lock (or a stale lock, unless ``resume`` or ``overwrite``: :mod:`.packlock`), the
    credentials refused (a small probe object is written and deleted under ``RECORDS``), or (without
    ``overwrite``) other objects named like a store's files, which a store written there would
    mix with (with ``overwrite`` they are kept, unless a new file has the same name)."""
    remote = RemoteTarget(url, storage_options)
    probe = f"{RECORDS}/probe-{uuid.uuid4().hex[:12]}"
    try:
        _existing_store(remote, overwrite)
        PackLock(url, storage_options).check_free(resume, overwrite)
        remote.retry(probe, lambda: remote.fs.pipe_file(remote.path(probe), b"shardkit"))
        remote.retry(probe, lambda: remote.fs.rm_file(remote.path(probe)))
        foreign = _foreign_objects(remote, overwrite)
    except PackError:
        raise
    except StoreError as exc:
        raise PackError(f"cannot write to {remote.url}: {exc}") from None
    if foreign and not overwrite:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3
                                          else "")
        raise PackError(f"{remote.url} holds objects not written by shardkit that are named "
                        f"like a store's files ({shown}); pack to another prefix, or pass "
                        "`overwrite=True` to write there anyway (they are kept, except any a "
                        "new file replaces by name)")


def upload_folder_store(local_folder: str | os.PathLike, url: str | os.PathLike,
                        storage_options: dict[str, Any] | None = None, *, resume: bool = False,
                        overwrite: bool = False) -> int:
    """Upload a finished local folder store to ``url`` (manifest last); returns shards uploaded."""
    folder = os.fspath(local_folder)
    manifest_path = os.path.join(folder, metadata.MANIFEST_NAME)
    try:
        with open(manifest_path, "rb") as f:
            meta = storemeta.parse_manifest(f.read(), manifest_path)
    except FileNotFoundError:
        raise StoreError(f"{folder} is not a folder store (no {metadata.MANIFEST_NAME})") from None
    check_target(url, storage_options, overwrite, resume)
    uploader = Uploader(url, storage_options, resume=resume, overwrite=overwrite)
    try:
        uploaded = sum(uploader.put_shard(os.path.join(folder, e["file"]), e["file"],
                                          e["sha256"], e["bytes"])
                       for e in meta["shards"])
        uploader.finish(folder)
    finally:
        uploader.close()
    return uploaded


def _record_bytes(name: str, sha256: str, size: int) -> bytes:
    return metadata.dumps({"bytes": size, "file": name, "sha256": sha256})
