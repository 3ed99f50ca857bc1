"""What ``shardkit log`` and ``shardkit gc`` do with a folder store's kept versions
(:mod:`shardkit.versions`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from . import metadata, swap, versions
from .errors import StoreError
from .fileutil import fsync_dir
from .urls import is_url
from .versionmeta import KEY, number_of
from .versions import kept_manifests, load, numbers, path_of


@dataclass(frozen=True)
class Version:
    """One kept version of a folder store, as ``shardkit log`` lists it."""

    number: int
    time: str | None
    count: int
    shards: int
    change: dict[str, Any]


def history(store: str, storage_options: dict[str, Any] | None = None) -> list[Version]:
    """The kept versions of a folder store, oldest first (the current one if none are); at a
    URL (``s3://bucket/prefix``) only the version JSONs are downloaded
    (:mod:`shardkit.remote.versionlog`; ``storage_options``: its fsspec filesystem's)."""
    if is_url(store):
        from .remote.versionlog import kept_manifests as kept_at_url

        kept = kept_at_url(store, storage_options)
    else:
        kept = kept_manifests(store)
    if not kept:
        current = load(os.path.join(store, metadata.MANIFEST_NAME))
        if current is None:
            raise StoreError(f"{store}: not a folder store (no readable "
                             f"{metadata.MANIFEST_NAME})")
        kept = [current]
    out = []
    for m in kept:
        record = m.get(KEY) or {}
        out.append(Version(number_of(m), record.get("time"), m["count"], len(m["shards"]),
                           record.get("change", {"kind": "pack"})))
    return out


def gc(store: str, keep: int, storage_options: dict[str, Any] | None = None) -> list[int]:
    """Drop all but the newest ``keep`` versions (the current one is always kept), then delete
    the files no kept version, current manifest or reader of a replaced one uses. Returns the
    numbers dropped. At a URL: under the prefix's lock, the objects only dropped versions name
    (:mod:`shardkit.remote.versionlog`)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1 (the newest versions kept), not {keep!r}")
    if is_url(store):
        from .remote.versionlog import gc as gc_at_url

        return gc_at_url(store, keep, storage_options)
    current = load(os.path.join(store, metadata.MANIFEST_NAME))
    if current is None:
        raise StoreError(f"{store}: not a folder store (no readable {metadata.MANIFEST_NAME})")
    latest = number_of(current)
    kept = [n for n in numbers(store) if n <= latest][-keep:] + [latest]
    dropped = [n for n in numbers(store) if n not in kept]
    for n in dropped:  # retired, not deleted: its files stay while a reader holds it
        swap.retire(path_of(store, n), store)
    if dropped:
        fsync_dir(versions.folder(store))
    swap.collect_garbage(store)
    return dropped


__all__ = ["Version", "gc", "history"]
