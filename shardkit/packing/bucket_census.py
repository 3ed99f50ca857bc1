"""``min_bucket_count``: how many records each bucket would hold, counted before any pixel is
decoded, and the rule with its small buckets merged (:mod:`shardkit.bucketing.merge`).

Every planned source's header is read once (its size and EXIF orientation: a few KiB of a
local file; a container member or an object at a URL is read whole), a few at a time on
threads, and placed by the rule. A source whose header cannot be read, that is over
``max_pixels`` or that no bucket holds is not counted: the pack skips it. sd-scripts reads
every image's size before training in the same way.
"""

from __future__ import annotations

import io
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from PIL import Image

from ..bucketing import BucketRule, TooSmall, merge_small
from ..urls import is_url
from .imaging import exif_orientation, quiet_warnings
from .settings import PackSettings

THREADS = 8


def oriented_size(source: Any, settings: PackSettings) -> tuple[int, int] | None:
    """A source's (height, width) after EXIF orientation, from its header; None: unreadable."""
    try:
        if isinstance(source, str) and not is_url(source):
            opened = Image.open(source)
        else:
            from .workers import read_source

            if isinstance(source, str):
                data = read_source(source, settings)
            else:
                from .sources import read_item

                data = read_item(source, None)
            if not isinstance(data, bytes):  # refused, with its reason
                return None
            opened = Image.open(io.BytesIO(data))
        with quiet_warnings(), opened as im:
            width, height = im.size
            if settings.max_pixels and width * height > settings.max_pixels:
                return None
            turned = exif_orientation(im) in (5, 6, 7, 8)
    except Exception:  # noqa: BLE001 - the pack itself then skips it, with its reason
        return None
    return (width, height) if turned else (height, width)


def counts(plan: Any, rule: BucketRule) -> Counter:
    """Records each bucket of ``rule`` (merges left out) would hold from ``plan``'s sources."""
    plain = rule.with_merged((), 0)
    settings = plan.settings
    found: Counter = Counter()
    with ThreadPoolExecutor(THREADS) as pool:
        for k in range(plan.num_shards):
            _, items = plan.rows(k)
            for size in pool.map(lambda s: oriented_size(s, settings), items):
                if size is None:
                    continue
                try:
                    found[plain.place(*size).size] += 1
                except TooSmall:
                    pass
    return found


def merged(plan: Any, rule: BucketRule) -> BucketRule:
    """``rule`` with the buckets that would hold fewer than its ``min_bucket_count`` records
    merged into their nearest neighbour."""
    return rule.with_merged(merge_small(counts(plan, rule), rule.min_bucket_count,
                                        rule.upscale))
