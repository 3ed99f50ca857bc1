"""The partial folder of a sharded pack: its plan, one entry per finished shard (what
``resume`` and ``merge`` trust), and the manifest merged from them, written last.

Shard files and their ``shard-NNNNN.done.json`` entries live in ``.<name>.partial`` beside OUT
(for a URL OUT, a staging folder under the cache folder) until :mod:`.install` moves the
finished store into place.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np


from .. import bucketmeta, metadata, storemeta
from ..errors import PackError
from ..fileutil import fsync_dir, remove, replace_atomic, sha256_file
from ..formats import open_reader
from .discovery import serial
from .layout import SLOTS_NAME
from .manifest_stream import ShardCount, ShardSpool
from .merging import merge_labels
from .plan_store import INDEX_DTYPE
from .plan import PackPlan, open_plan
from .writer import remove_store_files

PLAN_NAME = "plan.json"
PLAN_DIR = "plan"


def staging_path(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """The local partial folder of a pack to ``url``: under the cache folder, one per URL and
    endpoint, so ``resume`` finds it and the same bucket on two servers never shares one
    (``$SHARDKIT_CACHE_DIR/pack-staging/<hash of endpoint and url>``)."""
    from ..remote import default_cache_dir, endpoint

    where = f"{endpoint(url, storage_options)}\0{url}"
    key = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(os.path.abspath(default_cache_dir()), "pack-staging", key)


def staging_fault(exc: OSError, folder: str) -> str:
    """What went wrong writing the local staging folder of a pack to a URL, naming that folder
    (the URL is not at fault)."""
    hint = "free space there, or set SHARDKIT_CACHE_DIR to a folder on another disk"
    if exc.errno == errno.ENOSPC:
        return f"no space left in {folder} (the local staging folder; {hint})"
    if exc.errno == errno.EDQUOT:
        return f"disk quota exceeded in {folder} (the local staging folder; {hint})"
    if exc.errno == errno.EROFS:
        return f"{folder} is on a read-only file system (the local staging folder; {hint})"
    return f"{exc.strerror or exc} (in the local staging folder {folder})"


class StagingLock:
    """An exclusive ``flock`` on ``<staging folder>.lock``, held by the one pack that uses that
    staging folder: a second pack to the same URL (and endpoint) on this machine is refused at
    once, never sharing the folder. ``release()`` (or process exit) lets the next one in."""

    def __init__(self, url: str, partial: str) -> None:
        import fcntl

        from ..errors import StoreError
        from ..remote.locks import open_lock

        path = f"{partial}.lock"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError as exc:
            raise PackError(f"cannot write {url}: staging folder {os.path.dirname(path)}: "
                            f"{exc.strerror}") from None
        try:
            self._fd: int | None = open_lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PackError(f"another pack to {url} is running on this machine (its staging "
                            f"folder {partial} is locked); wait for it to finish") from None
        except StoreError as exc:
            raise PackError(f"cannot write {url}: {exc}") from None

    def release(self) -> None:
        from ..remote.locks import close

        if self._fd is not None:
            close(self._fd)
            self._fd = None


def _uploaded(entry: dict[str, Any]) -> bool:
    """Whether a shard's entry says its file was uploaded (and deleted here); ``labels``:
    an entry written by an earlier shardkit."""
    return bool(entry.get("uploaded")) or "labels" in entry


def plan_folder(partial: str) -> str:
    """Where a sharded pack's plan (:mod:`.plan_store`) lives: in its partial folder."""
    return os.path.join(partial, PLAN_DIR)


def adopt_plan(plan: PackPlan, partial: str) -> PackPlan:
    """Move ``plan``'s folder into ``partial`` (once :func:`prepare_partial` has accepted it),
    where tasks and ``merge`` find it; the one already there is kept if it has the same
    fingerprint (``resume``, another node's: it holds the same plan)."""
    dest = plan_folder(partial)
    if os.path.abspath(plan.folder) == os.path.abspath(dest):
        return plan
    if os.path.isdir(dest):
        remove(plan.folder)
    else:
        try:
            try:
                os.rename(plan.folder, dest)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                import shutil  # planned in the temporary folder: copied, then renamed here

                shutil.copytree(plan.folder, f"{dest}.copy")
                os.rename(f"{dest}.copy", dest)
        except OSError:
            if not os.path.isdir(dest):  # not another node's, which got there first
                raise
        remove(plan.folder)
    return open_plan(dest, plan.root, plan.fields, plan.settings)


def entry_path(partial: str, k: int) -> str:
    return os.path.join(partial, f"shard-{k:05d}.done.json")


def completed_shards(partial: str, plan: PackPlan, plan_id: str, shards: Iterable[int],
                     uploader: Any = None) -> dict[int, dict[str, Any]]:
    """Shards of an interrupted run whose file still matches the checksum recorded when done
    (with ``uploader``: whose upload is recorded, with that checksum, in the remote store)."""
    done: dict[int, dict[str, Any]] = {}
    for k in shards:
        try:
            with open(entry_path(partial, k), "rb") as f:
                entry = json.loads(f.read())
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(entry, dict) or entry.get("plan_id") != plan_id:
            continue
        if uploader is not None:
            if entry.get("file") == plan.shard_file(k) and _uploaded(entry) and \
                    uploader.uploaded(entry["file"], entry.get("sha256"), entry.get("bytes")):
                done[k] = entry
            continue
        shard = os.path.join(partial, plan.shard_file(k))
        if entry.get("file") == plan.shard_file(k) and os.path.exists(shard) \
                and os.path.getsize(shard) == entry.get("bytes") \
                and sha256_file(shard) == entry.get("sha256"):
            done[k] = entry
    return done


def prepare_partial(partial: str, plan: PackPlan, plan_id: str, resume: bool,
                    shards: Sequence[int], uploader: Any = None) -> dict[int, dict]:
    """Create or reuse the partial folder; returns which of ``shards`` are already complete.

    Files of the other ``shards`` (half-written by a killed run) are removed. Shards outside
    ``shards`` are never touched: with ``--num-nodes`` other nodes write them concurrently.
    """
    plan_file = os.path.join(partial, PLAN_NAME)
    if resume:
        if os.path.lexists(partial) and not os.path.isdir(partial):
            remove(partial)
        os.makedirs(partial, exist_ok=True)  # never remove a folder another node may be using
        try:
            with open(plan_file, "rb") as f:
                old = json.loads(f.read())
        except (OSError, ValueError, RecursionError):
            old = {}
        if not isinstance(old, dict) or old.get("plan_id") not in (None, plan_id):
            raise PackError(f"cannot resume: {partial} was started with different sources, "
                            "settings or shard sizes; rerun without `resume=True` (or delete it) "
                            "to start over")
        done = completed_shards(partial, plan, plan_id, shards, uploader)
    else:
        remove(partial)
        os.makedirs(partial, exist_ok=True)
        done = {}
    redo = [k for k in shards if k not in done]
    for k in redo:
        remove(entry_path(partial, k))
    remove_store_files((os.path.join(partial, plan.shard_file(k)) for k in redo),
                       plan.settings.format)
    replace_atomic(plan_file, metadata.dumps({"plan_id": plan_id, "num_shards": plan.num_shards,
                                              "count_sources": len(plan.paths),
                                              "discovery_skipped": plan.discovery_skipped,
                                              "layout": plan.layout}))
    return done


def finalize_sharded(partial: str, plan: PackPlan | None = None,
                     publish: Callable[[str], None] | None = None,
                     lister: Any = None) -> tuple[dict[str, Any], int]:
    """Merge per-shard entries into ``manifest.json`` (+ ``labels.npy``, ``layout.npy``),
    written last.

    The labels and layout come from the plan's arrays (:mod:`.merging`, in ``lister``'s tasks:
    a Dask cluster's, else this process), so no shard file is read but one's metadata; without
    ``plan`` it is opened from the partial folder (``merge``). ``publish(partial)``
    runs once the manifest is written and before the entries are removed, so a pack killed
    while it uploads the manifest resumes without packing again.
    """
    try:
        with open(os.path.join(partial, PLAN_NAME), "rb") as f:
            plan_info = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        raise PackError(f"{partial}: no pack in progress to merge") from None
    plan_id, num_shards = plan_info["plan_id"], plan_info["num_shards"]
    missing = [k for k in range(num_shards) if _entry(partial, k, plan_id) is None]
    if missing:
        raise PackError(f"{len(missing)} of {num_shards} shards are not finished yet "
                        f"(first: {missing[0]}); run the remaining nodes, or pack with "
                        "`resume=True`")
    # One entry at a time: what the manifest keeps of each, its skips and its bucket counts;
    # not every entry at once (a list of them was 1.2 KB a shard on the client).
    spool = ShardSpool(partial)  # each shard's record on disk, not as objects
    try:
        manifest, start = _merge(partial, plan, publish, lister, plan_info, spool)
    finally:
        spool.close()
    return manifest, start


def _merge(partial: str, plan: PackPlan | None, publish: Callable[[str], None] | None,
           lister: Any, plan_info: dict[str, Any], spool: ShardSpool
           ) -> tuple[dict[str, Any], int]:
    plan_id, num_shards = plan_info["plan_id"], plan_info["num_shards"]
    start, skipped, common = 0, [], None
    skipped_slots, buckets = [], []
    for k in range(num_shards):
        entry = _entry(partial, k, plan_id)
        if entry is None:
            raise PackError(f"shard {k}: its done entry in {partial} changed while merging")
        path = os.path.join(partial, entry["file"])
        if _uploaded(entry) and plan is not None:  # uploaded to a remote OUT: no file here
            common = common or plan.common_meta()
        else:
            if not os.path.isfile(path) or os.path.getsize(path) != entry["bytes"]:
                raise PackError(f"shard {k} ({path}) is missing or changed since it was packed; "
                                "repack it (rerun its node, or pack with `resume=True`)")
            if common is None:  # the store's common metadata, from one shard
                reader = open_reader(path, entry["format"])
                try:
                    meta = storemeta.parse_shard_meta(reader.meta_json(), path)
                finally:
                    reader.close()
                common = {key: meta[key] for key in (
                    "format", "format_version", "shardkit_version", "classes", "class_to_idx",
                    "settings", "source_root", "fields", "annotations") if key in meta}
        skipped.extend(entry["skipped"])
        if entry.get("skipped_slots"):
            skipped_slots.append(np.asarray(entry["skipped_slots"], dtype=INDEX_DTYPE))
        if entry.get(bucketmeta.KEY) is not None:
            buckets.append(entry[bucketmeta.KEY])
        spool.add({key: entry[key] for key in ("file", "format", "count", "bytes", "sha256",
                                               "row_markers") if key in entry} | {"start": start})
        start += entry["count"]
    if common is None:
        raise PackError("cannot merge a store with no shards")
    labels_path = os.path.join(partial, "labels.npy")
    # labels.npy (the sources' order) and layout.npy from the plan's arrays, in tasks.
    summary = {"count": start, "skipped_slots": np.concatenate(skipped_slots)
               if skipped_slots else np.zeros(0, INDEX_DTYPE)}
    layout = merge_labels(partial, plan if plan is not None else open_plan(plan_folder(partial)),
                          [summary], lister or serial)
    skipped = (plan.discovery_skipped if plan is not None
               else plan_info.get("discovery_skipped", [])) + skipped
    manifest = common | {"kind": "sharded", "count": start, "skipped": skipped,
                         "labels": {"file": "labels.npy", "sha256": sha256_file(labels_path)}}
    if layout is not None:
        manifest |= {"layout": layout, "format_version": metadata.LAYOUT_VERSION}
    spec = common["settings"].get(bucketmeta.KEY)
    if spec is not None:  # the shards' bucket counts summed
        manifest[bucketmeta.KEY] = bucketmeta.merge(spec, buckets)
    spool.write(os.path.join(partial, metadata.MANIFEST_NAME), manifest)
    manifest["shards"] = ShardCount(num_shards)
    if publish is not None:
        publish(partial)
    for k in range(num_shards):
        remove(entry_path(partial, k))
    for name in os.listdir(partial):  # side files of killed writers
        if name.endswith((".spool", ".tmp")):
            remove(os.path.join(partial, name))
    remove(os.path.join(partial, PLAN_NAME))
    remove(os.path.join(partial, SLOTS_NAME))
    remove(plan_folder(partial))
    fsync_dir(partial)
    return manifest, start


def _entry(partial: str, k: int, plan_id: str) -> dict[str, Any] | None:
    """Shard ``k``'s done entry, None if missing, unreadable or of another plan."""
    try:
        with open(entry_path(partial, k), "rb") as f:
            entry = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) and entry.get("plan_id") == plan_id else None


def read_entries(partial: str, shards: Iterable[int]) -> Iterator[dict[str, Any]]:
    """The done entries of ``shards``, read one at a time as they are iterated."""
    for k in shards:
        with open(entry_path(partial, k), "rb") as f:
            yield json.loads(f.read())
