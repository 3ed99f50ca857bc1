"""Typed per-record fields beyond the class label: boxes, masks, multi-label, captions, JSON,
arrays. The public API (stable; the sources and packers build on it):

- the kinds (``KINDS`` is the one registry of their names): :class:`Int`, :class:`Float`,
  :class:`Bool`, :class:`Array`, :class:`Ragged`, :class:`MultiLabel`, :class:`Boxes`,
  :class:`PerBox`, :class:`Masks`, :class:`SemanticMask`, :class:`Text`, :class:`Json`,
  :class:`Bytes`;
- :class:`Schema` (Python list, ``Schema.load(file)``, ``Schema.infer(records)``) and
  ``schema.validate(record_fields, height, width)``;
- :class:`FieldError` for a bad value or declaration;
- ``StoreWriter(..., schema=...).add(pixels, label, **fields)`` writes them,
  ``ShardDataset(path, fields=[...])`` reads them.
"""

import os

from .columns import ColumnBuilder, ShardFields, check_meta, describe
from .kinds import (BOX_FORMATS, DTYPES, KINDS, Array, Bool, Boxes, Bytes, Field, FieldError,
                    Float, Int, Json, Masks, MultiLabel, PerBox, Ragged, SemanticMask, Text)
from .schema import Schema


def as_schema(schema: "Schema | list | str | os.PathLike") -> Schema:
    """A :class:`Schema` from a Schema, a list of field kinds (or of their JSON objects), or the
    path of a schema JSON file."""
    if isinstance(schema, Schema):
        return schema
    if isinstance(schema, (str, os.PathLike)):
        return Schema.load(schema)
    if isinstance(schema, (list, tuple)) and all(isinstance(f, dict) for f in schema):
        return Schema.from_json(list(schema))
    if isinstance(schema, (list, tuple)):
        return Schema(schema)
    raise FieldError(f"`schema` must be a Schema, a list of fields or a schema file, got "
                     f"{type(schema).__name__}")


def builder(schema: "Schema | list | str | os.PathLike") -> "ColumnBuilder":
    """The per-store collector of field values a writer fills (see :mod:`.columns`)."""
    return ColumnBuilder(as_schema(schema))

__all__ = ["BOX_FORMATS", "DTYPES", "KINDS", "Array", "Bool", "Boxes", "Bytes", "Field",
           "FieldError", "Float", "Int", "Json", "Masks", "MultiLabel", "PerBox", "Ragged",
           "Schema", "SemanticMask", "ShardFields", "Text", "as_schema", "builder", "check_meta",
           "describe"]
