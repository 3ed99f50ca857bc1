"""One small class per field kind: what a value may be, how it is checked and stored, how it is
read back.

Storage, by family (the base classes own it; a kind only says how one value is checked):

- ``Fixed`` (int/float/bool scalars, fixed-shape arrays): one index array ``f.<name>`` of shape
  ``(count, *shape)``.
- ``Ragged`` (ragged arrays, multi-label, boxes, per-box fields): ``f.<name>.values`` (all
  records' rows back to back) and ``f.<name>.offsets`` (``count + 1`` int64).
- ``Blob`` (instance masks, semantic masks, text, JSON, bytes): each record's bytes back to back
  in ``f.<name>.values`` (uint8) with ``f.<name>.offsets``; masks are zlib-compressed bit planes
  (lossless), text UTF-8, JSON canonical UTF-8 JSON.

Every column is a plain numeric index array with a CRC32 in the metadata, like the store's own.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from typing import Any, ClassVar

import numpy as np

from ..errors import ShardkitError

#: dtypes a field column may have on disk (plain little-endian numbers only).
DTYPES: dict[str, str] = {
    "uint8": "|u1", "int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint16": "<u2", "uint32": "<u4", "float16": "<f2", "float32": "<f4", "float64": "<f8",
    "bool": "|b1",
}
DISK_DTYPES = frozenset(DTYPES.values())
BOX_FORMATS = ("XYXY", "XYWH", "CXCYWH")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
RESERVED = frozenset({"image", "label", "image_id_internal"})
#: Default bound on one record's stored bytes in one field (a 2 GB string is refused, not read).
MAX_BYTES = 64 << 20
#: Default bound on rows per record in a ragged field (100k boxes on one image pass; more do not).
MAX_ROWS = 1 << 20


class FieldError(ShardkitError, ValueError):
    """A field value, declaration or stored column is not valid (the message names the field)."""


def _dtype(value: Any, name: str) -> str:
    if value not in DTYPES:
        raise FieldError(f"field {name!r}: dtype must be one of {', '.join(DTYPES)}, "
                         f"got {value!r}")
    return value


def _as_array(value: Any, dtype: str, name: str) -> np.ndarray:
    """``value`` as a numpy array of ``dtype``, refusing lossy casts (a float into an int field,
    NaN or infinity in a float field)."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise FieldError(f"field {name!r}: not an array ({exc})") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise FieldError(f"field {name!r}: expected numbers, got {arr.dtype} values")
    target = np.dtype(dtype)
    if target.kind in "iub" and arr.dtype.kind == "f":
        if arr.size and not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise FieldError(f"field {name!r}: non-integer values for a {dtype} field")
    if target.kind == "f" and arr.size and not np.all(np.isfinite(arr.astype(np.float64))):
        raise FieldError(f"field {name!r}: values must be finite (NaN or infinity found)")
    if target.kind in "iu" and arr.size and arr.dtype.kind in "iuf":
        info = np.iinfo(target)
        if arr.min() < info.min or arr.max() > info.max:
            raise FieldError(f"field {name!r}: values outside the range of {dtype}")
    if target.kind == "b" and arr.dtype.kind != "b" and arr.size and not np.isin(arr, (0, 1)).all():
        raise FieldError(f"field {name!r}: a bool field takes 0/1 or True/False")
    return arr.astype(target, copy=False)


class Field:
    """A declared field: its ``name`` and, by subclass, its kind and parameters.

    ``check(value, ctx)`` validates one record's value and returns it normalised (numpy, in the
    stored dtype); ``ctx`` holds the stored image's ``height`` and ``width`` and the values of
    the fields checked before it. ``read(columns, local)`` returns record ``local``'s value.
    """

    kind: ClassVar[str]
    geometric: ClassVar[bool] = False  # moves with crop/flip at decode (boxes, masks)

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED:
            raise FieldError(f"field name must be an identifier (letters, digits, _) and not "
                             f"one of {sorted(RESERVED)}, got {name!r}")
        self.name = name

    # -- declaration --------------------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        return {}

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, **self.params()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and self.as_json() == other.as_json()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({self.name!r}{', ' if args else ''}{args})"

    # -- storage (the family base classes) ----------------------------------------------------

    def check(self, value: Any, ctx: dict[str, Any]) -> Any:
        raise NotImplementedError

    def columns(self, values: list[Any]) -> dict[str, np.ndarray]:
        """Column name -> array for ``values`` (one per record, as ``check`` returned them)."""
        raise NotImplementedError

    def column_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def read(self, cols: dict[str, np.ndarray], local: int) -> Any:
        raise NotImplementedError

    def check_columns(self, cols: dict[str, np.ndarray], count: int, where: str) -> None:
        """Shapes and offsets of a shard's columns; raises FieldError naming the field."""

    def col(self, part: str = "") -> str:
        return f"f.{self.name}{'.' + part if part else ''}"


# -- fixed-size fields ------------------------------------------------------------------------

class Fixed(Field):
    """One value of a fixed shape per record: a column of shape ``(count, *shape)``."""

    dtype: str = "int64"
    shape: tuple[int, ...] = ()

    def check(self, value: Any, ctx: dict[str, Any]) -> np.ndarray:
        arr = _as_array(value, self.dtype, self.name)
        if arr.shape != self.shape:
            raise FieldError(f"field {self.name!r}: shape {list(arr.shape)}, declared "
                             f"{list(self.shape)}")
        return arr

    def column_names(self) -> tuple[str, ...]:
        return (self.col(),)

    def columns(self, values: list[Any]) -> dict[str, np.ndarray]:
        out = np.empty((len(values), *self.shape), dtype=DTYPES[self.dtype])
        for i, v in enumerate(values):
            out[i] = v
        return {self.col(): out}

    def check_columns(self, cols: dict[str, np.ndarray], count: int, where: str) -> None:
        arr = cols[self.col()]
        if arr.shape != (count, *self.shape) or arr.dtype != np.dtype(DTYPES[self.dtype]):
            raise FieldError(f"{where}: field {self.name!r} column is {arr.dtype}"
                             f"{list(arr.shape)}, expected {self.dtype}{[count, *self.shape]}")

    def read(self, cols: dict[str, np.ndarray], local: int) -> Any:
        value = cols[self.col()][local]
        return value.item() if not self.shape else np.array(value)


class Scalar(Fixed):
    def check(self, value: Any, ctx: dict[str, Any]) -> np.ndarray:
        if isinstance(value, (list, tuple, dict, str, bytes)):
            raise FieldError(f"field {self.name!r}: expected one {self.kind}, got "
                             f"{type(value).__name__}")
        return super().check(value, ctx)


class Int(Scalar):
    kind = "int"
    dtype = "int64"


class Float(Scalar):
    kind = "float"
    dtype = "float64"


class Bool(Scalar):
    kind = "bool"
    dtype = "bool"


class Array(Fixed):
    """A fixed-shape numeric array per record (an embedding, a keypoint grid)."""

    kind = "array"

    def __init__(self, name: str, shape: tuple[int, ...] | list[int], dtype: str = "float32"
                 ) -> None:
        super().__init__(name)
        self.dtype = _dtype(dtype, name)
        try:
            self.shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            raise FieldError(f"field {name!r}: shape must be a list of sizes, got {shape!r}"
                             ) from None
        if any(s < 0 for s in self.shape) or math.prod(self.shape) > MAX_ROWS:
            raise FieldError(f"field {name!r}: invalid shape {list(self.shape)}")

    def params(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}


# -- ragged fields ----------------------------------------------------------------------------

class Ragged(Field):
    """A variable number of rows per record, each row of shape ``inner``: values + offsets."""

    kind = "ragged"
    inner: tuple[int, ...] = ()

    def __init__(self, name: str, dtype: str = "float32", inner: tuple[int, ...] | list[int] = (),
                 max_rows: int = MAX_ROWS) -> None:
        super().__init__(name)
        self.dtype = _dtype(dtype, name)
        try:
            self.inner = tuple(int(s) for s in inner)
        except (TypeError, ValueError):
            raise FieldError(f"field {name!r}: inner must be a list of sizes, got {inner!r}"
                             ) from None
        if any(s < 1 for s in self.inner):
            raise FieldError(f"field {name!r}: invalid inner shape {list(self.inner)}")
        self.max_rows = int(max_rows)

    def params(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "inner": list(self.inner)}

    def check(self, value: Any, ctx: dict[str, Any]) -> np.ndarray:
        arr = _as_array(value, self.dtype, self.name)
        if arr.size == 0:
            arr = arr.reshape((0, *self.inner))
        if arr.ndim != 1 + len(self.inner) or arr.shape[1:] != self.inner:
            raise FieldError(f"field {self.name!r}: shape {list(arr.shape)}, expected "
                             f"[n, {', '.join(map(str, self.inner))}]".replace(", ]", "]"))
        if len(arr) > self.max_rows:
            raise FieldError(f"field {self.name!r}: {len(arr)} rows, more than the "
                             f"{self.max_rows} allowed (max_rows)")
        return arr

    def column_names(self) -> tuple[str, ...]:
        return self.col("values"), self.col("offsets")

    def columns(self, values: list[Any]) -> dict[str, np.ndarray]:
        offsets = np.zeros(len(values) + 1, dtype="<i8")
        np.cumsum([len(v) for v in values], out=offsets[1:])
        dtype = DTYPES[self.dtype]
        stacked = (np.concatenate(values).astype(dtype, copy=False) if values
                   else np.empty((0, *self.inner), dtype))
        return {self.col("values"): stacked, self.col("offsets"): offsets}

    def check_columns(self, cols: dict[str, np.ndarray], count: int, where: str) -> None:
        values, offsets = cols[self.col("values")], cols[self.col("offsets")]
        check_offsets(offsets, len(values), count, f"{where}: field {self.name!r}")
        if values.shape[1:] != self.inner or values.dtype != np.dtype(DTYPES[self.dtype]):
            raise FieldError(f"{where}: field {self.name!r} values are {values.dtype}"
                             f"{list(values.shape)}, expected {self.dtype}[n, {list(self.inner)}]")

    def read(self, cols: dict[str, np.ndarray], local: int) -> np.ndarray:
        offsets = cols[self.col("offsets")]
        return np.array(cols[self.col("values")][offsets[local]:offsets[local + 1]])


def check_offsets(offsets: np.ndarray, total: int, count: int, what: str) -> None:
    if offsets.shape != (count + 1,) or offsets.dtype != np.int64:
        raise FieldError(f"{what}: offsets are {offsets.dtype}{list(offsets.shape)}, expected "
                         f"int64[{count + 1}] (damaged store)")
    if offsets[0] != 0 or offsets[-1] != total or (count and np.any(np.diff(offsets) < 0)):
        raise FieldError(f"{what}: offsets do not describe the values (damaged store)")


class MultiLabel(Ragged):
    """Class indices per record (``0 <= i < num_classes``); read as indices, or multi-hot."""

    kind = "multilabel"

    def __init__(self, name: str, num_classes: int, classes: list[str] | None = None) -> None:
        super().__init__(name, "int64")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise FieldError(f"field {name!r}: num_classes must be a positive integer")
        self.num_classes = num_classes
        self.classes = list(classes) if classes is not None else None
        if self.classes is not None and len(self.classes) != num_classes:
            raise FieldError(f"field {name!r}: {len(self.classes)} class names for "
                             f"num_classes={num_classes}")

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_classes": self.num_classes}
        if self.classes is not None:
            out["classes"] = self.classes
        return out

    def check(self, value: Any, ctx: dict[str, Any]) -> np.ndarray:
        if self.classes is not None and isinstance(value, (list, tuple)) and value \
                and all(isinstance(v, str) for v in value):
            index = {c: i for i, c in enumerate(self.classes)}
            unknown = [v for v in value if v not in index]
            if unknown:
                raise FieldError(f"field {self.name!r}: unknown class {unknown[0]!r}")
            value = [index[v] for v in value]
        arr = super().check(value, ctx)
        if len(arr) and (arr.min() < 0 or arr.max() >= self.num_classes):
            raise FieldError(f"field {self.name!r}: class index outside 0..{self.num_classes - 1}")
        return arr


class Boxes(Ragged):
    """N x 4 boxes, given in ``format`` (XYXY, XYWH, CXCYWH), ``normalized`` (0..1 of the image)
    or in pixels; stored as XYXY float32 pixels of the stored image, validated to lie inside it."""

    kind = "boxes"
    geometric = True

    def __init__(self, name: str, format: str = "XYXY", normalized: bool = False,
                 max_rows: int = MAX_ROWS) -> None:
        super().__init__(name, "float32", (4,), max_rows)
        fmt = str(format).upper()
        if fmt not in BOX_FORMATS:
            raise FieldError(f"field {name!r}: format must be one of {', '.join(BOX_FORMATS)}, "
                             f"got {format!r}")
        self.format, self.normalized = fmt, bool(normalized)

    def params(self) -> dict[str, Any]:
        return {"format": self.format, "normalized": self.normalized}

    def check(self, value: Any, ctx: dict[str, Any]) -> np.ndarray:
        boxes = super().check(value, ctx)
        h, w = ctx["height"], ctx["width"]
        if self.format == "XYWH":  # torchvision's conversion: x2 = x + w in float32
            x, y, bw, bh = boxes.T
            boxes = np.stack([x, y, x + bw, y + bh], axis=1)
        elif self.format == "CXCYWH":
            cx, cy, bw, bh = boxes.T
            half_w, half_h = bw / np.float32(2), bh / np.float32(2)
            boxes = np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], axis=1)
        if self.normalized:
            boxes = boxes * np.array([w, h, w, h], dtype=np.float32)
        boxes = np.ascontiguousarray(boxes, dtype=np.float32)
        check_boxes(boxes, h, w, self.name)
        return boxes


def check_boxes(boxes: np.ndarray, height: int, width: int, name: str) -> None:
    """XYXY pixel boxes: finite, x1 <= x2, y1 <= y2, inside a ``width`` x ``height`` image."""
    if not len(boxes):
        return
    if not np.all(np.isfinite(boxes)):
        raise FieldError(f"field {name!r}: box coordinates must be finite")
    x1, y1, x2, y2 = boxes.T
    bad = np.flatnonzero((x1 > x2) | (y1 > y2))
    if len(bad):
        raise FieldError(f"field {name!r}: box {bad[0]} has x1 > x2 or y1 > y2 "
                         f"({boxes[bad[0]].tolist()})")
    # Up to float32 rounding of the image size: a box on the border scaled with the image
    # (``x2 = W * (w / W)`` in float32) may land a few ulps past it.
    slack_x, slack_y = width * 2.0 ** -20 + 1e-3, height * 2.0 ** -20 + 1e-3
    bad = np.flatnonzero((x1 < -slack_x) | (y1 < -slack_y) | (x2 > width + slack_x)
                         | (y2 > height + slack_y))
    if len(bad):
        raise FieldError(f"field {name!r}: box {bad[0]} {boxes[bad[0]].tolist()} lies outside "
                         f"the {width}x{height} image")


class PerBox(Ragged):
    """One value per box of the boxes field ``of`` (labels, iscrowd, area, scores)."""

    kind = "perbox"

    def __init__(self, name: str, dtype: str = "int64", of: str = "boxes",
                 inner: tuple[int, ...] | list[int] = ()) -> None:
        super().__init__(name, dtype, inner)
        self.of = of

    def params(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "of": self.of, "inner": list(self.inner)}

    def check(self, value: Any, ctx: dict[str, Any]) -> np.ndarray:
        arr = super().check(value, ctx)
        boxes = ctx["values"].get(self.of)
        if boxes is None:
            raise FieldError(f"field {self.name!r}: per-box field of {self.of!r}, which this "
                             "record lacks")
        if len(arr) != len(boxes):
            raise FieldError(f"field {self.name!r}: {len(arr)} values for {len(boxes)} boxes "
                             f"in {self.of!r}")
        return arr


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


class Masks(Blob):
    """Instance masks: one H x W binary mask per box of ``of``, at the stored image's size.
    Stored lossless: the bit planes, zlib-compressed. Read as uint8 (N, H, W) of 0/1."""

    kind = "masks"
    geometric = True

    def __init__(self, name: str, of: str = "boxes", max_bytes: int = MAX_BYTES) -> None:
        super().__init__(name, max_bytes)
        self.of = of

    def params(self) -> dict[str, Any]:
        return {"of": self.of, **super().params()}

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


class SemanticMask(Blob):
    """A label map the size of the stored image (H x W, ``dtype``), stored zlib-compressed."""

    kind = "semantic"
    geometric = True

    def __init__(self, name: str, dtype: str = "uint8", max_bytes: int = MAX_BYTES) -> None:
        super().__init__(name, max_bytes)
        self.dtype = _dtype(dtype, name)
        if self.dtype not in ("uint8", "int32", "int64", "uint16", "int16"):
            raise FieldError(f"field {name!r}: a semantic mask holds integer labels")

    def params(self) -> dict[str, Any]:
        return {"dtype": self.dtype, **super().params()}

    def encode(self, value: Any, ctx: dict[str, Any]) -> bytes:
        arr = _as_array(value, self.dtype, self.name)
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


#: THE registry of field kinds: name -> class (the schema file's ``kind`` values).
KINDS: dict[str, type[Field]] = {cls.kind: cls for cls in (
    Int, Float, Bool, Array, Ragged, MultiLabel, Boxes, PerBox, Masks, SemanticMask, Text, Json,
    Bytes)}
