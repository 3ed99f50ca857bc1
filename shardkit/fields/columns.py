"""Fields on disk: a writer's per-record values turned into index-array columns (and side
records), the metadata that describes them, and a shard's columns checked and read back.

Columns are ordinary index arrays (``meta["arrays"]``, each with dtype, shape and CRC32, read and
checksummed by the shard reader like the store's own); ``meta["fields"]`` holds the schema.
Masks (:class:`.records.SideBlob` kinds) are side records beside the image record, streamed to
the shard writer as each record is written; their index columns hold each record's length and
CRC32. A store with fields has format version 2; one without is written exactly as before
(version 1).
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from ..errors import StoreError
from .kinds import DISK_DTYPES, Blob, FieldError, SideBlob
from .schema import Schema

FIELDS_KEY = "fields"


class ColumnBuilder:
    """Collects each record's checked field values; ``arrays()`` builds the columns at the end.

    Side-record fields keep only each record's length and CRC32 (12 bytes): their bytes are
    what :meth:`append` returns, for the shard writer to store right away.
    """

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.values: dict[str, Any] = {
            f.name: (array("q"), array("I")) if f.side else [] for f in schema}
        #: per nullable field, whether each record holds a value (its ``present`` column)
        self.present: dict[str, bytearray] = {f.name: bytearray() for f in schema if f.nullable}

    def check(self, record: dict[str, Any], height: int, width: int) -> dict[str, Any]:
        """Validate without keeping (the writer checks before it appends the image)."""
        return self.schema.validate(record, height, width)

    def append(self, checked: dict[str, Any]) -> dict[str, bytes]:
        """Keep one record's checked values; returns its side records (stream -> bytes), which
        the caller stores with the record (``ShardWriter.append_side``)."""
        side: dict[str, bytes] = {}
        for f in self.schema:
            value = checked[f.name]
            if f.nullable:
                self.present[f.name].append(value is not None)
                if value is None:
                    value = f.null_value()
            if f.side:
                side[f.stream()] = value
                nbytes, crc = SideBlob.index(value)
                self.values[f.name][0].append(nbytes)
                self.values[f.name][1].append(crc)
            else:
                self.values[f.name].append(value)
        return side

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for f in self.schema:
            out.update(f.columns(self.values[f.name]))
            if f.nullable:
                out[f.col("present")] = np.frombuffer(bytes(self.present[f.name]), np.bool_)
        return out


def describe(arrays: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Dtype, shape and CRC32 of each column (as ``metadata.describe_arrays`` does for the
    store's own arrays)."""
    from ..metadata import array_crc32

    out = {}
    for name, arr in arrays.items():
        dtype = arr.dtype.str if arr.dtype.itemsize > 1 else "|" + arr.dtype.str[1:]
        out[name] = {"dtype": dtype, "shape": [int(s) for s in arr.shape],
                     "crc32": array_crc32(arr)}
    return out


def check_meta(obj: dict[str, Any], where: str) -> Schema | None:
    """A shard's (or manifest's) field declarations and, for a shard, their column descriptions:
    plain numeric dtypes, sane shapes, a checksum each, exactly the columns the schema needs."""
    raw = obj.get(FIELDS_KEY)
    if raw is None:
        return None
    try:
        schema = Schema.from_json(raw, where)
    except FieldError as exc:
        raise StoreError(f"{where}: field declarations are invalid: {exc}") from None
    arrays = obj.get("arrays")
    if arrays is None:  # a manifest: shards carry the columns
        return schema
    wanted = {c for f in schema for c in f.stored_columns()}
    present = {name for name in arrays if name.startswith("f.")}
    if wanted != present:
        missing = sorted(wanted - present) or sorted(present - wanted)
        raise StoreError(f"{where}: field column {missing[0]!r} is "
                         f"{'missing' if wanted - present else 'not declared'} (damaged store)")
    for name in wanted:
        desc = arrays[name]
        shape = desc.get("shape") if isinstance(desc, dict) else None
        if not isinstance(desc, dict) or desc.get("dtype") not in DISK_DTYPES:
            raise StoreError(f"{where}: field column {name!r} has no plain numeric dtype")
        if not (isinstance(shape, list) and 1 <= len(shape) <= 8 and all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 48
                for s in shape)):
            raise StoreError(f"{where}: field column {name!r} has an invalid shape")
        crc = desc.get("crc32")
        if not isinstance(crc, int) or isinstance(crc, bool):
            raise StoreError(f"{where}: field column {name!r} has no checksum (damaged store)")
    return schema


class ShardFields:
    """One open shard's field columns (views of the shard's memory-mapped index arrays) and,
    through ``reader``, its side records."""

    def __init__(self, schema: Schema, arrays: dict[str, np.ndarray], heights: np.ndarray,
                 widths: np.ndarray, where: str, reader: Any = None) -> None:
        self.schema = schema
        self.cols = {name: arr for name, arr in arrays.items() if name.startswith("f.")}
        self.heights, self.widths = heights, widths
        count = len(heights)
        for f in schema:
            try:
                f.check_columns(self.cols, count, where)
            except FieldError as exc:
                raise StoreError(str(exc)) from None
            present = self.cols.get(f.col("present")) if f.nullable else None
            if f.nullable and (present is None or present.shape != (count,)
                               or present.dtype != np.bool_):
                raise StoreError(f"{where}: field {f.name!r} has no present column of "
                                 f"{count} bools (damaged store)")
        self.where = where
        self.reader = reader  # a shardkit.formats.ShardReader (side records)

    def value(self, name: str, local: int) -> Any:
        """Record ``local``'s value of field ``name``; an absent optional value is None (an
        empty array for ragged kinds, boxes and masks)."""
        f = self.schema[name]
        if f.nullable and not self.cols[f.col("present")][local]:
            return None
        if isinstance(f, Blob):
            ctx = {"height": int(self.heights[local]), "width": int(self.widths[local])}
            try:
                if f.side:
                    return f.decode(self.side_record(f, local), ctx)
                return f.read(self.cols, local, ctx)
            except (FieldError, ValueError, UnicodeDecodeError) as exc:  # zlib.error is one
                raise StoreError(f"{self.where}: record {local}, field {name!r}: {exc}") from None
        return f.read(self.cols, local)

    def side_record(self, f: SideBlob, local: int) -> bytes:
        """Record ``local``'s stored bytes of side-record field ``f``, checked against the
        length and CRC32 in the index (FieldError when they differ)."""
        if self.reader is None:
            raise FieldError("stored in side records, and this shard was opened without them")
        try:
            raw = self.reader.side_record(f.stream(), local)
        except StoreError as exc:  # already names the file: name the record and field instead
            raise FieldError(str(exc).removeprefix(f"{self.reader.path}: ")) from None
        f.check_stored(raw, self.cols, local)
        return raw

    def verify(self, local: int) -> None:
        """``verify``'s check of record ``local``: every field decodes, boxes lie inside the
        stored image, multi-label indices are in range, per-box values and masks match the
        boxes (StoreError naming the record and field)."""
        from .kinds import MultiLabel, check_boxes

        height, width = int(self.heights[local]), int(self.widths[local])
        values = {f.name: self.value(f.name, local) for f in self.schema}
        for f in self.schema:
            value, what = values[f.name], f"{self.where}: record {local}, field {f.name!r}"
            if value is None:  # an absent optional value
                continue
            try:
                if f.kind == "boxes":
                    check_boxes(value, height, width, f.name)
                elif isinstance(f, MultiLabel) and len(value) and (
                        value.min() < 0 or value.max() >= f.num_classes):
                    raise FieldError("class index out of range")
                of = getattr(f, "of", None)
                if of is not None and len(value) != len(values[of]):
                    raise FieldError(f"{len(value)} values for {len(values[of])} boxes")
            except FieldError as exc:
                raise StoreError(f"{what}: {exc} (damaged store)") from None

    def gather(self, name: str, locals_: np.ndarray) -> list[np.ndarray]:
        """Ragged field ``name`` of records ``locals_``: read-only views of the shard's rows."""
        f = self.schema[name]
        values, offsets = self.cols[f.col("values")], self.cols[f.col("offsets")]
        starts, ends = offsets[locals_].tolist(), offsets[locals_ + 1].tolist()
        return [values[a:b] for a, b in zip(starts, ends)]

    def rows(self, name: str, local: int) -> int:
        """How many rows record ``local`` has in ragged field ``name``."""
        offsets = self.cols[self.schema[name].col("offsets")]
        return int(offsets[local + 1] - offsets[local])


__all__ = ["FIELDS_KEY", "ColumnBuilder", "ShardFields", "check_meta", "describe"]
