"""The ``buckets`` entry of a bucketed folder store's version that drops records: ``update``'s
delete, and the records a replace supersedes. The entry counts the version's live records
only (what ``info``, ``verify`` and ``BucketSampler`` read), each in the bucket it was cut to;
a bucket left without live records leaves the list. Shards keep counting all of their own.

Nothing is placed again: a replace places its new images by the store's recorded rule and
merges (:mod:`.bucket_append`); relabelling and ``add_field`` keep the entry as it is, and
``compact`` copies the live records with their sizes, so its shards sum to the same entry.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from .. import bucketmeta, storemeta
from ..errors import StoreError
from ..formats import open_reader


def logical_sizes(folder: str, manifest: dict[str, Any]) -> np.ndarray:
    """Every record's (height, width), ``(N, 2)``, in the logical order of the shards' records
    (the shards' files in ``folder``)."""
    parts = [np.zeros((0, 2), dtype=np.int64)]
    for entry in manifest["shards"]:
        path = os.path.join(folder, entry["file"])
        reader = open_reader(path, entry["format"])
        try:
            arrays = storemeta.parse_shard_meta(reader.meta_json(), path)["arrays"]
            parts.append(np.stack([np.array(reader.array(name, arrays[name]["dtype"],
                                                         tuple(arrays[name]["shape"])))
                                   for name in ("heights", "widths")], 1).astype(np.int64))
        finally:
            reader.close()
    sizes = np.concatenate(parts)
    if "layout" in manifest:
        layout = np.load(os.path.join(folder, manifest["layout"]["file"]), allow_pickle=False)
        sizes = sizes[layout[0]]
    return sizes


def without(folder: str, manifest: dict[str, Any], entry: dict[str, Any],
            gone: np.ndarray) -> dict[str, Any]:
    """``entry`` less the records ``gone`` (logical indices of the records of ``manifest``'s
    shards, in ``folder``); StoreError where the entry does not count them (damaged store)."""
    counts = Counter({tuple(s): n for s, n in zip(entry["sizes"], entry["counts"])})
    if len(gone):
        counts.subtract(Counter(map(tuple, logical_sizes(folder, manifest)[gone].tolist())))
    if any(n < 0 for n in counts.values()):
        raise StoreError(f"{folder}: metadata 'buckets' does not count the store's live records "
                         "(damaged store)")
    return bucketmeta.held(manifest["settings"][bucketmeta.KEY], counts)


def live_entry(folder: str, manifest: dict[str, Any], entry: dict[str, Any] | None,
               before: np.ndarray, live: np.ndarray) -> dict[str, Any] | None:
    """A bucketed store's ``entry`` for a version whose live records are ``live``, the store's
    being ``before`` (each a subset of the other's and the new records); None: not bucketed."""
    if entry is None:
        return None
    return without(folder, manifest, entry, np.setdiff1d(before, live))


__all__ = ["live_entry", "logical_sizes", "without"]
