"""The ``buckets`` entry of a bucketed store's metadata (shards and manifest): built by the
packer (:mod:`shardkit.packing.buckets` sizes the records), checked by every reader
(:mod:`shardkit.storemeta`), read by the read side.

::

    "buckets": {"rule": "area", "side": 1024, "area": 1048576, "step": 64, "upscale": false,
                "sizes": [[512, 2048], ..., [1024, 1024], ...], "counts": [3, ..., 41, ...]}

``sizes`` are the (height, width) of every bucket that holds a record (own-size buckets of small
sources included), sorted; ``counts`` the records in each, in the same order, summing to the
shard's (or store's) ``count`` (a version that deleted or replaced records: its live records,
``records["count"]``; a shard keeps counting all of its own). Every record is stored at exactly
its bucket's size, so a record's bucket is its (height, width) in the index. The other keys repeat
``settings["buckets"]``: the rule's name and parameters (:func:`shardkit.bucketing.from_meta`
reads them back; ``{"rule": "kohya", "side": N}``, what the area rule was first called, reads as
the area rule), and where ``min_bucket_count`` was given, the buckets ``merged`` into others.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from .bucketing import BucketRule, from_meta
from .errors import StoreError

KEY = "buckets"
_HELD = ("sizes", "counts")


def histogram(spec: dict[str, Any], heights: Iterable[int], widths: Iterable[int]
              ) -> dict[str, Any]:
    """The ``buckets`` entry for records of these sizes under ``spec`` (``settings["buckets"]``)."""
    return held(spec, Counter(zip(map(int, heights), map(int, widths))))


def held(spec: dict[str, Any], counts: Counter) -> dict[str, Any]:
    sizes = sorted(s for s, n in counts.items() if n)
    return spec | {"sizes": [list(s) for s in sizes], "counts": [counts[s] for s in sizes]}


def merge(spec: dict[str, Any], parts: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """The store's entry from its shards' (each a ``{"sizes", "counts"}`` or a whole entry)."""
    total: Counter = Counter()
    for part in parts:
        for size, n in zip(part["sizes"], part["counts"]) if part else ():
            total[tuple(size)] += n
    return held(spec, total)


def sizes_counts(meta: dict[str, Any]) -> tuple[list[tuple[int, int]], list[int]] | None:
    """A checked store's buckets: ((height, width) per bucket, records per bucket); None when
    the store is not bucketed."""
    entry = meta.get(KEY)
    if entry is None:
        return None
    return [tuple(s) for s in entry["sizes"]], list(entry["counts"])


SMALL = 3  # a bucket of one or two records makes batches of one or two


def small(entry: dict[str, Any]) -> dict[str, int]:
    """A checked entry's small buckets: ``{"under": N, "buckets", "records", "merged"}``, the
    buckets holding fewer than N records (the pack's ``min_bucket_count``, else 3) and the
    records in them, and how many buckets were merged into others at pack time."""
    under = entry.get("min_bucket_count") or SMALL
    counts = [n for n in entry["counts"] if n < under]
    return {"under": under, "buckets": len(counts), "records": sum(counts),
            "merged": len(entry.get("merged", ()))}


def rule(spec: dict[str, Any], where: str) -> BucketRule:
    """The rule ``settings["buckets"]`` records (StoreError if it records none)."""
    try:
        return from_meta(spec)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StoreError(f"{where}: metadata 'buckets': the rule or its parameters are invalid "
                         f"({exc}; damaged store)") from None


def _int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check(obj: dict[str, Any], where: str) -> None:
    """Refuse a ``buckets`` entry that is malformed, disagrees with ``settings["buckets"]`` or
    with the record count (StoreError); stores without buckets pass."""
    settings = obj.get("settings") if isinstance(obj.get("settings"), dict) else {}
    spec, entry = settings.get(KEY), obj.get(KEY)
    if spec is None and entry is None:
        return
    bad = f"{where}: metadata 'buckets'"
    if not isinstance(spec, dict) or not isinstance(entry, dict):
        raise StoreError(f"{bad} and settings['buckets'] disagree (damaged store)")
    if {k: v for k, v in entry.items() if k not in _HELD} != spec:
        raise StoreError(f"{bad} and settings['buckets'] disagree (damaged store)")
    made = rule(spec, where)
    sizes, counts = entry.get("sizes"), entry.get("counts")
    if not isinstance(sizes, list) or not isinstance(counts, list) or len(sizes) != len(counts):
        raise StoreError(f"{bad}: sizes and counts must be lists of one length (damaged store)")
    pairs = []
    for size in sizes:
        if not (isinstance(size, list) and len(size) == 2 and all(_int(v, 1) for v in size)):
            raise StoreError(f"{bad}: a size is not a [height, width] pair of positive integers")
        if not made.admits(size[0], size[1]):
            raise StoreError(f"{bad}: {size[0]}x{size[1]} is no bucket of its rule "
                             f"{made.name!r} (damaged store)")
        pairs.append(tuple(size))
    if pairs != sorted(set(pairs)):
        raise StoreError(f"{bad}: sizes are not sorted and distinct (damaged store)")
    if not all(_int(n, 1) for n in counts):
        raise StoreError(f"{bad}: counts must be positive integers (damaged store)")
    # A version that deleted or replaced records counts its live ones (``records``).
    live = obj["records"]["count"] if isinstance(obj.get("records"), dict) else obj.get("count")
    if sum(counts) != live:
        raise StoreError(f"{bad}: counts sum to {sum(counts)}, the store holds "
                         f"{live} records (damaged store)")
