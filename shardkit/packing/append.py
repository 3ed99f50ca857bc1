"""``pack(src, out, append=True)``: pack only the sources whose keys a folder store lacks, as new
shards, and install the union as the store's next version (:mod:`shardkit.versions`).

A record's key is its source path relative to SRC (what ``ds.source_path(i)`` gives), or the
value of the source column or member ``id_key`` names (the store's ``settings``). The
sources the store holds, and those it skipped before (an unusable file stays one), are left out;
the rest are packed exactly as a fresh pack packs them, with the store's own settings (size,
quality, encoding, format: given ones must match) and its classes: the store's keep their
indices and classes it has not seen are appended after them, in name order (a fresh pack of the
union numbers classes in name order instead: ``docs/lifecycle.md``). A store packed with buckets
is added to by its own rule and merges (:mod:`.bucket_append`), its ``buckets`` counting the
live records (:mod:`.bucket_update`).

The new version's manifest lists the store's shards as they are (each keeps its file and its own
number, ``index``, and how many classes it was written with, ``classes``), then the new shards;
``labels.npy`` and ``layout.npy`` are written anew (logical order: the store's records, then the
new ones in the order a pack gives them). Nothing of the store is rewritten or moved, so readers
of the version before keep reading it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from .. import bucketmeta, metadata, storemeta, swap, versions
from ..errors import PackError, PackOptionError
from ..fileutil import replace_atomic, sha256_file
from ..fields import added
from ..formats import open_reader
from ..versionmeta import number_of, stamp
from ..urls import is_url
from . import bucket_append, bucket_update
from .discovery import Discovery
from .layout import LAYOUT_NAME
from .plan_store import SourceTable
from .shortcuts import IMAGE_SHORTCUTS
from .sources.base import ContainerIndex, Scan
from .writer import relative_path


@dataclass(frozen=True)
class Base:
    """The store an append adds to: its current manifest and the keys it holds or skipped."""

    out: str
    manifest: dict[str, Any]
    #: the keys of the live records and of the sources the store skipped
    keys: frozenset[str]
    #: every record's key, in the order of the shards' logical records (deleted ones too)
    ordered: list[str]
    #: the live records: logical indices of the shards' records, in the store's order
    live: np.ndarray

    @property
    def classes(self) -> list[str]:
        return self.manifest["classes"]

    @property
    def local(self) -> str:
        """The local folder that holds the store's side files (labels, layout, records)."""
        return self.out


def load_base(out: str) -> Base:
    """The local folder store at ``out`` with every record's key (PackOptionError where ``out``
    is not one an append can add to; a URL: :func:`.append_remote.load_remote_base`)."""
    if is_url(out):
        raise PackOptionError(f"{out}: `append` adds to a folder store, local or at a URL, "
                              "with `pack`")
    manifest_path = os.path.join(out, metadata.MANIFEST_NAME)
    if not os.path.isdir(out) or not os.path.isfile(manifest_path):
        raise PackOptionError(f"{out}: `append` needs an existing folder store (one packed with "
                              "`shards`); pack it first")
    with open(manifest_path, "rb") as f:
        manifest = storemeta.parse_manifest(f.read(metadata.MAX_MANIFEST_BYTES + 1),
                                            manifest_path)
    ordered = logical_keys(out, manifest)
    live = live_records(out, manifest, len(ordered))
    return Base(out, manifest, held_keys(manifest, ordered, live), ordered, live)


def check_appendable(out: str, manifest: dict[str, Any]) -> None:
    bucket_append.refuse(out, manifest)


def live_records(folder: str, manifest: dict[str, Any], count: int) -> np.ndarray:
    """The live records (logical indices) of a store whose side files are in ``folder``."""
    return (load_array(folder, manifest["records"]).astype(np.int64) if "records" in manifest
            else np.arange(count, dtype=np.int64))


def held_keys(manifest: dict[str, Any], ordered: list[str], live: np.ndarray) -> frozenset[str]:
    """The keys of the live records and of the sources the store skipped."""
    root = manifest.get("source_root")
    keys = {relative_path(root, s["path"]) if root and os.path.isabs(s["path"]) else s["path"]
            for s in manifest.get("skipped", []) if isinstance(s.get("path"), str)}
    keys.update(ordered[i] for i in live.tolist())
    return frozenset(keys)


def shard_keys(folder: str, manifest: dict[str, Any]) -> list[str]:
    """Every record's key (its source path) in the shards' physical order."""
    physical: list[str] = []
    for entry in manifest["shards"]:
        path = os.path.join(folder, entry["file"])
        reader = open_reader(path, entry["format"])
        try:
            meta = storemeta.parse_shard_meta(reader.meta_json(), path)
            arrays = meta["arrays"]
            offsets = np.array(reader.array("path_offsets", arrays["path_offsets"]["dtype"],
                                            tuple(arrays["path_offsets"]["shape"])))
            blob = bytes(reader.array("path_blob", arrays["path_blob"]["dtype"],
                                      tuple(arrays["path_blob"]["shape"])))
        finally:
            reader.close()
        physical.extend(blob[a:b].decode("utf-8", "surrogateescape")
                        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()))
    return physical


def logical_keys(folder: str, manifest: dict[str, Any],
                 physical: list[str] | None = None) -> list[str]:
    """Every record's key in the logical order of the shards' records."""
    physical = shard_keys(folder, manifest) if physical is None else physical
    if "layout" not in manifest:
        return physical
    return [physical[p] for p in load_array(folder, manifest["layout"])[0].tolist()]


def check_settings(base: Base, settings: dict[str, Any]) -> None:
    """The new records are packed as the store's were (PackOptionError naming what differs)."""
    have = base.manifest["settings"]
    differ = sorted(k for k in set(have) | set(settings) if have.get(k) != settings.get(k))
    if differ:
        shown = ", ".join(f"{k}={settings.get(k)!r} (the store: {have.get(k)!r})" for k in differ)
        raise PackOptionError(f"`append`: the store was packed with other settings: {shown}; "
                              "give the store's, or leave them out")


def keyed_as_store(base: Base, options: dict[str, Any]) -> dict[str, Any]:
    """The source options with the store's ``id_key`` where none is given (a differing one is
    refused by :func:`check_settings`)."""
    have = base.manifest["settings"].get("id_key")
    return options if have is None or "id_key" in options else options | {"id_key": have}


def union_classes(have: list[str], found: list[str]) -> list[str]:
    """The store's classes, then the ones it lacks, in name order."""
    known = set(have)
    return list(have) + sorted(c for c in found if c not in known)


class _Selected:
    """A source's typed fields for the sources an append keeps: source ``i`` of the selection
    is source ``kept[i]`` of the scan (the fields are the source's, by position)."""

    def __init__(self, inner: Any, kept: np.ndarray) -> None:
        self.inner, self.kept = inner, kept
        self.schema = inner.schema

    def plan_key(self) -> str:
        return self.inner.plan_key()

    def meta(self) -> dict[str, Any]:
        return self.inner.meta()

    def fields(self, path: str, height: int, width: int) -> dict[str, Any]:
        return self.inner.fields(path, height, width)

    def fields_at(self, index: int, path: str, height: int, width: int) -> dict[str, Any]:
        return self.inner.fields_at(int(self.kept[index]), path, height, width)

    def record_at(self, index: int, path: str, result: Any) -> dict[str, Any]:
        return self.inner.record_at(int(self.kept[index]), path, result)


def defaults(base: Base, image: Any, shards: Any, shortcuts: dict[str, Any]) -> dict[str, Any]:
    """``shortcuts`` with the store's image settings and shard size where none are given: the
    new records are packed as the store's were, in shards of about its shards' size."""
    out = dict(shortcuts)
    have = base.manifest["settings"]
    if image is None and not set(IMAGE_SHORTCUTS) & set(out):
        rule = bucket_append.store_rule(base.out, base.manifest)
        out |= {"quality": have["quality"], "encoding": have["encoding"]}
        out |= {"size": have["size"]} if rule is None else {"buckets": rule}
    if shards is None and not {"shard_size", "num_shards"} & set(out):
        entries = base.manifest["shards"]
        out["shard_size"] = max(1, sum(e["bytes"] for e in entries) // max(1, len(entries)))
        if "layout" in base.manifest:
            out.setdefault("layout_seed", base.manifest["layout"]["seed"])
        else:
            out.setdefault("order", "source")
    return out


def select_new(scan: Scan, base: Base, folder: str, replacing: bool = False) -> Scan:
    """The sources of ``scan`` the store lacks (``replacing``: those it holds, to supersede
    them), labelled with the union of classes.

    ``folder``: the plan folder a source that lists to disk wrote them to (``scan.count`` set),
    else they are ``scan.samples``. PackError when nothing is new."""
    if scan.count is not None:
        table = SourceTable(folder, scan.count, False)
        try:
            samples = [(table.path(i), table.label(i)) for i in range(scan.count)]
        finally:
            table.close()
    else:
        samples = list(scan.samples)
    classes = union_classes(base.classes, scan.classes)
    to_union = np.array([classes.index(c) for c in scan.classes], dtype=np.int64)
    kept = np.array([i for i, (path, _) in enumerate(samples)
                     if (relative_path(scan.root, path) in base.keys) == replacing],
                    dtype=np.int64)
    if not len(kept) and replacing:
        raise PackError(f"nothing to replace: no source in {scan.root} has the key of a record "
                        f"of {base.out}")
    if not len(kept):
        raise PackError(f"nothing to append: every source in {scan.root} is in {base.out} "
                        "already (or was skipped by it)")
    new = [(samples[i][0], int(to_union[samples[i][1]])) for i in kept.tolist()]
    skipped = [s for s in scan.skipped
               if (relative_path(scan.root, s.get("path", "")) in base.keys) == replacing]
    index = scan.index
    if index is not None:
        starts = np.searchsorted(kept, np.asarray(index.shard_starts, dtype=np.int64))
        index = ContainerIndex(index.format, index.files, index.shard[kept],
                               index.refs[kept], [int(s) for s in starts])
    fields = None if scan.fields is None else _Selected(scan.fields, kept)
    found = Discovery(scan.root, classes, {c: i for i, c in enumerate(classes)}, new, skipped)
    return replace(Scan.of(found, fields), index=index)


def combine(partial: str, base: Base, replacing: bool = False,
            uploaded: bool = False,
            hashes: Callable[[str, list[str]], dict[str, Any]] | None = None,
            new_keys: list[str] | None = None) -> dict[str, Any]:
    """Turn the finished store of new records in ``partial`` into the store's next version:
    its shards renamed after the store's (``uploaded``: under those names already, by the
    uploader of a URL store), the union's labels and layout written, and its manifest replaced
    by the version's (returned). ``new_keys``: the new records' keys in their shards' order,
    where those shards are no longer in ``partial`` (uploaded)."""
    path = os.path.join(partial, metadata.MANIFEST_NAME)
    with open(path, "rb") as f:
        new = storemeta.parse_manifest(f.read(), path)
    old = base.manifest
    if new.get("fields") != old.get("fields"):
        raise PackError(f"`append`: the new records' fields ({_names(new)}) differ from the "
                        f"store's ({_names(old)}); pack them with the same source and schema")
    n_old, n_shards = old["count"], len(old["shards"])
    new_keys = (logical_keys(partial, new, new_keys) if replacing or hashes is not None
                else [])
    entries = []
    for k, e in enumerate(old["shards"]):
        written = e.get("index", k)
        entries.append(e | {"index": written, "classes": e.get("classes", len(old["classes"]))})
    first = next_shard(old) if uploaded else n_shards  # a URL store's: after its last name
    renamed = [_shard_name(first + k, e["file"]) for k, e in enumerate(new["shards"])]
    # Last first: each name moves up, to a name whose file has moved already.
    for e, name in reversed(list(zip(new["shards"], renamed)) if not uploaded else []):
        os.replace(os.path.join(partial, e["file"]), os.path.join(partial, name))
    for k, (e, name) in enumerate(zip(new["shards"], renamed)):
        entries.append(e | {"file": name, "start": n_old + e["start"], "index": k})
    labels = np.concatenate([load_array(base.local, old["labels"]), load_array(partial, new["labels"])])
    manifest = {k: v for k, v in new.items() if k not in ("layout", versions.KEY)}
    manifest |= {"shards": entries, "count": n_old + new["count"],
                 "classes": new["classes"], "class_to_idx": new["class_to_idx"],
                 "skipped": old.get("skipped", []) + new.get("skipped", []),
                 "source_root": new.get("source_root", old.get("source_root"))}
    if bucketmeta.KEY in old:  # the union's records, each in the bucket it was cut to
        manifest[bucketmeta.KEY] = bucket_append.union(old, new)
    manifest["labels"] = write_array(partial, "labels.npy", labels.astype("<i8"))
    if replacing:  # each new record takes the place of the one with its key
        live = base.live.copy()
        place = {base.ordered[i]: j for j, i in enumerate(base.live.tolist())}
        for j, key in enumerate(new_keys):
            live[place[key]] = n_old + j
        manifest["records"] = records_entry(partial, live)
        if bucketmeta.KEY in manifest:  # less the records superseded
            manifest[bucketmeta.KEY] = bucket_update.live_entry(
                base.local, old, manifest[bucketmeta.KEY], base.live, live)
    elif "records" in old:  # the store's live records, then every new one
        live = np.concatenate([base.live, np.arange(n_old, n_old + new["count"])])
        manifest["records"] = records_entry(partial, live)
    if old.get("labels_set"):
        manifest["labels_set"] = True
    if hashes is not None:  # pack(dedup=...): every record's hash, for the next append
        manifest["dedup"] = hashes(partial, base.ordered + new_keys)
    if added.KEY in old:  # they cover the store's records; add_field computes the new ones
        manifest[added.KEY] = old[added.KEY]
    if "layout" in old or "layout" in new:
        layout = np.concatenate([_layout(base.local, old), _layout(partial, new) + n_old],
                                axis=1)
        manifest["layout"] = write_array(partial, LAYOUT_NAME, layout.astype("<i8")) | {
            "order": "mixed", "seed": (old.get("layout") or new["layout"])["seed"]}
        manifest["format_version"] = metadata.LAYOUT_VERSION
    change = {"kind": "replace" if replacing else "append",
              ("replaced" if replacing else "added"): new["count"],
              "skipped": len(new.get("skipped", [])),
              "classes_added": len(new["classes"]) - len(old["classes"])}
    sealed = stamp(manifest, number_of(old) + 1, change)
    replace_atomic(path, metadata.dumps(sealed))
    return sealed


def install_version(partial: str, base: Base, replacing: bool = False,
                    hashes: Callable[[str, list[str]], dict[str, Any]] | None = None) -> None:
    """Make the new records in ``partial`` the store's next version (:func:`combine`), if the
    store is still the version the append started from (else PackError: two writers)."""
    check_unchanged(partial, base)
    try:
        combine(partial, base, replacing, hashes=hashes)
    except OSError as exc:
        raise PackError(f"cannot write the new version of {base.out}: {exc.strerror or exc}; "
                        "the store is unchanged") from None
    install_checked(partial, base)


def check_unchanged(partial: str, base: Base) -> None:
    current = os.path.join(base.out, metadata.MANIFEST_NAME)
    with open(current, "rb") as f:
        now = storemeta.parse_manifest(f.read(metadata.MAX_MANIFEST_BYTES + 1), current)
    if now != base.manifest:
        raise PackError(f"{base.out} changed while its next version was made (version "
                        f"{number_of(now)} installed meanwhile); run it again (the work is in "
                        f"{partial} only until then)")


def install_checked(partial: str, base: Base) -> None:
    """Install the finished version in ``partial`` over the store ``base`` still is."""
    check_unchanged(partial, base)
    try:
        swap.install_folder(partial, base.out)
    except OSError as exc:
        raise PackError(f"cannot install the new version of {base.out}: "
                        f"{exc.strerror or exc}; the store is unchanged") from None


RECORDS_NAME = "records.npy"


def _names(manifest: dict[str, Any]) -> str:
    fields = manifest.get("fields")
    return "none" if not fields else metadata.dumps(fields).decode()[:200]


def next_shard(manifest: dict[str, Any]) -> int | None:
    """The number of a store's next new shard (``shard-<n>``): one past its last shard's; None
    where its shards are not named ``shard-NNNNN`` in increasing order (as packs, appends and
    compactions name them)."""
    numbers = []
    for entry in manifest["shards"]:
        stem = os.path.splitext(entry["file"])[0]
        digits = stem.removeprefix("shard-")
        numbers.append(int(digits) if stem.startswith("shard-") and digits.isdigit() else -1)
    if any(n < 0 for n in numbers) or numbers != sorted(set(numbers)):
        return None
    return numbers[-1] + 1 if numbers else 0


def _shard_name(k: int, file: str) -> str:
    return f"shard-{k:05d}{os.path.splitext(file)[1]}"


def load_array(folder: str, info: dict[str, Any]) -> np.ndarray:
    """The ``.npy`` a manifest entry ``info`` names (file, sha256), from ``folder``: what
    :func:`write_array` wrote."""
    return np.load(os.path.join(folder, info["file"]), allow_pickle=False)


def _layout(folder: str, manifest: dict[str, Any]) -> np.ndarray:
    """The ``(2, N)`` logical/physical map (identity for a store in the sources' order)."""
    if "layout" in manifest:
        return load_array(folder, manifest["layout"])
    ident = np.arange(manifest["count"], dtype=np.int64)
    return np.stack([ident, ident])


def records_entry(folder: str, live: np.ndarray) -> dict[str, Any]:
    """A version's live records saved in ``folder``: the manifest's ``records`` entry."""
    return write_array(folder, RECORDS_NAME, live.astype("<i8")) | {"count": len(live)}


def write_array(folder: str, name: str, array: np.ndarray) -> dict[str, Any]:
    """``array`` saved as ``folder/name`` (``.npy``): its manifest entry (file, sha256)."""
    path = os.path.join(folder, name)
    with open(path + ".tmp", "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(path + ".tmp", path)
    return {"file": name, "sha256": sha256_file(path)}


__all__ = ["Base", "check_settings", "combine", "load_base", "select_new", "union_classes"]
