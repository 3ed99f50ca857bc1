"""Typed fields from a metadata file beside an ImageFolder (or a file list's extra columns), and
captions from same-stem ``.txt`` files: :class:`MetadataFields`, the fields of the metadata source
(:mod:`shardkit.packing.sources.metadata`).

- ``metadata``: JSON Lines or CSV/TSV with a ``file_name`` column (the Hugging Face
  ``imagefolder`` layout), keyed by the image's path relative to SRC; every other column is a
  field. Folder labels stay ImageFolder-exact. An image without a row, a row naming no image
  found, and a path given twice are errors naming it (a pack never guesses which row is meant).
- ``file_list`` with a header row: columns after ``path,label`` are fields.
- ``captions``: ``<stem>.txt`` beside each image (UTF-8; else ``<stem>.caption``, kohya
  sd-scripts' default extension) becomes the text field ``caption``; an image without one is
  skipped with the reason (an error under ``strict``), and so is one whose two files differ.

The schema is given (``schema``) or inferred from every row and printed by the CLI. Boxes must
be declared ``normalized`` (0..1 of the image: they follow the packer's resize); masks and pixel
boxes are refused here (the COCO packer, :mod:`.coco`, moves pixel geometry with the image). CSV cells
are typed as they read: integers, then numbers, then JSON arrays/objects, else text; an empty
cell (or a JSON null, or a key a JSON line lacks) is absent, and a column absent from some rows
is an optional field (absent: None, or empty for ragged kinds), never a reason to skip an image. A column of
lists of strings is inferred as multi-label, its classes the sorted names.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from typing import Any

from ..errors import PackError
from ..fields import FieldError, MultiLabel, Schema, Text, as_schema
from ..fileutil import read_bounded
from .discovery import Discovery
from .hf_folder import json_lines
from .record_fields import RecordFields
from .writer import relative_path

MAX_METADATA_BYTES = 1 << 30
CAPTION_FIELD = "caption"
MAX_CAPTION_BYTES = 1 << 20


class MetadataFields(RecordFields):
    """Per-image fields from a metadata table and/or caption files (see the module docstring).
    The table is read (and the schema inferred) at construction; :meth:`discovery` finds the
    images (ImageFolder rules, or the file list) and matches them to the rows."""

    def __init__(self, src: str, *, metadata: str | None = None, file_list: str | None = None,
                 captions: bool = False, schema: Any = None, allow_empty: bool = False) -> None:
        self.src, self.file_list, self.allow_empty = src, file_list, allow_empty
        self.captions = bool(captions)
        self.sources = [p for p in (metadata, file_list) if p is not None]
        self.rows: dict[str, dict[str, Any]] = {}
        if metadata is not None:
            self.rows = _read_table(metadata, "file_name", skip=())
        elif file_list is not None and names_columns(file_list):
            self.rows = _read_table(file_list, None, skip=(1,))
        else:  # a plain file list: read (and checked) by discovery alone, as without fields
            self.sources = [p for p in self.sources if p != file_list]
        digest = hashlib.sha256()
        for path in self.sources:
            digest.update(read_bounded(path, MAX_METADATA_BYTES, "metadata"))
        self.inferred = schema is None
        try:
            self.schema = infer_fields(self.rows) if schema is None else as_schema(schema)
            if self.captions and CAPTION_FIELD not in self.schema:
                self.schema = Schema([*self.schema, Text(CAPTION_FIELD, MAX_CAPTION_BYTES)])
        except FieldError as exc:
            raise PackError(f"schema: {exc}") from None
        check_geometry(self.schema)
        digest.update(json.dumps(self.schema.as_json(), sort_keys=True).encode())
        self.sha256 = digest.hexdigest()
        self._rel: dict[str, str] | None = None

    def discovery(self) -> Discovery:
        from .discovery import discover, read_file_list

        found = (read_file_list(self.file_list, self.src) if self.file_list
                 else discover(self.src, self.allow_empty))
        rel = [relative_path(found.root, p) for p, _ in found.samples]
        if self.rows:
            missing = next((r for r in rel if r not in self.rows), None)
            if missing is not None:
                raise PackError(f"{self.sources[0]}: no row for image {missing!r}")
            known = set(rel)
            extra = next((r for r in self.rows if r not in known), None)
            if extra is not None:
                raise PackError(f"{self.sources[0]}: row for {extra!r}, which is not an image "
                                "found in the source folder")
        self._rel = dict(zip((p for p, _ in found.samples), rel))
        return found

    def plan_key(self) -> str:
        return f"metadata:{self.sha256}:captions={self.captions}"

    def meta(self) -> dict[str, Any]:
        return {"annotations": {"kind": "metadata", "sha256": self.sha256,
                                "files": [os.path.basename(p) for p in self.sources],
                                "captions": self.captions}}

    def fields(self, path: str, height: int, width: int) -> dict[str, Any]:
        if self._rel is None:
            self.discovery()
        rel = self._rel[path]
        values = dict(self.rows.get(rel, {}))
        if self.captions:
            values[CAPTION_FIELD] = read_caption(path)
        return values


def check_geometry(schema: Schema) -> None:
    """Refuse (PackError) a field of the source image's pixels: the packer resizes them, so such
    geometry would be silently off. Normalised boxes follow any size; COCO's packer scales pixel
    geometry itself."""
    for f in schema:
        if f.geometric and not getattr(f, "normalized", False):
            raise PackError(f"schema: field {f.name!r} ({f.kind}) would be in the source "
                            "image's pixels, which packing resizes; declare boxes with "
                            "normalized=True, or pack COCO annotations with `coco`")


def names_columns(file_list: str) -> bool:
    """Whether a file list's first line is a header naming more than ``path,label`` (only then
    are its further columns fields); read alone, so other lists cost nothing more."""
    try:
        with open(file_list, "rb") as f:
            first = f.readline(1 << 16).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return False  # discovery reports it, as for any file list
    cells = next(csv.reader([first], dialect="excel-tab" if "\t" in first else "excel"), [])
    return len(cells) > 2 and os.path.splitext(cells[0].strip())[1] == "" and not any(
        c.strip().lstrip("-").isdigit() for c in cells[:2])


def _read_table(path: str, key: str | None, skip: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """{relative path: {column: value}}: JSON Lines, or CSV/TSV with a header row. ``key``: the
    path column's name (None: the first column); ``skip``: more column positions to leave out
    (a file list's label)."""
    data = read_bounded(path, MAX_METADATA_BYTES, "metadata")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PackError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    rows: list[dict[str, Any]]
    if path.lower().endswith((".jsonl", ".json", ".ndjson")):
        rows = json_lines(path, text)
        key = key or "path"
    else:
        dialect = "excel-tab" if "\t" in text.split("\n", 1)[0] else "excel"
        table = [r for r in csv.reader(io.StringIO(text, newline=""), dialect=dialect) if r]
        if not table:
            raise PackError(f"{path}: no rows")
        header = [h.strip() for h in table[0]]
        if key is None:  # a file list: only one with a header row names extra columns
            if len(header) <= 2 or not os.path.splitext(header[0])[1] == "":
                return {}
            key = header[0]
        if key not in header:
            raise PackError(f"{path}: no {key!r} column in the header row {header}")
        keep = [i for i in range(len(header)) if i not in skip]
        rows = []
        for n, r in enumerate(table[1:], 2):
            if len(r) != len(header):
                raise PackError(f"{path} row {n}: {len(r)} cells, the header has {len(header)}")
            rows.append({header[i]: (r[i] if header[i] == key else _cell(r[i])) for i in keep
                         if header[i] == key or r[i].strip()})  # an empty cell: absent
    out: dict[str, dict[str, Any]] = {}
    for n, row in enumerate(rows, 1):
        name = row.pop(key, None)
        if not isinstance(name, str) or not name.strip():
            raise PackError(f"{path} row {n}: no {key!r}")
        rel = os.path.normpath(name.strip())
        if rel in out:
            raise PackError(f"{path}: {rel!r} has two rows")
        out[rel] = row
    return out


def _cell(text: str) -> Any:
    """A CSV cell typed as it reads: int, float, JSON array/object, else the text."""
    s = text.strip()
    for convert in (int, float):
        try:
            value = convert(s)
        except ValueError:
            continue
        if convert is float and s.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
            return text
        return value
    if s[:1] in "[{":
        try:
            return json.loads(s)
        except (ValueError, RecursionError):
            pass
    return text


def infer_fields(rows: dict[str, dict[str, Any]]) -> Schema:
    """The fields of metadata ``rows`` ({key: {column: value}}), as the module docstring says."""
    if not rows:
        return Schema()
    columns = {k for row in rows.values() for k in row}
    first = list(next(iter(rows.values())))
    fields = []
    for name in first + sorted(columns - set(first)):
        # A column some rows lack (or hold as null / an empty CSV cell) is optional: those
        # images are packed with the field absent, never skipped.
        values = [row[name] for row in rows.values() if row.get(name) is not None]
        if values and all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                          for v in values):
            classes = sorted({x for v in values for x in v})
            field = MultiLabel(name, max(len(classes), 1), classes or None)
        else:
            field = Schema.infer([{name: v} for v in values] or [{name: None}]).fields[0]
        field.optional = len(values) < len(rows)
        fields.append(field)
    return Schema(fields)


def read_caption(path: str) -> str:
    """The caption of the image at ``path``: ``<stem>.txt``, else ``<stem>.caption`` (FieldError:
    neither, or both with different text)."""
    stem = os.path.splitext(path)[0]
    texts = [(f, text) for f, text in ((f, _caption_file(f)) for f in (stem + ".txt",
                                                                       stem + ".caption"))
             if text is not None]
    if not texts:
        raise FieldError(f"no caption file {os.path.basename(stem)}.txt (or .caption) beside "
                         "the image")
    if len(texts) == 2 and texts[0][1] != texts[1][1]:
        raise FieldError(f"two different captions: {os.path.basename(texts[0][0])} and "
                         f"{os.path.basename(texts[1][0])}")
    return texts[0][1]


def _caption_file(txt: str) -> str | None:
    """The stripped UTF-8 text of caption file ``txt``; None: there is none."""
    try:
        if os.path.getsize(txt) > MAX_CAPTION_BYTES:
            raise FieldError(f"caption file {txt} is larger than {MAX_CAPTION_BYTES} bytes")
        with open(txt, "rb") as f:
            raw = f.read(MAX_CAPTION_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FieldError(f"cannot read caption file {txt}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise FieldError(f"caption file {txt} is not UTF-8 (byte {exc.start})") from None


__all__ = ["CAPTION_FIELD", "MAX_CAPTION_BYTES", "MetadataFields", "check_geometry",
           "infer_fields", "names_columns", "read_caption"]
