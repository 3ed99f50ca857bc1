"""Duplicates at pack time (``pack(dedup="exact" | "near")``): the options checked, the hash an
encoding worker computes on the pixels it packs (:func:`digest`), and the report written beside
OUT once it is installed (:func:`report_dedup`). The decisions themselves are
:class:`shardkit.dedup.Deduper`'s, made in the packing process as records are written.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..codec import decode
from ..dedup import Deduper, phash, pixel_digest
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
                        ("resume=True", resume), ("append=True", append)):
        if given:
            raise PackOptionError(f"`dedup` cannot be combined with `{name}`")
    if "://" in out:
        raise PackOptionError("`dedup` needs a local `out` (its report is written beside it)")
    if os.path.lexists(report_path(out)) and not overwrite:
        raise PackError(f"{report_path(out)} already exists (use `overwrite=True` to replace "
                        "it)")
    return deduper


def digest(pixels: np.ndarray, mode: str) -> Any:
    """The hash ``mode`` uses, of the pixels a worker packs (oriented, RGB, resized)."""
    return pixel_digest(pixels) if mode == "exact" else phash(pixels)


def with_digest(result: Any, settings: Any) -> Any:
    """``result`` (an :class:`.encoding.Encoded`) with its hash: a record that did not go
    through :func:`.encoding.encode_data` (a container's JPEG kept byte for byte, a video
    frame) is hashed from its stored bytes, decoded."""
    if result.data is None or result.digest is not None:
        return result
    pixels = decode(result.data, settings.encoding, result.height, result.width)
    return result._replace(digest=digest(pixels, settings.dedup))


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
