"""WebDataset tars: per record ``KEY.jpg`` (the JPEG record byte for byte; ``KEY.png`` for
raw records) and ``KEY.cls`` (the label as decimal text), plus one member per typed field:
``KEY.NAME.txt`` (text, numbers), ``KEY.NAME.json``, ``KEY.NAME.npy`` (arrays, saved without
pickle), ``KEY.NAME.bin`` (bytes). KEY is the record index, nine digits. A ``classes.json``
(the class names in label order) goes beside the tars, where ``shardkit pack`` finds it.

Tar headers are fixed (mtime 0, owner 0, mode 0644), so the same store gives the same bytes.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from typing import Any

import numpy as np

from ..fileutil import replace_atomic
from .base import Exporter, Record, as_png


def field_member(kind: str, value: Any) -> tuple[str, bytes]:
    """(suffix, bytes) of one typed field value."""
    if kind == "text":
        return "txt", str(value).encode("utf-8")
    if kind == "json":
        return "json", json.dumps(value, sort_keys=True).encode("utf-8")
    if kind == "bytes":
        return "bin", bytes(value)
    if kind in ("int", "float", "bool"):
        return "txt", str(value.item() if isinstance(value, np.generic) else value).encode()
    out = io.BytesIO()
    np.save(out, np.asarray(value), allow_pickle=False)
    return "npy", out.getvalue()


class WebDatasetExporter(Exporter):
    summary = "WebDataset tars of KEY.jpg + KEY.cls (+ fields as txt/json/npy)"

    def open_file(self, file) -> None:
        self.tar = tarfile.open(fileobj=file, mode="w", format=tarfile.USTAR_FORMAT)

    def _member(self, name: str, data: bytes) -> int:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        self.tar.addfile(info, io.BytesIO(data))
        return 512 + -(-len(data) // 512) * 512

    def add(self, record: Record) -> int:
        key = f"{record.index:09d}"
        if record.encoding == "jpeg":
            size = self._member(f"{key}.jpg", record.data)
        else:
            size = self._member(f"{key}.png", as_png(record))
        size += self._member(f"{key}.cls", str(record.label).encode())
        for name, value in record.fields.items():
            if value is None:  # an optional field this record lacks: no member
                continue
            suffix, data = field_member(self.schema[name].kind, value)
            size += self._member(f"{key}.{name}.{suffix}", data)
        return size

    def close_file(self) -> None:
        self.tar.close()

    def finish(self, result) -> None:
        folder = os.path.dirname(os.path.abspath(self.pattern % 0))
        replace_atomic(os.path.join(folder, "classes.json"),
                       json.dumps(self.classes, ensure_ascii=False).encode("utf-8"))
