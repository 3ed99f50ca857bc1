"""A store's declared fields (:class:`Schema`): built in Python, loaded from a JSON schema file,
or inferred from example values; stored in the metadata as plain JSON.

::

    schema = Schema([Boxes("boxes", format="XYWH"), PerBox("labels"), Text("caption")])
    schema = Schema.load("schema.json")   # [{"name": "boxes", "kind": "boxes", ...}, ...]
    values = schema.validate({"boxes": [[1, 2, 3, 4]], ...}, height=256, width=341)
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Iterator

import numpy as np

from .kinds import (KINDS, MAX_BYTES, Array, Blob, Bool, Field, FieldError, Float, Int, Json,
                    Ragged, Text)

MAX_SCHEMA_BYTES = 1 << 20


class Schema:
    """An ordered set of uniquely named fields."""

    def __init__(self, fields: Iterable[Field] = ()) -> None:
        self.fields: list[Field] = []
        for f in fields:
            if not isinstance(f, Field):
                raise FieldError(f"schema entries must be shardkit.fields kinds, got {f!r}")
            if f.name in self:
                raise FieldError(f"field {f.name!r} is declared twice")
            self.fields.append(f)
        # Boxes are checked before the fields that refer to them (per-box values, masks).
        self._order = sorted(self.fields, key=lambda f: 0 if f.kind == "boxes" else 1)

    # -- container ----------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return any(f.name == name for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def __iter__(self) -> Iterator[Field]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.as_json() == other.as_json()

    def __repr__(self) -> str:
        return f"Schema({self.fields!r})"

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    # -- JSON ---------------------------------------------------------------------------------

    def as_json(self) -> list[dict[str, Any]]:
        return [f.as_json() for f in self.fields]

    @classmethod
    def from_json(cls, obj: Any, where: str = "schema") -> Schema:
        """A schema from its JSON form: a list of ``{"name", "kind", ...parameters}``."""
        if isinstance(obj, dict) and "fields" in obj:
            obj = obj["fields"]
        if not isinstance(obj, list):
            raise FieldError(f"{where}: a schema is a list of field objects")
        fields = []
        for n, entry in enumerate(obj):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise FieldError(f"{where}: entry {n} is not an object with a 'name'")
            kind = entry.get("kind")
            cls_ = KINDS.get(kind) if isinstance(kind, str) else None
            if cls_ is None:
                raise FieldError(f"{where}: field {entry['name']!r} has unknown kind {kind!r}; "
                                 f"expected one of {', '.join(KINDS)}")
            params = {k: v for k, v in entry.items() if k not in ("name", "kind", "optional")}
            optional = entry.get("optional", False)
            if not isinstance(optional, bool):
                raise FieldError(f"{where}: field {entry['name']!r}: optional must be true or "
                                 f"false, got {optional!r}")
            try:
                fields.append(cls_(entry["name"], **params))
            except TypeError as exc:
                raise FieldError(f"{where}: field {entry['name']!r}: {exc}") from None
            fields[-1].optional = optional
        schema = cls(fields)
        schema.check_references(where)
        return schema

    @classmethod
    def load(cls, path: str | os.PathLike) -> Schema:
        """A schema file: JSON, a list of field objects (or ``{"fields": [...]}``)."""
        path = os.fspath(path)
        try:
            if os.path.getsize(path) > MAX_SCHEMA_BYTES:
                raise FieldError(f"{path}: schema file is larger than {MAX_SCHEMA_BYTES} bytes")
            with open(path, "rb") as f:
                obj = json.loads(f.read())
        except FileNotFoundError:
            raise FieldError(f"schema file not found: {path}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise FieldError(f"{path}: schema is not valid JSON ({exc})") from None
        except OSError as exc:
            raise FieldError(f"cannot read schema file {path}: {exc.strerror}") from None
        return cls.from_json(obj, path)

    def check_references(self, where: str = "schema") -> None:
        for f in self.fields:
            of = getattr(f, "of", None)
            if of is not None and (of not in self or self[of].kind != "boxes"):
                raise FieldError(f"{where}: field {f.name!r} refers to boxes field {of!r}, "
                                 "which is not declared")

    # -- values -------------------------------------------------------------------------------

    def validate(self, record: dict[str, Any], height: int, width: int) -> dict[str, Any]:
        """One record's field values checked and normalised (the stored dtypes and layout);
        ``height`` x ``width`` is the stored image's size. Raises :class:`FieldError`."""
        unknown = [k for k in record if k not in self]
        if unknown:
            raise FieldError(f"field {unknown[0]!r} is not in the schema "
                             f"({', '.join(self.names) or 'no fields'})")
        missing = [f.name for f in self.fields if f.name not in record and not f.optional]
        if missing:
            raise FieldError(f"field {missing[0]!r} is missing from the record")
        ctx: dict[str, Any] = {"height": int(height), "width": int(width), "values": {}}
        for f in self._order:
            # An optional field absent (or None): empty for ragged kinds, else None (null).
            value = record.get(f.name)
            if value is None and f.optional:
                value = f.absent(ctx)
                if value is None:
                    ctx["values"][f.name] = None
                    continue
            ctx["values"][f.name] = f.check(value, ctx)
        return {f.name: ctx["values"][f.name] for f in self.fields}

    @classmethod
    def infer(cls, records: Iterable[dict[str, Any]]) -> Schema:
        """Kinds from example values: bool, int, float, str (text), dict/list of non-numbers
        (JSON), bytes, numeric arrays (fixed shape if every example agrees, else ragged).
        A field that some records lack (or hold as None) is ``optional``."""
        seen: dict[str, list[Any]] = {}
        count = 0
        for record in records:
            count += 1
            for key, value in record.items():
                values = seen.setdefault(key, [])
                if value is not None:
                    values.append(value)
        fields = []
        for name, values in seen.items():
            f = _infer_one(name, values) if values else Json(name)
            f.optional = len(values) < count
            fields.append(f)
        return cls(fields)

    def describe(self) -> str:
        """One line per field, as ``info`` and an inferred pack print it."""
        return "\n".join(f"  {f.name}: {f.kind}" + "".join(f" {k}={v}" for k, v in f.params().items())
                         + (" optional" if f.optional else "") for f in self.fields)


def _infer_one(name: str, values: list[Any]) -> Field:
    if all(isinstance(v, bool) for v in values):
        return Bool(name)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return Int(name)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return Float(name)
    if all(isinstance(v, str) for v in values):
        return Text(name)
    if all(isinstance(v, (bytes, bytearray)) for v in values):
        return Blob(name)
    arrays = []
    for v in values:
        try:
            arr = np.asarray(v)
        except (ValueError, TypeError):
            return Json(name)
        if arr.dtype.kind not in "iufb" or arr.ndim == 0:
            return Json(name)
        arrays.append(arr)
    dtype = ("float32" if any(a.dtype.kind == "f" for a in arrays) else
             "bool" if all(a.dtype.kind == "b" for a in arrays) else "int64")
    shapes = {a.shape for a in arrays}
    if len(shapes) == 1:
        return Array(name, next(iter(shapes)), dtype)
    inner = {a.shape[1:] for a in arrays}
    if len(inner) == 1:
        return Ragged(name, dtype, next(iter(inner)))
    return Json(name)


__all__ = ["MAX_BYTES", "Schema"]
