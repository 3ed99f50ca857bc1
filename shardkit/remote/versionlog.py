"""``shardkit log`` and ``shardkit gc`` of a folder store under a URL prefix.

The store's versions are the objects ``versions/<N>.json`` beside ``manifest.json``
(:mod:`shardkit.packing.append_remote`); only those small JSON objects are read, each through
:func:`~shardkit.remote.access.read_manifest` (size-checked, retried, cut at a deadline).

``gc`` takes the prefix's lock as an append or update does (:class:`PackLock`: refused in one
line while another writer holds it), reads every version under it, and deletes, one object at a
time, the files that only dropped versions name (shards, ``labels-*.npy`` and the other side
files), then those versions' ``versions/<N>.json``. An object that no version of the store
names is never deleted (the user's, or a killed append's upload), nor one that a kept version
or the current manifest names, so readers of kept versions read what they read before. A
version's files go before its JSON: a killed gc leaves the version listed, and run again it
finishes the job.
"""

from __future__ import annotations

import re
from typing import Any

from .. import metadata, storemeta
from ..errors import StoreError
from ..swap import side_entries
from ..versionmeta import number_of
from ..versions import VERSIONS_DIR
from .access import ObjectNotFound, RemoteFolder, RemoteTarget, read_manifest
from .listing import list_folder
from .packlock import LOCK_NAME, PackLock

_NAME = re.compile(r"^(\d{1,9})\.json$")


def version_numbers(remote: RemoteTarget) -> list[int]:
    """The numbers of the ``versions/<N>.json`` objects under the prefix, ascending."""
    _, paths = list_folder(remote, VERSIONS_DIR)
    found = (_NAME.match(p.rstrip("/").rsplit("/", 1)[-1]) for p in paths)
    return sorted(int(m.group(1)) for m in found if m)


def read_version(remote: RemoteTarget, number: int) -> dict[str, Any]:
    """Version ``number``'s manifest, checked; StoreError naming the object where it is
    missing, damaged or another version's."""
    name = f"{VERSIONS_DIR}/{number}.json"
    try:
        manifest = storemeta.parse_manifest(read_manifest(remote, name), remote.where(name))
    except ObjectNotFound:
        raise StoreError(f"{remote.where(name)} is listed but could not be read (deleted "
                         "meanwhile?); run it again") from None
    if number_of(manifest) != number:
        raise StoreError(f"{remote.where(name)} is version {number_of(manifest)}, not {number}: "
                         "the store is damaged")
    return manifest


def kept_manifests(url: str, storage_options: dict[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """Every kept version's manifest of the store under ``url``, oldest first; the current
    manifest where it is not kept as its version (a store never changed)."""
    current = RemoteFolder(url, storage_options)
    found = [read_version(current, n) for n in version_numbers(current)]
    if number_of(current.meta) not in {number_of(m) for m in found}:
        found = sorted(found + [current.meta], key=number_of)
    return found


def files_of(manifest: dict[str, Any]) -> set[str]:
    """The objects a version reads besides its manifest: shards and side files."""
    return {e["file"] for e in manifest["shards"]} | {e["file"] for e in side_entries(manifest)}


def gc(url: str, keep: int, storage_options: dict[str, Any] | None = None) -> list[int]:
    """Drop all but the newest ``keep`` versions of the store under ``url`` (the current one is
    always kept) and delete the objects only they name (see the module doc). Returns the
    numbers dropped. PackError while another writer holds the prefix's lock; StoreError naming
    the object where a version cannot be read or an object cannot be deleted."""
    RemoteFolder(url, storage_options)  # no store there: refused before the lock is written
    lock = PackLock(url, storage_options)
    lock.acquire()
    try:
        current = RemoteFolder(url, storage_options)  # read under the lock: no switch meanwhile
        latest = number_of(current.meta)
        numbers = version_numbers(current)
        found = {n: read_version(current, n) for n in numbers}
        kept = [n for n in numbers if n <= latest][-keep:] + [latest]
        dropped = [n for n in numbers if n not in kept]
        live = files_of(current.meta).union(*(files_of(found[n]) for n in kept if n in found))
        doomed = set().union(*(files_of(found[n]) for n in dropped)) - live
        # Never the switch, the lock or a kept version's JSON, whatever a version names.
        doomed -= {metadata.MANIFEST_NAME, LOCK_NAME}
        for name in sorted(doomed) + [f"{VERSIONS_DIR}/{n}.json" for n in dropped]:
            lock.check(name)
            _delete(current, name)
    finally:
        lock.release()
    return dropped


def _delete(remote: RemoteTarget, name: str) -> None:
    """Delete object ``name``; one already gone (a gc killed after deleting it) is fine."""
    fs, path = remote.fs, remote.path(name)
    try:
        remote.retry(name, lambda: fs.rm_file(path))
    except ObjectNotFound:
        pass
    except StoreError as exc:
        raise StoreError(f"cannot delete {exc}; the versions being dropped stay listed until "
                         "a gc finishes") from None
