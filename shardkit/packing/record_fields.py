"""The interface of a source's typed fields (:mod:`shardkit.fields`): what the plan, the size
estimate and the writer ask of them. Below the sources and the field readers they use (the COCO
file, a metadata table, a container's members), so each implements it without importing the
source registry."""

from __future__ import annotations

from typing import Any


class RecordFields:
    """The typed fields of a source's records (:mod:`shardkit.fields`), as the plan uses them:
    ``schema``, what the store's metadata records (:meth:`meta`), what makes the plan differ
    (:meth:`plan_key`, for ``resume``), and one record's values on its stored pixels."""

    schema: Any = None

    def plan_key(self) -> str:
        raise NotImplementedError

    def meta(self) -> dict[str, Any]:
        return {}

    def fields(self, path: str, height: int, width: int) -> dict[str, Any]:
        """The values of the record of ``path`` stored at ``height`` x ``width`` (FieldError:
        the reason it is skipped)."""
        raise NotImplementedError

    def fields_at(self, index: int, path: str, height: int, width: int) -> dict[str, Any]:
        """The values of source ``index`` (its position in the scan's samples), at ``path``;
        a source whose records may share a path (COCO) tells them apart here."""
        return self.fields(path, height, width)

    def record_at(self, index: int, path: str, result: Any) -> dict[str, Any]:
        """The values of source ``index`` for its encoded record ``result`` (an
        :class:`.encoding.Encoded`: its stored size, and where a bucketed pack placed it)."""
        return self.fields_at(index, path, result.height, result.width)


__all__ = ["RecordFields"]
