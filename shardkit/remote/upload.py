"""Writing a folder store to a URL prefix: :class:`Uploader` (see :mod:`shardkit.remote`)."""

from __future__ import annotations

import os
from typing import Any

from .. import metadata
from ..errors import PackError, StoreError
from .access import ObjectNotFound, _Remote

RECORDS = ".shardkit-upload"


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
