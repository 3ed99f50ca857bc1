"""Numbered versions of a folder store, beside its manifest.

A folder store that has changed since it was packed (``pack(..., append=True)``, ``--append``)
keeps every install as an immutable, numbered version:

* ``manifest.json`` is the latest version's manifest, as in any folder store, with a ``version``
  record: ``{"number": N, "parent": N - 1, "time": ISO-8601 UTC, "change": {...}}`` (what
  changed: ``kind`` and counts);
* ``versions/<N>.json`` holds each kept version's manifest, byte for byte (the latest is a hard
  link of ``manifest.json``: the same file). A store packed once has no ``versions/`` folder and
  is version 1; its first change writes ``versions/1.json`` from the manifest it had.

Shard files never change once installed, and a version names the files it reads, so a reader
of version N (``ShardDataset(path, version=N)``, or whatever was latest when it opened the
store) reads the same bytes while N+1.. are installed. A file is deleted only when no kept
version names it (:func:`shardkit.swap.collect_garbage`), and versions are dropped only by
:func:`gc` (``shardkit gc OUT --keep K``).

Record keys: every record's key is its source path relative to SRC (as ``ds.source_path(i)``
gives it), or, for a store packed with ``id_key``, the value of that column or member of the
source (kept where the source path is); that is what ``append`` compares.
"""

from __future__ import annotations

import os
import re
from typing import Any

from . import metadata, storemeta
from .errors import OptionError, StoreError
from .fileutil import fsync_dir, unlink
from .versionmeta import KEY, number_of

VERSIONS_DIR = "versions"
_NAME = re.compile(r"^(\d{1,9})\.json$")
#: how a store's records are keyed (``shardkit info`` shows it)
KEYS = "source path relative to SRC"


def keys_rule(settings: dict[str, Any]) -> str:
    """How the records of a store with these ``settings`` are keyed (``shardkit info``)."""
    column = settings.get("id_key")
    return KEYS if column is None else f"column {column} of the source (id_key)"


def folder(store: str) -> str:
    return os.path.join(store, VERSIONS_DIR)


def path_of(store: str, number: int) -> str:
    """Where version ``number``'s manifest is kept."""
    return os.path.join(folder(store), f"{int(number)}.json")


def check_version(version: Any, store: str, remote: bool) -> None:
    """Refuse a ``version`` that is no number, or asked of a store that keeps none."""
    if version is None:
        return
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise OptionError(f"version must be a version number >= 1 or None, got {version!r}")
    if not remote and not os.path.isdir(store):
        raise OptionError(f"version: {store} is not a folder store (only those keep "
                          "versions)")


def manifest_path(store: str, version: int | None) -> str:
    """The manifest a reader of ``version`` (None: the current one) reads; StoreError where
    that version is not kept."""
    if version is None:
        return os.path.join(store, metadata.MANIFEST_NAME)
    path = path_of(store, version)
    if not os.path.lexists(path):
        current = os.path.join(store, metadata.MANIFEST_NAME)
        found = load(current)
        if found is not None and number_of(found) == version:  # a store never changed: 1
            return current
        kept = numbers(store)
        raise StoreError(f"{store} has no version {version} (kept: "
                         f"{', '.join(map(str, kept)) or 'only the current one'}; "
                         "`shardkit log` lists them)")
    return path


def numbers(store: str) -> list[int]:
    """The kept versions' numbers, ascending (none for a store never changed)."""
    try:
        names = os.listdir(folder(store))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)


def load(path: str) -> dict[str, Any] | None:
    """A kept manifest, parsed and checked; None where it is missing or not readable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(metadata.MAX_MANIFEST_BYTES + 1)
        return storemeta.parse_manifest(raw, path)
    except (OSError, StoreError):
        return None


def kept_manifests(store: str) -> list[dict[str, Any]]:
    """Every kept version's manifest (their files are live: never collected)."""
    found = (load(path_of(store, n)) for n in numbers(store))
    return [m for m in found if m is not None]


def keep_current(store: str) -> None:
    """Make sure the current manifest is kept as its version (a store changed for the first
    time, or an install killed between its switch and this link): ``versions/<N>.json`` becomes
    a hard link of ``manifest.json`` (a copy where links are not supported)."""
    manifest = os.path.join(store, metadata.MANIFEST_NAME)
    current = load(manifest)
    if current is None:
        return
    target = path_of(store, number_of(current))
    if os.path.exists(target):
        return
    os.makedirs(folder(store), exist_ok=True)
    tmp = f"{target}.tmp"
    unlink(tmp)
    try:
        os.link(manifest, tmp)
    except OSError:
        import shutil

        shutil.copyfile(manifest, tmp)
    os.replace(tmp, target)
    fsync_dir(folder(store))


__all__ = ["KEY", "VERSIONS_DIR", "folder", "keep_current", "kept_manifests", "load",
           "number_of", "numbers", "path_of"]
