"""``info`` and ``verify``: describe a store, and prove every record in it is intact."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import bucketmeta
from ..errors import StoreError
from ..fileutil import sha256_file
from ..progress import progress as progress_bar
from ..urls import is_url
from ..versions import keys_rule
from .buckets import live_buckets
from .decode import Decoder, shard_name
from .store import Store, disk_bytes
from .storeview import labels_by_place
from .verifyversions import verify_versions

MAX_FAULTS = 100


def _disk_bytes(store: Store) -> int:
    if store.cache is not None:  # a remote store: what its objects hold, from the manifest
        layout = store.meta.get("layout")  # the mixed record layout's layout.npy
        return (sum(e.bytes for e in store.shards) + os.path.getsize(store.cache.labels())
                + store.cache.remote.manifest_bytes
                + (os.path.getsize(store.cache.file(layout["file"], layout["sha256"]))
                   if layout else 0))
    return disk_bytes(store.path)


def info(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None,
         storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A summary of a store, from its metadata alone (records are not read; a remote store's
    manifest and labels are fetched, into ``cache_dir``)."""
    store = Store(path, cache_dir=cache_dir, storage_options=storage_options)
    meta, settings = store.meta, store.settings
    return {
        "path": store.path,
        "kind": meta["kind"],
        "format_version": meta["format_version"],
        "shardkit_version": meta.get("shardkit_version"),
        "format": settings["format"],
        "count": store.count,
        # the store version (1: never changed; `shardkit log` lists them) and its record keys
        "version": store.version,
        "keys": keys_rule(settings),
        "num_classes": len(store.classes),
        "classes": store.classes,
        # A COCO store's category ids and names (its records' labels are in the fields)
        "categories": [{"id": c["id"], "name": c["name"]} for c in
                       (meta.get("annotations") or {}).get("categories", [])],
        "encoding": store.encoding,
        "size": settings["size"],
        "quality": settings["quality"],
        "shards": len(store.shards),
        "bytes_on_disk": _disk_bytes(store),
        "skipped": len(store.skipped),
        "fields": store.meta.get("fields", []),  # typed fields: name, kind, parameters
        # JPEG records with a restart marker before every MCU row (rows decoded on their own)
        "row_markers": row_markers(meta),
        # A bucketed store's buckets: sizes (height, width) held, records in each, the rule
        "buckets": meta.get("buckets"),
        # records in buckets too small to batch (under min_bucket_count, else under 3)
        "small_buckets": bucketmeta.small(meta["buckets"]) if meta.get("buckets") else None,
    }


def row_markers(meta: dict[str, Any]) -> int:
    """How many records have row markers and their row index (0 in stores packed before)."""
    if meta["kind"] != "sharded":
        return int(meta.get("row_markers", 0))
    return sum(int(entry.get("row_markers", 0)) for entry in meta["shards"])


def bucket_difference(said: dict[str, Any] | None, found: dict[str, Any]) -> str | None:
    """How a ``buckets`` entry differs from the histogram of the records' sizes (None: equal),
    by the first bucket whose count differs."""
    have = {} if said is None else dict(zip(map(tuple, said["sizes"]), said["counts"]))
    real = dict(zip(map(tuple, found["sizes"]), found["counts"]))
    for h, w in sorted(set(have) | set(real)):
        if have.get((h, w), 0) != real.get((h, w), 0):
            return (f"bucket {h}x{w} holds {real.get((h, w), 0)} records, the metadata says "
                    f"{have.get((h, w), 0)} (damaged or forged store)")
    return None


def index_faults(store: Store, k: int, shard: Any, where: str) -> list[str]:
    """What shard ``k``'s metadata says of its records that their index contradicts: its count
    of records with row markers, and a bucketed store's buckets (the shard's own metadata and,
    in a folder store, its manifest entry) against its records' sizes."""
    out = []
    entry = store.meta["shards"][k] if store.meta["kind"] == "sharded" else None
    offsets = shard.row_offsets
    marked = 0 if offsets is None else int(np.count_nonzero(np.diff(offsets)))
    for what, said in (("metadata", shard.meta), ("manifest entry", entry)):
        if said is not None and said.get("row_markers", 0) != marked:
            out.append(f"{where}: its {what} counts {said.get('row_markers', 0)} records with "
                       f"row markers, its row index {marked} (damaged or forged store)")
    spec = store.settings.get(bucketmeta.KEY)
    if spec is not None:
        found = bucketmeta.histogram(spec, shard.heights, shard.widths)
        # a manifest entry may leave the shard's buckets out (the manifest sums them)
        for what, said in (("metadata", shard.meta), ("manifest entry", entry)):
            if said is None or (said is entry and bucketmeta.KEY not in said):
                continue
            msg = bucket_difference(said.get(bucketmeta.KEY), found)
            if msg is not None:
                out.append(f"{where}: its {what}'s buckets differ from its records' sizes: {msg}")
    return out


@dataclass
class VerifyReport:
    path: str
    records: int = 0
    faults: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.faults


def verify(path: str | os.PathLike, progress: bool = False, *,
           cache_dir: str | os.PathLike | None = None,
           storage_options: dict[str, Any] | None = None) -> VerifyReport:
    """Check checksums of shard files, metadata consistency, and decode every record.

    What the index and metadata say is re-derived from the records themselves, since a forged
    store may carry recomputed checksums: each JPEG record's row index against its own restart
    markers (and each shard's count of such records), and a bucketed store's ``buckets``
    (sizes and counts, per shard and for the store) against the records' heights and widths.

    Faults are collected (up to ``MAX_FAULTS``) rather than raised, so one run lists them all.
    A store that cannot be opened at all raises ``StoreError``. A remote store's shards are
    fetched into ``cache_dir`` one at a time (each released before the next).
    """
    remote = is_url(path)
    store = Store(path, 1 if remote else None, cache_dir=cache_dir,
                  storage_options=storage_options)
    report = VerifyReport(store.path)

    def fault(msg: str) -> None:
        if len(report.faults) < MAX_FAULTS:
            report.faults.append(msg)

    n_classes = len(store.classes)
    labels_seen = []
    spec = store.settings.get(bucketmeta.KEY)
    held: list[dict[str, Any]] = []  # each shard's buckets, from its records' sizes
    bar = progress_bar(store.count, progress, "verify", unit="rec")
    try:
        store.attach()  # a folder store: its lock keeps the files read below in place
        decoder = Decoder(store)
        for k, entry in enumerate(store.shards):
            where = shard_name(store, k)
            if remote:
                try:
                    store.shard(k)  # downloaded and checked against the manifest's SHA-256
                except StoreError as exc:
                    fault(str(exc))
                    continue
            if entry.sha256 is not None:
                try:
                    if sha256_file(entry.path) != entry.sha256:
                        fault(f"{where}: file checksum differs from the manifest")
                        continue
                except OSError as exc:
                    fault(f"{where}: cannot read: {exc.strerror}")
                    continue
                except StoreError as exc:
                    fault(str(exc))
                    continue
            try:
                shard = store.shard(k)
            except StoreError as exc:
                fault(str(exc))
                continue
            labels = np.array(shard.labels)  # a copy: the shard may be closed (max_open_shards)
            labels_seen.append(labels)
            if len(labels) and not n_classes and np.any(labels != -1):  # e.g. a COCO store
                fault(f"{where}: labels of a store without classes must be -1")
            elif len(labels) and n_classes and (labels.min() < 0 or labels.max() >= n_classes):
                fault(f"{where}: labels outside 0..{n_classes - 1}")
            for msg in index_faults(store, k, shard, where):
                fault(msg)
            if spec is not None:
                held.append(bucketmeta.histogram(spec, shard.heights, shard.widths))
            with shard.reader.records() as get:
                for local in range(entry.count):
                    try:
                        decoder.prove(shard, k, local, get(local))
                        if shard.fields is not None:  # offsets, shapes, ranges, decodes
                            shard.fields.verify(local)
                    except StoreError as exc:
                        fault(str(exc))
                    report.records += 1
                    bar.update(1)
        if not report.faults and store.meta["kind"] == "sharded" and \
                not store.meta.get("labels_set"):  # set later: labels.npy holds the new ones
            try:
                if not np.array_equal(np.concatenate(labels_seen), labels_by_place(store)):
                    fault("labels.npy disagrees with the labels stored in the shards")
            except StoreError as exc:
                fault(str(exc))
        if spec is not None and not report.faults and store.meta["kind"] == "sharded":
            try:  # a version that deleted or replaced records counts its live ones
                found = (live_buckets(store) if "records" in store.meta
                         else bucketmeta.merge(spec, held))
            except StoreError as exc:
                fault(str(exc))
                found = store.meta.get(bucketmeta.KEY)
            msg = bucket_difference(store.meta.get(bucketmeta.KEY), found)
            if msg is not None:
                fault(f"{store.path}: the manifest's buckets differ from the records' sizes: {msg}")
        if report.records != store.count and not report.faults:
            fault(f"read {report.records} records, metadata says {store.count}")
    finally:
        bar.close()
        store.close()
    if not remote:  # every kept version's own files (the current one's shards are read above)
        verify_versions(store.path, {e["file"] for e in store.meta.get("shards", [])}, fault)
    return report
