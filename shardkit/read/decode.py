"""A stored record checked and decoded: the one place, used by ``ShardDataset`` and ``verify``.

Faults come out as ``StoreError`` naming the store, the shard and the record: a CRC32 that does
not match the index (the stored bytes are damaged), a row index that does not hold the record's
own restart markers (a partial decode would return other rows, with no error), or bytes that do
not decode to the image the index describes (``codec.RecordDecodeError``).
"""

from __future__ import annotations

import os
import zlib
from typing import TYPE_CHECKING

import numpy as np

from .. import codec, jpegrows
from ..errors import StoreError
from . import cut, partial

if TYPE_CHECKING:
    from .shard import OpenShard
    from .store import Store


def shard_name(store: Store, k: int) -> str:
    """How messages name shard ``k``: its file, or a remote store's object (not the cache copy)."""
    path = store.shards[k].path
    if store.cache is not None:
        path = f"{store.path}/{os.path.basename(path)}"
    return f"shard {k} ({path})"


class Decoder:
    """Decodes one store's records (``fast``: libjpeg-turbo's fast DCT and upsampling), checking
    each record's CRC32 first when ``verify``."""

    def __init__(self, store: Store, fast: bool = False, verify: bool = False) -> None:
        self.store = store
        self.encoding = store.encoding
        self.fast = fast
        self.verify = verify

    def error(self, k: int, local: int, reason: object) -> StoreError:
        return StoreError(f"{self.store.path}: {shard_name(self.store, k)}, record {local}: "
                          f"{reason}")

    def check(self, shard: OpenShard, k: int, local: int, buf) -> None:
        """Raise unless ``buf`` has the CRC32 the index holds for it (always checked)."""
        if zlib.crc32(buf) != int(shard.crc32[local]):
            raise self.error(k, local, "checksum mismatch (CRC32): the stored bytes are damaged")

    def check_rows(self, shard: OpenShard, k: int, local: int, buf) -> None:
        """Raise unless the shard's row index holds exactly the row starts found in the record's
        own restart markers (none where it has none). The index's checksum proves only that the
        index is as written: a forged one, checksums recomputed, passes it, and a partial decode
        through it returns other rows of the image."""
        if shard.row_offsets is None:  # a store packed before row markers: decoded whole
            return
        indexed = partial.record_rows(shard, local)
        found = jpegrows.row_starts(buf) if self.encoding == "jpeg" else None
        if found is None and indexed is None:
            return
        if found is None or indexed is None or not np.array_equal(found, indexed):
            said = "no rows" if indexed is None else f"{len(indexed) - 1} rows"
            held = "no row markers" if found is None else f"{len(found) - 1} rows"
            why = "at other offsets" if said == held else f"{held}, the index says {said}"
            raise self.error(k, local, f"row index does not match the record's restart markers "
                                       f"({why}; damaged or forged store)")

    def image(self, shard: OpenShard, k: int, local: int, buf) -> np.ndarray:
        """The whole image, HxWx3 uint8, in memory the caller owns."""
        if self.verify:
            self.check(shard, k, local, buf)
        height, width = int(shard.heights[local]), int(shard.widths[local])
        jpeg = self.encoding == "jpeg"
        try:
            # Into memory of the indexed size: a damaged header claiming a huge image is refused
            # instead of allocated (simplejpeg sizes its own output from the header).
            img = codec.decode(buf, self.encoding, height, width, self.fast,
                               np.empty((height, width, 3), np.uint8) if jpeg else None)
        except codec.RecordDecodeError as exc:
            raise self.error(k, local, exc) from None
        return img if jpeg else img.copy()  # a raw record is a view of the transaction's memory

    def into(self, outs, shard: OpenShard, k: int, local: int, buf, height: int,
             width: int, plans) -> None:
        """Decode once straight into every view's ``outs[i]``: ``plans[i]``'s box resized and
        flipped (``[None]``: one plain centre crop)."""
        if self.verify:
            self.check(shard, k, local, buf)
            self.check_rows(shard, k, local, buf)
        try:
            cut.decode_views(outs, buf, self.encoding, height, width, plans, self.fast,
                                 partial.record_rows(shard, local))
        except codec.RecordDecodeError as exc:
            raise self.error(k, local, exc) from None

    def prove(self, shard: OpenShard, k: int, local: int, buf) -> None:
        """``verify``'s check: the CRC32, the row index against the record's markers, then an
        exact decode (into a reused buffer)."""
        self.check(shard, k, local, buf)
        self.check_rows(shard, k, local, buf)
        height, width = int(shard.heights[local]), int(shard.widths[local])
        try:
            codec.decode(buf, self.encoding, height, width, False,
                         codec.scratch(height * width * 3))
        except codec.RecordDecodeError as exc:
            raise self.error(k, local, exc) from None
