"""Hugging Face parquet: an ``image`` column of the ``Image`` feature's struct ``{bytes, path}``
(JPEG records byte for byte, raw records as lossless PNG; ``path`` the source path the store
recorded), a ``label`` column of ``ClassLabel(names=classes)``, and one column per typed field
(text and JSON as strings, numbers, bytes, arrays as nested lists). The features go in the
schema metadata key ``huggingface``, as ``datasets`` writes them, so
``datasets.load_dataset("parquet", data_files=...)`` gives images and named classes back.
Written with pyarrow (the ``parquet`` extra), in row groups of ``ROW_GROUP`` rows.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import ShardkitError
from .base import Exporter, Record, as_png

ROW_GROUP = 256  # rows per row group (datasets itself writes image tables in groups of 100s)


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ShardkitError("export to parquet needs pyarrow: pip install 'shardkit[parquet]'"
                            ) from None
    return pa, pq


def _column_value(kind: str, value: Any) -> Any:
    if value is None:  # an optional field this record lacks: null
        return None
    if kind == "json":
        return json.dumps(value, sort_keys=True)
    if kind == "bytes":
        return bytes(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


class ParquetExporter(Exporter):
    summary = "Hugging Face parquet: image struct {bytes, path} + ClassLabel (+ fields)"

    def open_file(self, file) -> None:
        pa, pq = _pyarrow()
        self.pa, self.pq, self.file = pa, pq, file
        self.writer = None
        self.rows: dict[str, list[Any]] = {}

    def _schema(self) -> Any:
        pa = self.pa
        image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        fields = [pa.field("image", image), pa.field("label", pa.int64())]
        features: dict[str, Any] = {"image": {"_type": "Image"},
                                    "label": {"names": self.classes, "_type": "ClassLabel"}}
        for name in self.field_names():
            if self.schema[name].kind in ("text", "json"):
                fields.append(pa.field(name, pa.string()))
                features[name] = {"dtype": "string", "_type": "Value"}
            else:  # type from the values of the first row group
                fields.append(pa.field(name, pa.array(self.rows[name]).type))
        meta = {"huggingface": json.dumps({"info": {"features": features}})}
        return pa.schema(fields, metadata=meta)

    def field_names(self) -> list[str]:
        return [f.name for f in self.schema] if self.schema is not None else []

    def add(self, record: Record) -> int:
        data = record.data if record.encoding == "jpeg" else as_png(record)
        self.rows.setdefault("image", []).append({"bytes": data, "path": record.source})
        self.rows.setdefault("label", []).append(record.label)
        for name in self.field_names():
            self.rows.setdefault(name, []).append(
                _column_value(self.schema[name].kind, record.fields[name]))
        if len(self.rows["label"]) >= ROW_GROUP:
            self._flush()
        return len(data) + 16

    def _flush(self) -> None:
        if not self.rows.get("label"):
            return
        if self.writer is None:
            self.arrow_schema = self._schema()
            self.writer = self.pq.ParquetWriter(self.file, self.arrow_schema)
        table = self.pa.table({f.name: self.pa.array(self.rows[f.name], type=f.type)
                               for f in self.arrow_schema}, schema=self.arrow_schema)
        self.writer.write_table(table, row_group_size=ROW_GROUP)
        self.rows = {}

    def close_file(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()
