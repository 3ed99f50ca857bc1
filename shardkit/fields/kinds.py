"""One small class per field kind: what a value may be, how it is checked and stored, how it is
read back.

Storage, by family (the base classes own it; a kind only says how one value is checked):

- ``Fixed`` (int/float/bool scalars, fixed-shape arrays): one index array ``f.<name>`` of shape
  ``(count, *shape)``.
- ``Ragged`` (ragged arrays, multi-label, boxes, per-box fields): ``f.<name>.values`` (all
  records' rows back to back) and ``f.<name>.offsets`` (``count + 1`` int64).
- ``Blob`` (text, JSON, bytes): each record's bytes back to back in ``f.<name>.values`` (uint8)
  with ``f.<name>.offsets``; text UTF-8, JSON canonical UTF-8 JSON.
- ``SideBlob`` (instance masks, semantic masks): each record's bytes are a side record in the
  shard's stream ``f.<name>``, beside the image record (masks: zlib-compressed bit planes,
  lossless); the index holds ``f.<name>.nbytes`` and ``f.<name>.crc32`` per record.

Every column is a plain numeric index array with a CRC32 in the metadata, like the store's own;
every side record is checked against its length and CRC32 when it is read.
"""

from __future__ import annotations

from .arrays import (Array, Bool, Boxes, Fixed, Float, Int, MultiLabel, PerBox, Ragged, Scalar,
                     check_boxes, check_offsets)
from .base import (BOX_FORMATS, DISK_DTYPES, DTYPES, MAX_BYTES, MAX_ROWS, NAME, RESERVED, Field,
                   FieldError)
from .records import Blob, Bytes, Json, Masks, SemanticMask, SideBlob, Text

#: THE registry of field kinds: name -> class (the schema file's ``kind`` values).
KINDS: dict[str, type[Field]] = {cls.kind: cls for cls in (
    Int, Float, Bool, Array, Ragged, MultiLabel, Boxes, PerBox, Masks, SemanticMask, Text, Json,
    Bytes)}


__all__ = ["BOX_FORMATS", "DISK_DTYPES", "DTYPES", "KINDS", "MAX_BYTES", "MAX_ROWS", "NAME",
           "RESERVED", "Array", "Blob", "Bool", "Boxes", "Bytes", "Field", "FieldError", "Fixed",
           "Float", "Int", "Json", "Masks", "MultiLabel", "PerBox", "Ragged", "Scalar",
           "SemanticMask", "SideBlob", "Text", "check_boxes", "check_offsets"]
