"""``shardkit.compact(out)`` / ``shardkit compact OUT``: a folder store's next version with its
live records rewritten into new shards, the deleted and superseded ones dropped.

Records are copied as stored (the encoded bytes, not decoded again: the same pixels), in the
order the shards held them (so shards keep their mix of classes), with their current labels and
every field: packed fields as they were and fields added later (``add_field``) written into the
new shards as packed ones. A bucketed store's records keep their sizes, so their buckets. The
version before stays readable until ``shardkit gc`` drops it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import bucketmeta, metadata
from .errors import PackError
from .fields import added
from .formats import SUFFIXES
from .packing import nextversion
from .packing.append import load_base, next_shard, write_array
from .packing.layout import LAYOUT_NAME
from .packing.writer import StoreWriter
from .progress import progress as progress_bar
from .read.dataset import ShardDataset
from .read.targets import store_schema
from .urls import is_url
from .versionmeta import number_of


@dataclass(frozen=True)
class CompactResult:
    """The version :func:`compact` installed: its records and shards, and how many records of
    the shards before it no longer holds."""

    out: str
    version: int
    count: int
    shards: int
    dropped: int


def compact(out: str | os.PathLike, *, shard_size: int | None = None, progress: bool = True,
            storage_options: dict[str, Any] | None = None) -> CompactResult:
    """Rewrite the live records of the folder store ``out`` into new shards of about
    ``shard_size`` bytes (default: the store's mean shard size) as its next version.

    ``out`` may be a URL (``s3://bucket/prefix``; ``storage_options``: its fsspec filesystem's):
    the records are read through the remote cache, and the new shards uploaded, under the
    prefix's lock, as ``shard-<n>``... after the store's last, before the version is switched
    in (:mod:`shardkit.packing.append_remote`)."""
    out = os.fspath(out).rstrip("/") or "/"
    remote = is_url(out)
    if remote:
        from .packing.append_remote import load_remote_base

        base = load_remote_base(out, storage_options)
    else:
        base = load_base(out)
    old = base.manifest
    ds = ShardDataset(out, version=number_of(old), output="bytes",
                      storage_options=storage_options)
    store = ds.store
    count = len(ds)
    places = (np.asarray(store.physical(np.arange(count))) if hasattr(store, "physical")
              else np.arange(count))
    for entry in added.entries(old):
        if entry["rows"] < old["count"] and (places >= entry["rows"]).any():
            raise PackError(f"compact: field {entry['field']['name']!r} has no value for "
                            "records appended after it was added: add it again first")
    schema = store_schema(store)
    labels = np.asarray(ds.targets, dtype="<i8")
    order = np.argsort(places, kind="stable")  # logical records in the shards' order
    size = shard_size or max(1, sum(e["bytes"] for e in old["shards"]) // len(old["shards"]))
    uploader = None
    if remote:  # taken before anything is uploaded; the store must still be `base`
        from .remote import Uploader

        uploader = Uploader(out, storage_options, base=base.raw, first_shard=next_shard(old))
    try:
        with nextversion.work_folder(base) as partial:
            return _install(base, ds, store, order, labels, schema, partial, size, progress,
                            uploader)
    except BaseException:
        if uploader is not None:
            uploader.close()
        raise
    finally:
        ds.close()


def _install(base: Any, ds: ShardDataset, store: Any, order: np.ndarray, labels: np.ndarray,
             schema: Any, partial: str, size: int, progress: bool,
             uploader: Any) -> CompactResult:
    """The new shards written (and uploaded, at a URL) and installed as the next version."""
    old, count = base.manifest, len(order)
    entries = _write(ds, store, order, labels, schema, old, partial, size, progress,
                     uploader)
    manifest = nextversion.carried(base, drop=("records", "labels_set", added.KEY, "layout",
                                               "dedup"))
    manifest["shards"] = entries
    manifest["count"] = count
    manifest["labels"] = write_array(partial, "labels.npy", labels)
    if bucketmeta.KEY in old:  # the live records' buckets, summed from the new shards
        manifest[bucketmeta.KEY] = bucketmeta.merge(old["settings"][bucketmeta.KEY],
                                                    [e[bucketmeta.KEY] for e in entries])
    if schema is not None:
        manifest["fields"] = schema.as_json()
        manifest["format_version"] = metadata.FIELDS_VERSION
    if count:  # physical place of each logical record, and the inverse
        layout = np.stack([np.argsort(order, kind="stable"), order]).astype("<i8")
        manifest["layout"] = write_array(partial, LAYOUT_NAME, layout) | {
            "order": "mixed", "seed": (old.get("layout") or {}).get("seed", 0)}
        manifest["format_version"] = metadata.LAYOUT_VERSION
    dropped = old["count"] - count
    ds.close()
    number = nextversion.install(base, partial, manifest,
                                 {"kind": "compact", "dropped": dropped}, uploader)
    return CompactResult(base.out, number, count, len(entries), dropped)


def _write(ds: ShardDataset, store: Any, order: np.ndarray, labels: np.ndarray, schema: Any,
           old: dict[str, Any], partial: str, size: int, progress: bool,
           uploader: Any) -> list[dict[str, Any]]:
    """The records ``order`` copied into shards of about ``size`` bytes: their entries (each
    shard uploaded by ``uploader`` as it finishes, under its name there, where given)."""
    entries: list[dict[str, Any]] = []
    settings, extra = old["settings"], ({"annotations": old["annotations"]}
                                        if "annotations" in old else None)
    names = [] if schema is None else schema.names
    spec = settings.get(bucketmeta.KEY)  # records keep their sizes, so their buckets
    rule = None if spec is None else bucketmeta.rule(spec, partial)
    bar = progress_bar(len(order), progress, "compact", unit="rec")
    writer, written, start = None, 0, 0
    try:
        for i in order.tolist():
            if writer is None:
                name = f"shard-{len(entries):05d}{SUFFIXES[settings['format']]}"
                writer = StoreWriter(os.path.join(partial, name), old["classes"],
                                     format=settings["format"], encoding=settings["encoding"],
                                     size=settings["size"], quality=settings["quality"],
                                     max_pixels=settings["max_pixels"],
                                     class_to_idx=old["class_to_idx"], kind="shard",
                                     install=False, shard_index=len(entries), schema=schema,
                                     extra_meta=extra, buckets=rule)
            k, local = store.locate(i)
            shard = store.shard(k)
            data = ds[i][0]
            values = {n: shard.fields.value(n, local) for n in names}
            writer.add_encoded(data, int(labels[i]), int(shard.heights[local]),
                               int(shard.widths[local]), ds.key(i), **values)
            written += len(data)
            bar.update(1)
            if written >= size:
                entries.append(_entry(writer, start, uploader))
                start += entries[-1]["count"]
                writer, written = None, 0
        if writer is not None:
            entries.append(_entry(writer, start, uploader))
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        bar.close()
    return entries


def _entry(writer: StoreWriter, start: int, uploader: Any) -> dict[str, Any]:
    entry = writer.finish()
    name = os.path.basename(entry["file"])
    if uploader is not None:  # checked against its SHA-256 there; the local copy is done with
        uploader.put_shard(writer.path, name, entry["sha256"], entry["bytes"])
        os.unlink(writer.path)
        name = uploader.remote_name(name)
    return {k: entry[k] for k in ("file", "format", "count", "bytes", "sha256", "row_markers",
                                  bucketmeta.KEY) if k in entry} | {"start": start, "file": name}


__all__ = ["CompactResult", "compact"]
