"""Byte-record field kinds: bytes, UTF-8 text and JSON (values + offsets of uint8 in the
index), and instance masks (zlib-compressed bit planes) and semantic label maps
(zlib-compressed), lossless, stored as side records beside the image record (:class:`SideBlob`).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

from .arrays import check_offsets
from .base import DTYPES, MAX_BYTES, Field, FieldError, as_array, check_dtype

# -- byte records ------------------------------------------------------------------------------

class Blob(Field):
    """One byte string per record (values + offsets); ``max_bytes`` bounds one record's bytes."""

    kind = "bytes"

    def __init__(self, name: str, max_bytes: int = MAX_BYTES) -> None:
        super().__init__(name)
        self.max_bytes = int(max_bytes)

    def encode(self, value: Any, ctx: dict[str, Any]) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise FieldError(f"field {self.name!r}: expected bytes, got {type(value).__name__}")
        return bytes(value)

    def decode(self, raw: bytes, ctx: dict[str, Any]) -> Any:
        return raw

    def null_value(self) -> bytes:
        return b""

    def check(self, value: Any, ctx: dict[str, Any]) -> bytes:
        size = _size_hint(value)
        if size is not None and size > self.max_bytes:  # refused before any copy is made
            raise FieldError(f"field {self.name!r}: {size} bytes, more than max_bytes "
                             f"{self.max_bytes}")
        raw = self.encode(value, ctx)
        if len(raw) > self.max_bytes:
            raise FieldError(f"field {self.name!r}: {len(raw)} bytes stored, more than "
                             f"max_bytes {self.max_bytes}")
        return raw

    def column_names(self) -> tuple[str, ...]:
        return self.col("values"), self.col("offsets")

    def columns(self, values: list[bytes]) -> dict[str, np.ndarray]:
        offsets = np.zeros(len(values) + 1, dtype="<i8")
        np.cumsum([len(v) for v in values], out=offsets[1:])
        return {self.col("values"): np.frombuffer(b"".join(values), dtype=np.uint8),
                self.col("offsets"): offsets}

    def check_columns(self, cols: dict[str, np.ndarray], count: int, where: str) -> None:
        values = cols[self.col("values")]
        if values.ndim != 1 or values.dtype != np.uint8:
            raise FieldError(f"{where}: field {self.name!r} values are not a uint8 vector")
        check_offsets(cols[self.col("offsets")], len(values), count,
                      f"{where}: field {self.name!r}")

    def raw(self, cols: dict[str, np.ndarray], local: int) -> bytes:
        offsets = cols[self.col("offsets")]
        return cols[self.col("values")][offsets[local]:offsets[local + 1]].tobytes()

    def read(self, cols: dict[str, np.ndarray], local: int, ctx: dict[str, Any] | None = None
             ) -> Any:
        return self.decode(self.raw(cols, local), ctx or {})

    def params(self) -> dict[str, Any]:
        return {"max_bytes": self.max_bytes} if self.max_bytes != MAX_BYTES else {}


class SideBlob(Blob):
    """A byte record per record stored beside the image record, in the shard's side record
    stream ``f.<name>`` (:mod:`shardkit.formats.base`), so a shard's masks are neither held in
    memory while it is packed nor checksummed whole when it opens. The index holds two small
    columns per record: ``f.<name>.nbytes`` (int64) and ``f.<name>.crc32`` (uint32, of the
    stored bytes), checked at every read (``shardkit.fields.ShardFields``)."""

    side = True

    def stream(self) -> str:
        """The side record stream holding this field's records."""
        return self.col()

    def column_names(self) -> tuple[str, ...]:
        return self.col("nbytes"), self.col("crc32")

    def columns(self, values: tuple[Any, Any]) -> dict[str, np.ndarray]:
        """``values``: the records' byte counts and CRC32s (two sequences, see ``index``)."""
        nbytes, crcs = values
        return {self.col("nbytes"): np.asarray(nbytes, dtype="<i8"),
                self.col("crc32"): np.asarray(crcs, dtype="<u4")}

    @staticmethod
    def index(raw: bytes) -> tuple[int, int]:
        """What the index keeps of one stored record: its length and CRC32."""
        return len(raw), zlib.crc32(raw)

    def check_columns(self, cols: dict[str, np.ndarray], count: int, where: str) -> None:
        for part, dtype in (("nbytes", np.int64), ("crc32", np.uint32)):
            arr = cols[self.col(part)]
            if arr.shape != (count,) or arr.dtype != dtype:
                raise FieldError(f"{where}: field {self.name!r} column {part} is {arr.dtype}"
                                 f"{list(arr.shape)}, expected {np.dtype(dtype)}[{count}]")
        if count and cols[self.col("nbytes")].min() < 0:
            raise FieldError(f"{where}: field {self.name!r} has a negative record size "
                             "(damaged store)")

    def check_stored(self, raw: bytes, cols: dict[str, np.ndarray], local: int) -> None:
        """Refuse a side record whose length or CRC32 differs from the index's (FieldError)."""
        want = int(cols[self.col("nbytes")][local])
        if len(raw) != want:
            raise FieldError(f"side record holds {len(raw)} bytes, the index says {want} "
                             "(damaged store)")
        if zlib.crc32(raw) != int(cols[self.col("crc32")][local]):
            raise FieldError("side record is damaged (checksum mismatch)")

    def read(self, cols: dict[str, np.ndarray], local: int, ctx: dict[str, Any] | None = None
             ) -> Any:
        raise TypeError(f"field {self.name!r} is stored in side records: read it through "
                        "shardkit.fields.ShardFields.value")


def _size_hint(value: Any) -> int | None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, str):
        return len(value)  # a lower bound of its UTF-8 length
    if isinstance(value, np.ndarray):
        return value.nbytes // 8  # masks: bit planes, before compression
    return None


class Bytes(Blob):
    kind = "bytes"


class Text(Blob):
    """A UTF-8 string per record (a caption); read as ``str``."""

    kind = "text"

    def encode(self, value: Any, ctx: dict[str, Any]) -> bytes:
        if isinstance(value, (bytes, bytearray)):
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FieldError(f"field {self.name!r}: not valid UTF-8 (byte {exc.start})"
                                 ) from None
            return bytes(value)
        if not isinstance(value, str):
            raise FieldError(f"field {self.name!r}: expected text, got {type(value).__name__}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise FieldError(f"field {self.name!r}: cannot be encoded as UTF-8 ({exc.reason})"
                             ) from None

    def decode(self, raw: bytes, ctx: dict[str, Any]) -> str:
        return raw.decode("utf-8")


class Json(Blob):
    """A JSON value per record (validated; NaN and infinity refused); read as parsed objects."""

    kind = "json"

    def encode(self, value: Any, ctx: dict[str, Any]) -> bytes:
        if isinstance(value, (bytes, bytearray, str)):
            try:
                value = json.loads(value, parse_constant=_no_constant)
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                raise FieldError(f"field {self.name!r}: not valid JSON ({exc})") from None
        try:
            return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False,
                              separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:
            raise FieldError(f"field {self.name!r}: not JSON-serialisable ({exc})") from None

    def decode(self, raw: bytes, ctx: dict[str, Any]) -> Any:
        return json.loads(raw)


def _no_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name}")


class Masks(SideBlob):
    """Instance masks: one H x W binary mask per box of ``of``, at the stored image's size.
    Stored lossless as a side record: a uint32 count, then the bit planes, zlib-compressed.
    Read as uint8 (N, H, W) of 0/1."""

    kind = "masks"
    geometric = True
    absent_is_empty = True

    def __init__(self, name: str, of: str = "boxes", max_bytes: int = MAX_BYTES) -> None:
        super().__init__(name, max_bytes)
        self.of = of

    def params(self) -> dict[str, Any]:
        return {"of": self.of, **super().params()}

    def absent(self, ctx: dict[str, Any]) -> np.ndarray:
        return np.zeros((0, ctx["height"], ctx["width"]), np.uint8)

    def encode(self, value: Any, ctx: dict[str, Any]) -> bytes:
        arr = np.asarray(value)
        h, w = ctx["height"], ctx["width"]
        boxes = ctx["values"].get(self.of)
        n = len(boxes) if boxes is not None else None
        if arr.size == 0 and n == 0:
            arr = arr.reshape(0, h, w)
        if arr.ndim != 3 or arr.shape[1:] != (h, w):
            raise FieldError(f"field {self.name!r}: masks of shape {list(arr.shape)}, expected "
                             f"[n, {h}, {w}] (the stored image's size)")
        if n is not None and len(arr) != n:
            raise FieldError(f"field {self.name!r}: {len(arr)} masks for {n} boxes in {self.of!r}")
        if arr.dtype != np.bool_ and (arr.dtype.kind not in "iu" or (arr.size and arr.max() > 1)
                                      or (arr.size and arr.min() < 0)):
            raise FieldError(f"field {self.name!r}: instance masks must be 0/1 values")
        header = np.array([len(arr)], dtype="<u4").tobytes()
        return header + zlib.compress(np.packbits(arr.astype(bool), axis=None).tobytes(), 1)

    def decode(self, raw: bytes, ctx: dict[str, Any]) -> np.ndarray:
        h, w = ctx["height"], ctx["width"]
        if len(raw) < 4:
            raise FieldError(f"field {self.name!r}: mask record of {len(raw)} bytes has no "
                             "header (damaged store)")
        n = int(np.frombuffer(raw[:4], dtype="<u4")[0])
        bits = n * h * w
        need = (bits + 7) // 8
        # Bounded: a damaged stream cannot make this allocate more than the masks' own size.
        plane = zlib.decompressobj().decompress(raw[4:], need)
        if len(plane) != need:
            raise FieldError(f"field {self.name!r}: mask record holds {len(plane)} bytes, "
                             f"expected {need} (damaged store)")
        flat = np.unpackbits(np.frombuffer(plane, np.uint8), count=bits)
        return flat.reshape(n, h, w)


class SemanticMask(SideBlob):
    """A label map the size of the stored image (H x W, ``dtype``), stored zlib-compressed as a
    side record."""

    kind = "semantic"
    geometric = True

    def __init__(self, name: str, dtype: str = "uint8", max_bytes: int = MAX_BYTES) -> None:
        super().__init__(name, max_bytes)
        self.dtype = check_dtype(dtype, name)
        if self.dtype not in ("uint8", "int32", "int64", "uint16", "int16"):
            raise FieldError(f"field {name!r}: a semantic mask holds integer labels")

    def params(self) -> dict[str, Any]:
        return {"dtype": self.dtype, **super().params()}

    def encode(self, value: Any, ctx: dict[str, Any]) -> bytes:
        arr = as_array(value, self.dtype, self.name)
        h, w = ctx["height"], ctx["width"]
        if arr.shape != (h, w):
            raise FieldError(f"field {self.name!r}: label map of shape {list(arr.shape)}, "
                             f"expected [{h}, {w}] (the stored image's size)")
        return zlib.compress(np.ascontiguousarray(arr, DTYPES[self.dtype]).tobytes(), 1)

    def decode(self, raw: bytes, ctx: dict[str, Any]) -> np.ndarray:
        h, w = ctx["height"], ctx["width"]
        dtype = np.dtype(DTYPES[self.dtype])
        need = h * w * dtype.itemsize
        plane = zlib.decompressobj().decompress(raw, need)
        if len(plane) != need:
            raise FieldError(f"field {self.name!r}: label map holds {len(plane)} bytes, "
                             f"expected {need} (damaged store)")
        return np.frombuffer(plane, dtype).reshape(h, w).copy()
