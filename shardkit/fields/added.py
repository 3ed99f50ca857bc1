"""Fields added to a folder store after it was packed (``shardkit.add_field``): declared in the
version's manifest, their columns in ``.npy`` files beside the shards, no shard rewritten.

The manifest's ``added_fields`` is a list of ``{"field": <declaration>, "rows": R, "columns":
{column: {"file", "sha256"}}}``: each column holds the values of the store's first ``R``
records in the shards' physical order (the order the shards hold them in, over every shard), as
a shard's own column of that field would. Records packed later (``append``) lie beyond ``R``
until the field is added again, which computes only them; a read of one is an error naming the
field, never a made-up value. Kinds stored in side records (masks) cannot be added.
"""

from __future__ import annotations

from typing import Any

from ..errors import StoreError
from .kinds import FieldError
from .schema import Schema

KEY = "added_fields"


def entries(meta: dict[str, Any]) -> list[dict[str, Any]]:
    return meta.get(KEY) or []


def schema_of(meta: dict[str, Any]) -> Schema:
    """The added fields' declarations (an empty schema for a store with none)."""
    return Schema.from_json([e["field"] for e in entries(meta)])


def files(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Every added column's file entry (``file``, ``sha256``)."""
    return [c for e in entries(meta) for c in e["columns"].values()]


def check(meta: dict[str, Any], where: str) -> None:
    """The manifest's added fields: declarations that parse, names apart from the shards'
    fields, exactly each field's columns, plain file names, a row count within the store."""
    raw = meta.get(KEY)
    if raw is None:
        return
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise StoreError(f"{where}: {KEY} is not a list of objects")
    try:
        schema = Schema.from_json([e.get("field") for e in raw], where)
    except FieldError as exc:
        raise StoreError(f"{where}: added field declarations are invalid: {exc}") from None
    packed = set(Schema.from_json(meta["fields"], where).names) if meta.get("fields") else set()
    for f, entry in zip(schema, raw):
        if f.name in packed or f.name == "label":
            raise StoreError(f"{where}: added field {f.name!r} is also a packed field")
        if getattr(f, "side", False):
            raise StoreError(f"{where}: added field {f.name!r} is a side-record kind")
        rows, columns = entry.get("rows"), entry.get("columns")
        if not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= meta["count"]:
            raise StoreError(f"{where}: added field {f.name!r} has a bad row count {rows!r}")
        if not isinstance(columns, dict) or set(columns) != set(f.stored_columns()):
            raise StoreError(f"{where}: added field {f.name!r} does not list its columns "
                             f"{sorted(f.stored_columns())}")
        for info in columns.values():
            name = info.get("file") if isinstance(info, dict) else None
            if not isinstance(name, str) or not isinstance(info.get("sha256"), str) or \
                    "/" in name or "\\" in name or name in ("", ".", ".."):
                raise StoreError(f"{where}: added field {f.name!r} names a bad column file")


__all__ = ["KEY", "check", "entries", "files", "schema_of"]
