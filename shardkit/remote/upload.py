"""Writing a folder store to a URL prefix: :class:`Uploader` (see :mod:`shardkit.remote`)."""

from __future__ import annotations

import os
import re
import uuid
from typing import Any

from .. import metadata
from ..errors import PackError, StoreError
from .access import ObjectNotFound, _Remote
from .verify import put_verified

RECORDS = ".shardkit-upload"
# The files a pack writes into a folder store (shardkit.packing.plan), besides the manifest.
_STORE_FILE = re.compile(r"(shard-\d{5,}|labels|layout)(-[0-9a-f]{8,})?\.[A-Za-z0-9]+")


class Uploader:
    """Uploads a folder store to ``url``: shards as they finish, then labels, manifest last.

    ``overwrite`` deletes an existing remote manifest first (so a killed upload leaves none)
    and, once the new manifest is up, the old store's files the new one does not have; without
    it a prefix that holds a store is refused. ``resume`` keeps shards whose upload record and
    remote size match. Every upload is checked against the file's SHA-256
    (:mod:`shardkit.remote.verify`). Picklable, so workers can upload their own shards.
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
        put_verified(self.remote, local_path, name, size, sha256)
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
        sides = [meta["labels"]]
        if "layout" in meta:  # the record layout (shardkit.packing.layout), before the manifest
            sides.append(meta["layout"])
        for side in sides:
            local = os.path.join(os.fspath(local_folder), side["file"])
            put_verified(self.remote, local, side["file"], os.path.getsize(local), side["sha256"])
        put_verified(self.remote, manifest_path, metadata.MANIFEST_NAME,
                     os.path.getsize(manifest_path))
        self._remove_records()
        keep = {e["file"] for e in meta["shards"]} | {side["file"] for side in sides}
        self._remove_stale(keep)

    def _remove_stale(self, keep: set[str]) -> None:
        """Delete the store files under the prefix that the new store does not name (left by
        the store it replaced): the objects are exactly a local store's files."""
        fs, root = self.remote.fs, self.remote.path("")
        listing = self.remote.retry("", lambda: fs.ls(root, detail=False, refresh=True))
        for path in listing:
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if _STORE_FILE.fullmatch(name) and name not in keep:
                self.remote.retry(name, lambda p=path: fs.rm_file(p))

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
    """Refuse an upload target before any work: its filesystem unavailable, the endpoint
    unreachable, the bucket missing, the credentials refused (a small probe object is written
    and deleted under ``RECORDS``), or a store there without ``overwrite``."""
    remote = _Remote(url, storage_options)
    probe = f"{RECORDS}/probe-{uuid.uuid4().hex[:12]}"
    try:
        _holds_store(remote, overwrite)
        remote.retry(probe, lambda: remote.fs.pipe_file(remote.path(probe), b"shardkit"))
        remote.retry(probe, lambda: remote.fs.rm_file(remote.path(probe)))
    except PackError:
        raise
    except StoreError as exc:
        raise PackError(f"cannot write to {remote.url}: {exc}") from None


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
