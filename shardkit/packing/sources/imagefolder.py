"""Hugging Face's ``imagefolder`` layout: the records ``datasets.load_dataset("imagefolder",
data_dir=SRC)[split]`` loads, in its order, with its labels and metadata columns (the listing
rules: :mod:`shardkit.packing.hf_folder`).

SRC is read so when it holds ``metadata.jsonl``/``.csv``/``.parquet`` (in SRC or one of its
subfolders), or images and no subfolder at all (where the ImageFolder layout finds no class);
``source_format='imagefolder'`` asks for it in any folder. An ImageFolder tree without a
metadata file keeps torchvision's rules (:mod:`.folder`), and ``metadata_file`` over class
folders keeps the metadata source's (:mod:`.metadata`). Over a layout with no metadata file of
its own, ``metadata_file`` is read as its metadata, ``file_name`` relative to SRC.

Columns become typed fields as ``metadata_file``'s do
(:func:`~shardkit.packing.annotations.infer_fields`); ``text`` (the caption column of
diffusers' training scripts) is the field ``caption`` unless a ``caption`` column exists; a
``label`` column is the record's label (names sorted, or integers as given). ``captions``
adds ``<stem>.txt`` (or ``.caption``) beside each image where no column gives the caption.
A row naming a missing file, and an image no row names (both of which datasets keeps quiet
about until, or instead of, reading them), are listed as skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from ...errors import PackError, PackOptionError
from ...fields import FieldError, Schema, Text, as_schema
from ...urls import is_url
from ..annotations import (CAPTION_FIELD, MAX_CAPTION_BYTES, check_geometry, infer_fields,
                           read_caption)
from ..hf_folder import METADATA_FILENAMES, Layout, image_path, is_image, read_layout, read_rows
from ..record_fields import RecordFields
from .base import ImageFilesSource, Scan, Source, SourceOptions
from .container import Labels

NAME = "imagefolder"
DEFAULT_SPLIT = "train"  # the split training scripts take from load_dataset's DatasetDict


def has_layout(src: str) -> bool:
    """Whether SRC is detected as the imagefolder layout (see the module docstring): a few
    ``stat`` calls, never a walk of the tree."""
    if is_url(src) or not os.path.isdir(src):
        return False
    try:
        with os.scandir(src) as it:
            entries = [(e.name, e.path, e.is_dir()) for e in it]
    except OSError:
        return False
    dirs = [path for _, path, is_dir in entries if is_dir]
    if any(name in METADATA_FILENAMES and not is_dir for name, _, is_dir in entries):
        return True
    if not dirs:
        return any(is_image(name) for name, _, _ in entries)
    return any(os.path.isfile(os.path.join(d, m)) for d in dirs for m in METADATA_FILENAMES)


def reads(options: SourceOptions) -> bool:
    """Whether the imagefolder source reads SRC for these options (the metadata source asks,
    as ``captions``, ``metadata_file`` and ``schema`` ask for it too)."""
    if options.source_format is not None:
        return options.source_format == NAME
    if options.file_list is not None or options.coco is not None or not has_layout(options.src):
        return False
    if options.metadata_file is None:
        return True
    with os.scandir(options.src) as it:  # a metadata_file over class folders: the metadata source
        return not any(e.is_dir() for e in it)


class ImagefolderSource(ImageFilesSource):
    name = NAME
    summary = ("Hugging Face's imagefolder layout: images with metadata.jsonl/.csv/.parquet "
               "(or none), train/test folders as splits (`split`)")
    splits = True

    def detect(self, src: str) -> bool:
        return has_layout(src)

    def check(self, options: SourceOptions) -> None:
        Source.check(self, options)
        if options.image_key or options.label_key:
            raise PackOptionError("`image_key` and `label_key` name members of a container "
                                  "source, not of an image folder")
        if options.split is not None and not isinstance(options.split, str):
            raise PackOptionError(f"`split` must be a split's name, got {options.split!r}")

    def scan(self, options: SourceOptions) -> Scan:
        root = os.fspath(options.src)
        if not os.path.isdir(root):
            raise PackError(f"source folder not found: {root}")
        layout = read_layout(root)
        split = DEFAULT_SPLIT if options.split is None else options.split
        if split not in layout.splits:
            raise PackError(f"{root}: no split {split!r} in this imagefolder layout (splits: "
                            f"{', '.join(layout.splits) or 'none, no files'}); pass `split`")
        skipped = list(layout.skipped)
        if layout.metadata or options.metadata_file is not None:
            files, found = _from_metadata(layout, split, options, skipped)
        else:
            files, found = [], _from_images(layout, split, skipped)
        if not found and not options.allow_empty:
            first = f"; first skipped: {skipped[0]['path']}: {skipped[0]['reason']}" \
                if skipped else ""
            raise PackError(f"{root}: no images in split {split!r}{first}")
        rows = [row for _, row in found]
        classes = layout.classes
        labels = [-1] * len(found)
        if any("label" in row for row in rows):  # a metadata column: the records' label
            names = Labels([row.get("label") for row in rows], None)
            kept, labels = [], []
            for (path, row) in found:
                label, reason = names.resolve(row.pop("label", None))
                if reason is not None:
                    skipped.append({"path": path, "reason": reason})
                    continue
                kept.append((path, row))
                labels.append(label)
            found, classes = kept, names.classes
        elif classes:
            index = {c: i for i, c in enumerate(classes)}
            labels = [index.get(layout.label(os.path.relpath(p, root)), -1) for p, _ in found]
        samples = [(p, label) for (p, _), label in zip(found, labels)]
        fields = _fields(layout, split, files, [row for _, row in found], samples, options)
        return Scan(root, list(classes), {c: i for i, c in enumerate(classes)}, samples,
                    skipped, fields=fields)


def _from_images(layout: Layout, split: str, skipped: list[dict[str, str]]
                 ) -> list[tuple[str, dict[str, Any]]]:
    """Every image of the split (no metadata files): datasets' records."""
    out = []
    for rel in layout.images(split):
        path = os.path.join(layout.root, rel)
        if layout.classes and layout.label(rel) not in layout.classes:
            # x.jpg.gz counts as an image but not towards the labels (datasets' analysis)
            skipped.append({"path": path, "reason": f"its folder {layout.label(rel)!r} is not "
                            "a label (only files with an image extension name labels)"})
            continue
        out.append((path, {}))
    return out


def _from_metadata(layout: Layout, split: str, options: SourceOptions,
                   skipped: list[dict[str, str]]
                   ) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """The rows of the split's metadata files, each with its image's path: datasets' records."""
    root = layout.root
    files = layout.metadata_files(split)
    if not layout.metadata:
        # A layout without metadata files of its own: the given file is its metadata, its
        # file_name relative to SRC, as if it lay in SRC (never silently left unread).
        files = [os.path.abspath(options.metadata_file)]
    elif not files:
        others = [s for s in layout.splits if layout.metadata_files(s)]
        raise PackError(f"{root}: split {split!r} has no metadata file while {', '.join(others)} "
                        "has: datasets loads no images for it")
    if options.metadata_file is not None and layout.metadata:
        given = os.path.realpath(options.metadata_file)
        if given not in {os.path.realpath(os.path.join(root, f)) for f in files}:
            raise PackOptionError(
                f"`metadata_file` {options.metadata_file} is not a metadata file of split "
                f"{split!r} in {root} ({', '.join(files)}); an imagefolder layout's metadata "
                "files are read from SRC: leave `metadata_file` out")
    found: list[tuple[str, dict[str, Any]]] = []
    named: set[str] = set()
    columns: tuple[str, set[str]] | None = None
    for f in files:
        rows = read_rows(os.path.join(root, f))
        keys = {k for row in rows for k in row}
        if columns is not None and rows and keys != columns[1]:
            raise PackError(f"{os.path.join(root, f)}: columns {sorted(keys)} differ from "
                            f"{columns[0]}'s {sorted(columns[1])}; datasets refuses this layout")
        columns = columns or ((f, keys) if rows else None)
        if rows and "file_name" not in keys:
            raise PackError(f"{os.path.join(root, f)}: no 'file_name' column")
        folder = "" if os.path.isabs(f) else os.path.dirname(f)
        for n, row in enumerate(rows, 1):
            where = f"{os.path.join(root, f)} row {n}"
            for key in list(row):
                if key == "file_names" or key.endswith("_file_names"):
                    raise PackError(f"{where}: column {key!r} names several images per row; "
                                    "a record holds one image")
                if key.endswith("_file_name") and isinstance(row[key], str) and row[key]:
                    named.add(image_path(folder, row[key], where))  # e.g. a conditioning image
                if key == "image":
                    raise PackError(f"{where}: a column named 'image' (the image is the one "
                                    "file_name names)")
            name = row.pop("file_name", None)
            if name is None or name == "":
                skipped.append({"path": where, "reason": "no file_name: the row has no image"})
                continue
            rel = image_path(folder, name, where)
            named.add(rel)
            path = os.path.join(root, rel)
            if not os.path.isfile(path):
                skipped.append({"path": path, "reason": f"no such file (named by {f} row {n}; "
                                "datasets fails when that record is read)"})
                continue
            if "text" in row and "caption" not in keys:
                row[CAPTION_FIELD] = row.pop("text")
            found.append((path, {k: v for k, v in row.items() if v is not None}))
    unnamed = [rel for rel in dict.fromkeys(layout.images(split)) if rel not in named]
    for rel in unnamed:
        skipped.append({"path": os.path.join(root, rel), "reason": "no metadata row names it "
                        f"({', '.join(files)}): datasets' imagefolder leaves it out"})
    return files, found


def _fields(layout: Layout, split: str, files: list[str], rows: list[dict[str, Any]],
            samples: list[tuple[str, int]], options: SourceOptions) -> RecordFields | None:
    try:
        schema = (infer_fields({str(i): row for i, row in enumerate(rows)})
                  if options.schema is None else as_schema(options.schema))
        sidecars = bool(options.captions) and CAPTION_FIELD not in schema
        if sidecars:
            schema = Schema([*schema, Text(CAPTION_FIELD, MAX_CAPTION_BYTES)])
    except FieldError as exc:
        raise PackError(f"schema: {exc}") from None
    check_geometry(schema)
    if not len(schema):
        return None
    return ImagefolderFields(layout.root, split, files, rows, [p for p, _ in samples], schema,
                             sidecars)


class ImagefolderFields(RecordFields):
    """Each record's metadata columns (by its position: two rows may name one file) and, with
    ``sidecars``, its caption file."""

    def __init__(self, root: str, split: str, files: list[str], rows: list[dict[str, Any]],
                 paths: list[str], schema: Schema, sidecars: bool) -> None:
        self.rows, self.schema, self.sidecars = rows, schema, sidecars
        self.files, self.split = files, split
        self.first: dict[str, int] = {}
        for i, p in enumerate(paths):
            self.first.setdefault(p, i)
        digest = hashlib.sha256(json.dumps([split, sidecars, schema.as_json()]).encode())
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        self.sha256 = digest.hexdigest()

    def plan_key(self) -> str:
        return f"imagefolder:{self.sha256}"

    def meta(self) -> dict[str, Any]:
        return {"annotations": {"kind": NAME, "split": self.split, "files": self.files,
                                "sha256": self.sha256, "captions": self.sidecars}}

    def fields(self, path: str, height: int, width: int) -> dict[str, Any]:
        return self.fields_at(self.first[path], path, height, width)

    def fields_at(self, index: int, path: str, height: int, width: int) -> dict[str, Any]:
        values = dict(self.rows[index]) if self.rows else {}
        if self.sidecars:
            values[CAPTION_FIELD] = read_caption(path)
        return values
