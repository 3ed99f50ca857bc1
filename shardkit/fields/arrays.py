"""Numeric field kinds: scalars and fixed-shape arrays (one index array), ragged arrays,
multi-label indices, boxes and per-box values (values + offsets)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import BOX_FORMATS, DTYPES, MAX_ROWS, Field, FieldError, as_array, check_dtype

# -- fixed-size fields ------------------------------------------------------------------------

class Fixed(Field):
    """One value of a fixed shape per record: a column of shape ``(count, *shape)``."""

    dtype: str = "int64"
    shape: tuple[int, ...] = ()

    def check(self, value: Any, ctx: dict[str, Any]) -> np.ndarray:
        arr = as_array(value, self.dtype, self.name)
        if arr.shape != self.shape:
            raise FieldError(f"field {self.name!r}: shape {list(arr.shape)}, declared "
                             f"{list(self.shape)}")
        return arr

    def column_names(self) -> tuple[str, ...]:
        return (self.col(),)

    def null_value(self) -> np.ndarray:
        return np.zeros(self.shape, DTYPES[self.dtype])

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
        self.dtype = check_dtype(dtype, name)
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
    absent_is_empty = True

    def __init__(self, name: str, dtype: str = "float32", inner: tuple[int, ...] | list[int] = (),
                 max_rows: int = MAX_ROWS) -> None:
        super().__init__(name)
        self.dtype = check_dtype(dtype, name)
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
        arr = as_array(value, self.dtype, self.name)
        if arr.size == 0:
            arr = arr.reshape((0, *self.inner))
        if arr.ndim != 1 + len(self.inner) or arr.shape[1:] != self.inner:
            raise FieldError(f"field {self.name!r}: shape {list(arr.shape)}, expected "
                             f"[n, {', '.join(map(str, self.inner))}]".replace(", ]", "]"))
        if len(arr) > self.max_rows:
            raise FieldError(f"field {self.name!r}: {len(arr)} rows, more than the "
                             f"{self.max_rows} allowed (max_rows)")
        return arr

    def absent(self, ctx: dict[str, Any]) -> np.ndarray:
        return np.zeros((0, *self.inner), DTYPES[self.dtype])

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
