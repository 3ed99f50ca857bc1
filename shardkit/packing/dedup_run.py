"""Duplicates at pack time (``pack(dedup="exact" | "near")``): the options checked, the hash an
encoding worker computes on the pixels it packs (:func:`digest`), and the report written beside
OUT once it is installed (:func:`report_dedup`). The decisions themselves are
:class:`shardkit.dedup.Deduper`'s, made in the packing process as records are written.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

import numpy as np

from ..codec import decode
from ..dedup import Deduper, phash_many, pixel_digest, thumbnail
from ..errors import PackError, PackOptionError
from ..fileutil import replace_atomic


def report_path(out: str) -> str:
    """Where the report of OUT's duplicates goes: beside it (a single file or a folder)."""
    return out + ".dedup.json"


def deduper_for(dedup: str | None, threshold: int | None, *, out: str, engine: str,
                num_nodes: int, resume: bool, append: bool, overwrite: bool
                ) -> Deduper | None:
    """The packing process's :class:`Deduper`, or None without ``dedup``; refuses what it
    cannot decide (one line naming the parameter)."""
    if dedup is None:
        if threshold is not None:
            raise PackOptionError("`dedup_threshold` needs `dedup='near'`")
        return None
    try:
        deduper = Deduper(dedup, threshold)
    except ValueError as exc:
        raise PackOptionError(str(exc)) from None
    # Every record's hash must pass through one process, in order: not so for Dask's tasks,
    # other nodes' shards, or shards a resume keeps (their hashes are not stored).
    for name, given in (("engine='dask'", engine == "dask"), ("num_nodes", num_nodes > 1),
                        ("resume=True", resume)):
        if given:
            raise PackOptionError(f"`dedup` cannot be combined with `{name}`")
    if "://" in out:
        raise PackOptionError("`dedup` needs a local `out` (its report is written beside it)")
    if os.path.lexists(report_path(out)) and not overwrite and not append:  # append: ours
        raise PackError(f"{report_path(out)} already exists (use `overwrite=True` to replace "
                        "it)")
    return deduper


HASHES_NAME = "dedup-hashes.npy"


def hash_array(mode: str, keys: list[str], kept: dict[str, Any]) -> np.ndarray:
    """The hashes of records ``keys`` (a store's logical order) as a plain array: uint64 pHashes
    (near), or 32 SHA-256 bytes (exact); zeros for a record without one (deleted)."""
    if mode == "near":
        return np.array([kept.get(k, 0) for k in keys], dtype="<u8")
    out = np.zeros((len(keys), 32), dtype=np.uint8)
    for i, k in enumerate(keys):
        if k in kept:
            out[i] = np.frombuffer(bytes.fromhex(kept[k]), dtype=np.uint8)
    return out


def hashes_entry(folder: str, deduper: Deduper, keys: list[str]) -> dict[str, Any]:
    """Write the hashes of ``keys`` into ``folder``: the manifest's ``dedup`` entry."""
    from .append import write_array

    return write_array(folder, HASHES_NAME, hash_array(deduper.mode, keys, deduper.kept())) | {
        "mode": deduper.mode, "threshold": deduper.threshold}


def store_hashes(partial: str, deduper: Deduper) -> None:
    """A finished folder store in ``partial``: its records' hashes beside its shards and in its
    manifest (``dedup``), so an append with the same ``dedup`` compares new records with them."""
    from .. import metadata, storemeta
    from .append import logical_keys

    path = os.path.join(partial, metadata.MANIFEST_NAME)
    with open(path, "rb") as f:
        manifest = storemeta.parse_manifest(f.read(), path)
    manifest["dedup"] = hashes_entry(partial, deduper, logical_keys(partial, manifest))
    replace_atomic(path, metadata.dumps(metadata.seal(manifest)))


def seed(deduper: Deduper, base: Any) -> None:
    """Keep the live records of the store an append adds to, with the hashes its pack stored
    (PackOptionError where it has none of this kind: packed without ``dedup``, or changed
    since by an append without it, a replace or a compaction)."""
    entry = base.manifest.get("dedup")
    if entry is None or entry["mode"] != deduper.mode:
        raise PackOptionError(f"`dedup='{deduper.mode}'` with `append`: {base.out} holds no "
                              f"{deduper.mode} hashes of its records (pack it with "
                              f"dedup='{deduper.mode}' to keep them)")
    hashes = np.load(os.path.join(base.out, entry["file"]), allow_pickle=False)
    if len(hashes) != len(base.ordered):
        raise PackError(f"{base.out}: its dedup hashes do not cover its records (damaged store)")
    for i in base.live.tolist():
        value = int(hashes[i]) if deduper.mode == "near" else bytes(hashes[i]).hex()
        deduper.keep(base.ordered[i], value)


#: Records a worker hashes together (near mode: :func:`shardkit.dedup.phash_many`).
HASH_BATCH = 32


def digest(pixels: np.ndarray, mode: str) -> Any:
    """What an encoding worker keeps of the pixels it packs (oriented, RGB, resized) for the
    hash ``mode`` uses: the exact hash, or near mode's :func:`~shardkit.dedup.thumbnail`, which
    :func:`with_digests` turns into the hash, a batch of records at a time."""
    return pixel_digest(pixels) if mode == "exact" else thumbnail(pixels)


def with_digest(result: Any, settings: Any) -> Any:
    """``result`` (an :class:`.encoding.Encoded`) with its :func:`digest`: a record that did
    not go through :func:`.encoding.encode_data` (a container's JPEG kept byte for byte, a
    video frame) is hashed from its stored bytes, decoded."""
    if result.data is None or result.digest is not None:
        return result
    pixels = decode(result.data, settings.encoding, result.height, result.width)
    return result._replace(digest=digest(pixels, settings.dedup))


def with_digests(results: Iterable[Any], settings: Any) -> Iterator[Any]:
    """Each of ``results`` (in order) with its hash: :func:`with_digest`, and in near mode the
    thumbnails hashed :data:`HASH_BATCH` records at a time."""
    if settings.dedup == "exact":
        yield from (with_digest(r, settings) for r in results)
        return
    held: list[Any] = []
    for result in results:
        held.append(with_digest(result, settings))
        if len(held) == HASH_BATCH:
            yield from _hashed(held)
            held = []
    yield from _hashed(held)


def _hashed(held: list[Any]) -> list[Any]:
    thumbnails = [r.digest for r in held if r.digest is not None]
    if not thumbnails:
        return held
    values = iter(phash_many(np.stack(thumbnails)))
    return [r if r.digest is None else r._replace(digest=next(values)) for r in held]


def report_dedup(deduper: Deduper, out: str) -> dict[str, Any]:
    """Write the report beside the installed OUT; returns its summary (no pairs)."""
    path = report_path(out)
    try:
        replace_atomic(path, deduper.dumps())
    except OSError as exc:
        raise PackError(f"cannot write {path}: {exc.strerror or exc}; {out} is packed, its "
                        "duplicates listed as skipped in its metadata") from None
    summary = {k: v for k, v in deduper.report().items() if k != "pairs"}
    return summary | {"report": path}
