"""``shardkit.update(out, delete=..., set_labels=..., replace=..., relabel=...)``: a folder
store's next version with records removed, relabelled or superseded, or its classes put in the
order a fresh pack gives them, no shard rewritten.

A version names its live records (``records.npy``: logical indices of its shards' records, in
the store's order), so deleting keys is a shorter list, and replacing them packs the new images
as new shards (``pack(src, out, append="replace")``) and points each key's place at its new
record. Labels set later are written to ``labels.npy`` and the manifest says so
(``labels_set``): readers take every label from there, not from the shards. Readers of earlier
versions keep reading them; ``shardkit gc`` drops old versions.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from .. import bucketmeta
from ..errors import PackError, PackOptionError
from ..urls import is_url
from ..versionmeta import number_of
from . import nextversion
from .append import Base, load_array, load_base, records_entry, write_array
from .bucket_update import live_entry


@dataclass(frozen=True)
class UpdateResult:
    """What :func:`update` changed: the version it installed, and how many records it deleted,
    relabelled and replaced; ``count`` the live records now; ``reordered`` how many classes
    ``relabel`` gave another index."""

    out: str
    version: int
    deleted: int
    relabelled: int
    replaced: int
    count: int
    reordered: int = 0


def update(out: str | os.PathLike, *, delete: str | os.PathLike | Iterable[str] | None = None,
           set_labels: str | os.PathLike | Mapping[str, str] | None = None,
           replace: str | os.PathLike | None = None, relabel: bool = False,
           storage_options: dict[str, Any] | None = None, **pack_options: Any) -> UpdateResult:
    """Install the folder store's next version with the records of keys ``delete`` removed,
    the labels of ``set_labels`` set, and the records whose keys ``replace`` holds superseded by
    its images, packed as new shards.

    Args:
        out: a folder store, local or at a URL (``s3://bucket/prefix``).
        delete: keys (source paths relative to SRC) to remove: a file with one per line, or an
            iterable of keys. A key the store does not hold is an error.
        set_labels: key -> class name: a CSV/TSV file of ``key,label`` rows (a first row
            ``key,label`` is a header), or a mapping. A class the store lacks is appended.
        replace: a source folder whose files with the store's keys replace those records (new
            pixels and fields, labels from its folders), packed with the store's settings.
        relabel: give the classes the indices a fresh pack of the store's images would: sorted
            by name, as torchvision's ``ImageFolder`` numbers its class folders (an append adds
            the classes it finds after the store's), every label mapped to its class's new
            index.
        storage_options: options of the fsspec filesystem of a URL ``out``.
        **pack_options: passed to the pack of ``replace`` (``workers=``, ``progress=``...).

    ``replace`` installs its own version; ``delete``, ``set_labels`` and ``relabel`` (applied
    in that order) install one more.
    """
    out = os.fspath(out).rstrip("/") or "/"
    if delete is None and set_labels is None and replace is None and not relabel:
        raise PackOptionError("update: give `delete`, `set_labels`, `replace` or `relabel`")
    replaced = 0
    if replace is not None:  # at a URL: packed and installed as an append there is
        from .api import pack

        if is_url(out):
            pack_options["storage_options"] = storage_options
        replaced = pack(replace, out, append="replace", **pack_options).count
    if is_url(out):
        from .append_remote import load_remote_base

        base: Base = load_remote_base(out, storage_options)
    else:
        base = load_base(out)
    live, labels = base.live, None
    classes = list(base.classes)
    deleted = relabelled = 0
    if delete is not None:
        gone = _keys(delete, "delete")
        place = _places(base)
        missing = sorted(gone - place.keys())
        if missing:
            raise PackError(f"update: {len(missing)} key{'s' if len(missing) != 1 else ''} to "
                            f"delete not in {out} (first: {missing[0]!r})")
        drop = np.array(sorted(place[k] for k in gone), dtype=np.int64)
        live = np.delete(live, drop)
        deleted = len(drop)
    if set_labels is not None:
        rows = _label_rows(set_labels)
        record = {base.ordered[i]: i for i in live.tolist()}
        missing = sorted(set(rows) - record.keys())
        if missing:
            raise PackError(f"update: {len(missing)} key{'s' if len(missing) != 1 else ''} to "
                            f"relabel not in {out} (first: {missing[0]!r})")
        labels = _labels(base)
        for name in sorted(set(rows.values()) - set(classes)):
            classes.append(name)
        index = {c: i for i, c in enumerate(classes)}
        for key, name in rows.items():
            labels[record[key]] = index[name]
        relabelled = len(rows)
    reordered = 0
    if relabel and classes != sorted(classes):
        if labels is None:
            labels = _labels(base)
        labels, reordered = _in_name_order(labels, classes)
        classes = sorted(classes)
    if deleted or relabelled or reordered:
        change = {"kind": "update", "deleted": deleted, "relabelled": relabelled}
        _install(base, live, labels, classes,
                 change | ({"classes_reordered": reordered} if relabel else {}))
    # The version installed is the next one: nextversion.install checked the store was `base`.
    return UpdateResult(out, number_of(base.manifest) + bool(deleted or relabelled or reordered),
                        deleted, relabelled, replaced, len(live), reordered)


def _labels(base: Base) -> np.ndarray:
    """The label of each of the store's records (all of them, in its order)."""
    return load_array(base.local, base.manifest["labels"]).astype("<i8")


def _in_name_order(labels: np.ndarray, classes: list[str]) -> tuple[np.ndarray, int]:
    """``labels`` (indices into ``classes``) as indices into ``sorted(classes)``, and how many
    classes moved; a label below 0 (a record of no class) stays."""
    where = {c: i for i, c in enumerate(sorted(classes))}
    moved = np.array([where[c] for c in classes] or [0], dtype="<i8")
    return (np.where(labels >= 0, moved[np.maximum(labels, 0)], labels),
            int(sum(where[c] != i for i, c in enumerate(classes))))


def _places(base: Base) -> dict[str, int]:
    """Live key -> its place in the live records."""
    return {base.ordered[i]: j for j, i in enumerate(base.live.tolist())}


def _keys(given: Any, name: str) -> set[str]:
    if isinstance(given, (str, os.PathLike)):
        try:
            with open(given, encoding="utf-8", errors="surrogateescape") as f:
                return {line.rstrip("\n") for line in f if line.strip()}
        except OSError as exc:
            raise PackOptionError(f"`{name}`: cannot read {os.fspath(given)}: "
                                  f"{exc.strerror}") from None
    return {str(k) for k in given}


def _label_rows(given: Any) -> dict[str, str]:
    if isinstance(given, Mapping):
        return {str(k): str(v) for k, v in given.items()}
    path = os.fspath(given)
    try:
        with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError as exc:
        raise PackOptionError(f"`set_labels`: cannot read {path}: {exc.strerror}") from None
    delimiter = "\t" if path.endswith(".tsv") else ","
    rows = {}
    for n, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), 1):
        if not row or (n == 1 and [c.strip().lower() for c in row] == ["key", "label"]):
            continue
        if len(row) != 2 or not row[0] or not row[1]:
            raise PackOptionError(f"`set_labels`: {path} line {n}: expected `key,label`, got "
                                  f"{row!r}")
        rows[row[0]] = row[1]
    return rows


def _install(base: Base, live: np.ndarray, labels: np.ndarray | None, classes: list[str],
             change: dict[str, Any]) -> None:
    """The store's next version with ``live`` records and ``labels`` (None: unchanged)."""
    with nextversion.work_folder(base) as partial:
        manifest = nextversion.carried(base)
        manifest["records"] = records_entry(partial, live)
        if bucketmeta.KEY in manifest:  # a bucketed store counts its live records
            manifest[bucketmeta.KEY] = live_entry(base.local, base.manifest,
                                                  manifest[bucketmeta.KEY], base.live, live)
        if labels is not None:
            manifest["labels"] = write_array(partial, "labels.npy", labels)
            manifest["labels_set"] = True
            manifest["classes"] = classes
            manifest["class_to_idx"] = {c: i for i, c in enumerate(classes)}
        nextversion.install(base, partial, manifest, change)


__all__ = ["UpdateResult", "update"]
