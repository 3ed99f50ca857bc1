"""Typed fields from a container source, through the fields API (:mod:`shardkit.fields`):
WebDataset ``txt``/``json``/``npy`` members, parquet columns beside the image and the label,
MDS ``int``/``float``/``str``/``json``/``ndarray`` columns. The values are read by the scan
(they are small: a caption, a JSON object, an array of boxes), the schema is inferred from
every sample's values (a field some samples lack is optional), and :class:`ContainerFields`
hands each record its values (:class:`RecordFields`, the interface every source's fields share).
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import numpy as np

from ...errors import PackError
from ...fields import FieldError, Schema
from ..record_fields import RecordFields

FIELD_BYTES = 1 << 20  # a member or value larger than this is not a field (it is skipped)
WDS_FIELD_SUFFIXES = ("txt", "json", "npy")


class FieldRejected(Exception):
    """A value cannot be a field; the message is the reason."""


class ContainerFields(RecordFields):
    """Per-sample field values of a container source (keyed by the sample's path)."""

    def __init__(self, rows: dict[str, dict[str, Any]], where: str, count: int = 0) -> None:
        self.rows = rows
        try:
            # A field some of the ``count`` samples lack is optional (absent: null or empty),
            # never a filter: samples without it are packed all the same.
            self.schema = Schema.infer([*rows.values(), *([{}] if count > len(rows) else [])])
        except FieldError as exc:
            raise PackError(f"{where}: fields: {exc}") from None
        digest = hashlib.sha256(json.dumps(self.schema.as_json(), sort_keys=True).encode())
        for path, row in rows.items():
            digest.update(path.encode("utf-8", "surrogateescape"))
            for name in sorted(row):
                value = row[name]
                digest.update(name.encode() + (value.tobytes() + str(value.shape).encode()
                                               if isinstance(value, np.ndarray)
                                               else json.dumps(value, sort_keys=True).encode()))
        self.sha256 = digest.hexdigest()

    def plan_key(self) -> str:
        return f"container-fields:{self.sha256}"

    def meta(self) -> dict[str, Any]:
        return {}

    def fields(self, path: str, height: int, width: int) -> dict[str, Any]:
        return dict(self.rows.get(path, {}))


def wds_field(suffix: str) -> str | None:
    """The field a WebDataset member suffix names (``caption.txt`` -> caption, ``json`` ->
    json), or None when the member is not a field."""
    ext = suffix.rsplit(".", 1)[-1]
    if ext not in WDS_FIELD_SUFFIXES:
        return None
    return suffix.rsplit(".", 1)[0] if "." in suffix else suffix


def decode_member(suffix: str, data: bytes) -> Any:
    """A ``txt``/``json``/``npy`` member's value (FieldRejected with the reason)."""
    ext = suffix.rsplit(".", 1)[-1]
    try:
        if ext == "txt":
            return data.decode("utf-8")
        if ext == "json":
            return json.loads(data)
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except UnicodeDecodeError:
        raise FieldRejected("not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:  # an object .npy is refused here, never loaded
        raise FieldRejected(f"not a plain {ext} value ({exc})") from None
    except OSError as exc:
        raise FieldRejected(f"not a .npy array ({exc})") from None
    return array


# MDS encodings (streaming/base/format/mds/encodings.py, restated from its documented layout)
_MDS_SCALARS = {"int": "<i8", "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
                "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
                "float16": "<f2", "float32": "<f4", "float64": "<f8"}
_NDARRAY_SHAPE = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}
_NDARRAY_VALUE = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16",
                  32: "uint32", 33: "int32", 34: "float32", 64: "uint64", 65: "int64",
                  66: "float64"}
MDS_FIELD_ENCODINGS = (*_MDS_SCALARS, "str", "str_int", "str_float", "json", "ndarray")


def is_mds_field(encoding: str) -> bool:
    return encoding.split(":", 1)[0] in MDS_FIELD_ENCODINGS


def decode_mds(encoding: str, raw: bytes) -> Any:
    """One MDS column value (FieldRejected with the reason)."""
    base, _, args = encoding.partition(":")
    try:
        if base in _MDS_SCALARS:
            value = np.frombuffer(raw, _MDS_SCALARS[base])[0]
            return value.item()
        if base == "str":
            return raw.decode("utf-8")
        if base == "str_int":
            return int(raw.decode("utf-8"))
        if base == "str_float":
            return float(raw.decode("utf-8"))
        if base == "json":
            return json.loads(raw)
        if base == "ndarray":
            return _ndarray(args, raw)
    except (ValueError, IndexError, UnicodeDecodeError, RecursionError) as exc:
        raise FieldRejected(f"not a valid {encoding} value ({exc})") from None
    raise FieldRejected(f"{encoding} columns are not fields")


def _ndarray(args: str, raw: bytes) -> np.ndarray:
    parts = args.split(":") if args else []
    dtype = parts[0] if parts else None
    shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 else None
    i = 0
    if dtype is None:
        dtype, i = _NDARRAY_VALUE[raw[0]], 1
    if shape is None:
        ndim, shape_code = raw[i] >> 2, raw[i] & 3
        size = np.dtype(_NDARRAY_SHAPE[shape_code]).itemsize
        shape = tuple(np.frombuffer(raw[i + 1:i + 1 + ndim * size],
                                    _NDARRAY_SHAPE[shape_code]).tolist())
        i += 1 + ndim * size
    values = np.frombuffer(raw[i:], np.dtype(dtype).newbyteorder("<"))
    if values.size != int(np.prod(shape)):
        raise ValueError(f"{values.size} values for shape {shape}")
    return values.reshape(shape).copy()
