"""The base of every field kind (:class:`Field`), the dtypes a column may have, and the
checks the kinds share. The kinds themselves: :mod:`.arrays` (numbers, arrays, boxes) and
:mod:`.records` (byte records: masks, text, JSON, bytes); the registry: :mod:`.kinds`."""

from __future__ import annotations

import re
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


def check_dtype(value: Any, name: str) -> str:
    if value not in DTYPES:
        raise FieldError(f"field {name!r}: dtype must be one of {', '.join(DTYPES)}, "
                         f"got {value!r}")
    return value


def as_array(value: Any, dtype: str, name: str) -> np.ndarray:
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
    #: Stored as side records beside the image record (:class:`.records.SideBlob`), not in
    #: the index.
    side: ClassVar[bool] = False
    #: Kinds whose absent value is "no rows" (ragged arrays, boxes, masks): an absent optional
    #: value is stored empty. Other kinds store it as null (a ``present`` column, read as None).
    absent_is_empty: ClassVar[bool] = False
    #: May a record lack this field (``"optional": true`` in the schema; ``Schema.infer`` sets
    #: it for a field some records lack)? Absent reads back empty or None, as above.
    optional: bool = False

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in RESERVED:
            raise FieldError(f"field name must be an identifier (letters, digits, _) and not "
                             f"one of {sorted(RESERVED)}, got {name!r}")
        self.name = name

    # -- declaration --------------------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        return {}

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, **self.params(),
                **({"optional": True} if self.optional else {})}

    @property
    def nullable(self) -> bool:
        """Whether an absent value is stored as null (a ``present`` column), not as empty."""
        return self.optional and not self.absent_is_empty

    def absent(self, ctx: dict[str, Any]) -> Any:
        """The value an absent optional field is checked and stored as (None: null)."""
        return None

    def null_value(self) -> Any:
        """What a null record holds in this field's columns (never read: ``present`` is 0)."""
        raise NotImplementedError

    def stored_columns(self) -> tuple[str, ...]:
        """Every index column of this field: its kind's, and ``present`` when nullable."""
        return self.column_names() + ((self.col("present"),) if self.nullable else ())

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
