"""One source image's bytes to a record: decoded, oriented, made RGB, resized and encoded
(:func:`encode_data`), or rejected with the reason (:class:`Encoded`). Below both the folder
pipeline (:mod:`.workers`) and the container sources (:mod:`.sources.encode`), which only differ
in how they read the bytes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..codec import encode
from .dedup_run import digest
from .imaging import ImageRejected, load_bucketed, load_rgb
from .settings import PackSettings


class Encoded(NamedTuple):
    """One source, encoded: ``data`` is the record, or None with the ``reason`` it was skipped."""

    data: bytes | None
    height: int
    width: int
    reason: str | None
    #: A bucketed pack's :class:`.buckets.Placement` of the source (None: not bucketed).
    place: Any = None
    #: The pixels' hash when the pack looks for duplicates (:mod:`.dedup_run`), else None.
    digest: Any = None

    @classmethod
    def rejected(cls, reason: str) -> Encoded:
        return cls(None, 0, 0, reason)


def encode_data(data: bytes, settings: PackSettings) -> Encoded:
    """One encoded source image decoded, resized and encoded (or rejected, with the reason)."""
    try:
        place = None
        if settings.buckets is not None:
            pixels, place = load_bucketed(data, settings.buckets, settings.max_pixels)
        else:
            pixels = load_rgb(data, settings.size, settings.max_pixels)
        height, width = pixels.shape[:2]
        found = None if settings.dedup is None else digest(pixels, settings.dedup)
        return Encoded(encode(pixels, settings.encoding, settings.quality), height, width, None,
                       place, found)
    except ImageRejected as exc:
        return Encoded.rejected(str(exc))
    except MemoryError:  # in an encoding worker: more than limit_memory allows
        return Encoded.rejected("out of memory while decoding")
