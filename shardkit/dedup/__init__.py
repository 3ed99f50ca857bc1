"""Duplicate images: the hashes (:mod:`.hashing`: an exact pixel digest and a 64-bit perceptual
hash), the Hamming search over them (:mod:`.search`), the pack-time decisions and their report
(:mod:`.report`), and the train/test leakage check between two stores (:mod:`.leaks`, which
reads stores: imported on its own, never from here, so the packer that imports this package
does not load the read side).
"""

from __future__ import annotations

from .hashing import MODES, phash, phash_many, pixel_digest, thumbnail
from .report import DUPLICATE, Deduper
from .search import DEFAULT_THRESHOLD, cross_pairs

__all__ = ["DEFAULT_THRESHOLD", "DUPLICATE", "MODES", "Deduper", "cross_pairs", "phash",
           "phash_many", "pixel_digest", "thumbnail"]
