"""``pack(src, URL, append=True)``: the next version of a folder store in object storage.

What an append to a local folder store does (:mod:`.append`), with the store's files under a
URL prefix:

* the store's manifest and side files (labels, layout, live records) are downloaded into a local
  folder beside the pack's staging folder; every record's key is read from the shards' path
  arrays, which needs the shard file: each shard is downloaded once (checked against the
  manifest's SHA-256) into that folder, its keys are kept under
  ``$SHARDKIT_CACHE_DIR/pack-keys/<shard sha256>.json`` and the file deleted, so a machine
  downloads a shard for its keys once however many appends it runs (a shard never changes);
* the new records are packed and uploaded as new shards, ``shard-<n + k>`` after the store's
  ``n`` (:class:`shardkit.remote.Uploader` with ``base``), under the prefix's lock, which is
  taken only if the manifest is still the one the append read;
* the union's labels, layout and live records are uploaded under names no version uses
  (``labels-<sha256 prefix>.npy``), then ``versions/<N>.json`` of the version replaced (if
  missing), then ``manifest.json`` (the switch: if the manifest is still the one the append
  read, else PackError and nothing is switched), then ``versions/<N + 1>.json``.

Nothing of the store is deleted or written over, so readers of the version before (and of any
kept one, ``ShardDataset(url, version=N)``) keep reading it. A killed append's new shards are
named by no version; ``resume=True`` keeps those it uploaded and checked (its staging folder's
shard entries, matched with their upload records, as a pack to a URL resumes), and a later
append writes over them only by those records: never an object shardkit did not write.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from .. import metadata, storemeta
from ..errors import PackError, PackOptionError, StoreError
from ..fileutil import remove, replace_atomic, sha256_file
from ..versionmeta import number_of
from . import added_upload
from .append import (Base, check_appendable, combine, held_keys, live_records, logical_keys,
                     next_shard, shard_keys)
from .staging import staging_path


@dataclass(frozen=True)
class RemoteBase(Base):
    """A store under a URL an append adds to: its manifest's bytes, and the local folder its
    side files were downloaded to."""

    folder: str
    raw: bytes
    storage_options: dict[str, Any] | None

    @property
    def local(self) -> str:
        return self.folder


def load_remote_base(out: str, storage_options: dict[str, Any] | None,
                     bucketed: bool = False, keys: bool = True) -> RemoteBase:
    """The folder store under the URL ``out`` with every record's key (see the module doc).
    ``bucketed``: a store packed with buckets is taken (an append: :mod:`.bucket_append`);
    ``keys=False``: no key read, no shard downloaded (a change that names no key)."""
    from ..remote import RemoteFolder
    from ..remote.access import read_manifest

    try:
        remote = RemoteFolder(out, storage_options)
        raw = read_manifest(remote)
    except StoreError as exc:
        raise PackOptionError(f"`append` needs an existing folder store: {exc}") from None
    manifest = storemeta.parse_manifest(raw, remote.where(metadata.MANIFEST_NAME))
    if hashlib.sha256(raw).hexdigest() != remote.manifest_sha256:
        raise PackError(f"{out}: its manifest changed while it was read; run it again")
    if not bucketed:
        check_appendable(out, manifest)
    if next_shard(manifest) is None:  # the new shards' names follow the store's
        raise PackOptionError(f"{out}: `append` needs shards named shard-NNNNN in increasing "
                              "order, as a pack names them; this store's are not (repack it)")
    folder = f"{staging_path(remote.url, storage_options)}.base"
    remove(folder)
    os.makedirs(folder)
    for key in metadata.SIDE_FILES:
        if key in manifest:
            _download(remote, manifest[key]["file"], manifest[key]["sha256"], folder)
    if not keys:
        return RemoteBase(remote.url, manifest, frozenset(), [],
                          live_records(folder, manifest, manifest["count"]), folder, raw,
                          storage_options)
    physical: list[str] = []
    for entry in manifest["shards"]:
        physical.extend(_keys_of(remote, entry, folder))
    ordered = logical_keys(folder, manifest, physical)
    live = live_records(folder, manifest, len(ordered))
    return RemoteBase(remote.url, manifest, held_keys(manifest, ordered, live), ordered, live,
                      folder, raw, storage_options)


def uploader_options(base: Base) -> dict[str, Any]:
    """What the pack's :class:`shardkit.remote.Uploader` is given for an append to ``base``."""
    if not isinstance(base, RemoteBase):
        raise PackOptionError(f"{base.out}: `append` to a URL needs the store there")
    return {"base": base.raw, "first_shard": next_shard(base.manifest)}


def publish(partial: str, base: RemoteBase, uploader: Any, replacing: bool) -> None:
    """Install the new records packed (and uploaded) from ``partial`` as the store's next
    version (see the module doc); ``replacing``: each new record supersedes the one with its
    key."""
    keys = _new_keys(partial, base, uploader) if replacing else None
    try:
        sealed = combine(partial, base, replacing, uploaded=True, new_keys=keys)
    except OSError as exc:
        raise PackError(f"cannot write the new version of {base.out}: "
                        f"{exc.strerror or exc}; the store is unchanged") from None
    install(partial, base, sealed, uploader)


def _new_keys(partial: str, base: RemoteBase, uploader: Any) -> list[str]:
    """The keys of the new records (their shards' order), read from their uploaded shards as a
    store's are (each downloaded once, checked, its keys kept for the next append here)."""
    from ..remote import RemoteFolder

    path = os.path.join(partial, metadata.MANIFEST_NAME)
    with open(path, "rb") as f:
        new = storemeta.parse_manifest(f.read(), path)
    remote = RemoteFolder(base.out, base.storage_options)
    return [key for e in new["shards"]
            for key in _keys_of(remote, e | {"file": uploader.remote_name(e["file"])},
                                base.folder)]


def install(partial: str, base: RemoteBase, manifest: dict[str, Any], uploader: Any) -> None:
    """Upload the version ``manifest`` made in ``partial`` (its side files there) and switch
    the store to it, under ``uploader``'s lock (:meth:`shardkit.remote.Uploader.publish_version`).
    """
    try:
        had = {(e["file"], e["sha256"]) for k in metadata.SIDE_FILES
               for e in [base.manifest.get(k)] if e is not None}
        sides = []
        for key in metadata.SIDE_FILES:
            entry = manifest.get(key)
            if entry is None or (entry["file"], entry["sha256"]) in had:
                continue
            stem, ext = os.path.splitext(entry["file"])
            name = f"{stem}-{entry['sha256'][:16]}{ext}"  # never a name a version reads
            os.replace(os.path.join(partial, entry["file"]), os.path.join(partial, name))
            manifest = manifest | {key: entry | {"file": name}}
            sides.append(name)
        manifest, columns = added_upload.renamed(partial, base.manifest, manifest)
        raw = metadata.dumps(metadata.seal(manifest))
        storemeta.parse_manifest(raw, partial)  # what every reader takes
        replace_atomic(os.path.join(partial, metadata.MANIFEST_NAME), raw)
    except OSError as exc:
        raise PackError(f"cannot write the new version of {base.out}: "
                        f"{exc.strerror or exc}; the store is unchanged") from None
    sides += added_upload.missing(uploader, partial, columns)
    uploader.publish_version(partial, sides, number_of(base.manifest), base.raw,
                             number_of(manifest))
    remove(base.folder)


def install_at_url(partial: str, base: Base, manifest: dict[str, Any],
                   uploader: Any = None) -> None:
    """The version ``manifest`` made in ``partial`` (``update``, ``compact``) installed in the
    store at a URL, under the prefix's lock (``uploader``'s, if given: it uploaded the
    version's new shards), if the store is still ``base``."""
    from ..remote import Uploader

    if not isinstance(base, RemoteBase):
        raise PackOptionError(f"{base.out}: a new version at a URL needs the store read there")
    if uploader is None:
        uploader = Uploader(base.out, base.storage_options, base=base.raw)
    try:
        install(partial, base, manifest, uploader)
    finally:
        uploader.close()


def _download(remote: Any, name: str, sha256: str, folder: str) -> str:
    path = os.path.join(folder, name)
    remote.get(name, path)
    if sha256_file(path) != sha256:
        raise StoreError(f"{remote.where(name)}: file is damaged or replaced (checksum differs "
                         "from the manifest)")
    return path


def _keys_of(remote: Any, entry: dict[str, Any], folder: str) -> list[str]:
    """The keys of one shard's records (physical order): kept on this machine by the shard's
    SHA-256, else read from the shard, downloaded for it."""
    from ..remote import default_cache_dir

    kept = os.path.join(os.path.abspath(default_cache_dir()), "pack-keys",
                        f"{entry['sha256']}.json")
    try:
        with open(kept, "rb") as f:
            keys = json.loads(f.read())
        if isinstance(keys, list) and len(keys) == entry["count"] and \
                all(isinstance(k, str) for k in keys):
            return keys
    except (OSError, ValueError, RecursionError):
        pass
    path = _download(remote, entry["file"], entry["sha256"], folder)
    try:
        keys = shard_keys(folder, {"shards": [entry]})
    finally:
        os.unlink(path)
    os.makedirs(os.path.dirname(kept), exist_ok=True)
    replace_atomic(kept, json.dumps(keys).encode("utf-8", "surrogateescape"))
    return keys
