"""Buckets that hold too few records, folded into their nearest neighbour at pack time.

A bucket holds at least ``min_bucket_count`` records or its records go to another bucket:
among the buckets that hold at least that many, the one whose ``w / h`` is nearest the small
bucket's (kohya's measure, ``|w / h - w' / h'|``; a tie to the fuller bucket, then the first in
(height, width) order). Without upscaling the other bucket must also fit inside the small one
(no side larger), so a merged record is only ever scaled down; a small bucket with no such
neighbour stays. Merged records are resized to cover their new bucket and cut to it with the
rule's own arithmetic. Merging reads only the counts, so the result is the same for the same
sources and rule, on any engine.
"""

from __future__ import annotations

from typing import Mapping


def merge_small(counts: Mapping[tuple[int, int], int], min_count: int, upscale: bool
                ) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``[(small bucket, bucket its records go to), ...]``, sorted by the small bucket."""
    kept = {s: n for s, n in counts.items() if n >= min_count}
    out = []
    for small, n in sorted(counts.items()):
        if n >= min_count or not n:
            continue
        h, w = small
        near = [s for s in kept if upscale or (s[0] <= h and s[1] <= w)]
        if near:
            into = min(near, key=lambda s: (abs(s[1] / s[0] - w / h), -kept[s], s))
            out.append((small, into))
    return out


def small_records(counts: Mapping[tuple[int, int], int], min_count: int) -> int:
    """Records in buckets holding fewer than ``min_count``."""
    return sum(n for n in counts.values() if n < min_count)
