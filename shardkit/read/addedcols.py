"""Reading fields added after a store was packed (:mod:`shardkit.fields.added`): their columns
memory-mapped once per process, and an open shard's fields seen with them, so every reader of
fields (``fields=[...]``, targets, clips) takes an added field as it takes a packed one."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import StoreError
from ..fields import ShardFields, added


class AddedColumns:
    """A store version's added fields over its first ``rows`` records (physical order)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.entries = added.entries(store.meta)
        self.schema = added.schema_of(store.meta)
        self._open: tuple[int, dict[str, ShardFields]] | None = None

    def __bool__(self) -> bool:
        return bool(self.entries)

    def _fields(self) -> dict[str, ShardFields]:
        """Field name -> its columns as a ``ShardFields`` over its rows, mapped in this process."""
        if self._open is None or self._open[0] != os.getpid():
            out = {}
            for f, entry in zip(self.schema, self.entries):
                cols = {name: self.store.side_array(info["file"], info["sha256"])
                        for name, info in entry["columns"].items()}
                rows = entry["rows"]
                none = np.zeros(rows, np.int32)  # no kind that may be added reads them
                out[f.name] = ShardFields(type(self.schema)([f]), cols, none, none,
                                          f"{self.store.path}: added field {f.name!r}")
            self._open = (os.getpid(), out)
        return self._open[1]

    def rows(self, name: str) -> int:
        return len(self._fields()[name].heights)

    def columns(self, name: str, place: int) -> ShardFields:
        """The columns of added field ``name``, after checking it covers physical ``place``."""
        fields = self._fields()[name]
        rows = len(fields.heights)
        if place >= rows:
            raise StoreError(f"{self.store.path}: field {name!r} was added for the first {rows} "
                             "records and this one was packed after: add the field again "
                             "(shardkit.add_field computes only the missing records)")
        return fields

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": None}


class WithAdded:
    """An open shard's fields (``inner``, None for a shard without) and the store's added
    fields, for the shard whose first record is physical place ``start``."""

    def __init__(self, inner: ShardFields | None, cols: AddedColumns, start: int) -> None:
        self.inner, self.cols, self.start = inner, cols, start
        packed = list(inner.schema) if inner is not None else []
        self.schema = type(cols.schema)(packed + list(cols.schema))

    def value(self, name: str, local: int) -> Any:
        if name in self.cols.schema:
            place = self.start + local
            return self.cols.columns(name, place).value(name, place)
        return self.inner.value(name, local)

    def gather(self, name: str, locals_: np.ndarray) -> list[np.ndarray]:
        if name in self.cols.schema:
            places = np.asarray(locals_) + self.start
            return self.cols.columns(name, int(places.max(initial=0))).gather(name, places)
        return self.inner.gather(name, locals_)

    def verify(self, local: int) -> None:
        if self.inner is not None:
            self.inner.verify(local)
        for f in self.cols.schema:
            if self.start + local < self.cols.rows(f.name):
                self.value(f.name, local)
