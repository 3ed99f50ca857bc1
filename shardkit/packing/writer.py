"""Write a store record by record: :class:`StoreWriter` (public), also the packer's shard builder.

Records go to the format's writer as they come; the index arrays and the sealed metadata are
written last, so a file without metadata is never mistaken for a store. Aborting (an exception
in the ``with`` block, or :meth:`StoreWriter.abort`) deletes the file and its side files.
"""

from __future__ import annotations

import os
import zlib
from typing import Any, Iterable

import numpy as np

from .. import bucketmeta, metadata
from .._version import __version__
from .. import fields as fieldstore
from ..codec import encode
from ..errors import PackError, PackOptionError
from ..fileutil import remove, sha256_file
from ..formats import format_for_path, open_writer, remove_shard_file
from ..jpegrows import row_index, row_starts
from ..urls import is_url
from .imaging import PILLOW_PIXEL_LIMIT
from .install import install, partial_path
from .settings import KINDS, Kind, PackSettings, Skipped


def relative_path(root: str, path: str) -> str:
    """``path`` relative to ``root``; a plain prefix cut when that is what relpath gives
    (``os.path.relpath`` costs tens of microseconds, per image, in the writing process)."""
    prefix = root.rstrip(os.sep) + os.sep
    if path.startswith(prefix):
        rest = path[len(prefix):]
        if rest and os.path.normpath(rest) == rest:
            return rest
    return os.path.relpath(path, root)


def remove_store_files(paths: Iterable[str], fmt: str) -> None:
    """Delete store files of format ``fmt`` (or folders: a partial of another kind of pack) with
    the side files their killed writers may leave; files already gone are fine."""
    for path in paths:
        remove(path)
        remove_shard_file(path, fmt)


def common_meta(classes: list[str], class_to_idx: dict[str, int], settings: PackSettings,
                source_root: str, schema: Any = None,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The metadata every shard of a store (and its manifest) shares; a store with fields
    (``schema``, a :class:`shardkit.fields.Schema`) declares them and is format version 2."""
    meta = {"format": metadata.FORMAT_TAG, "format_version": metadata.FORMAT_VERSION,
            "shardkit_version": __version__, "classes": classes, "class_to_idx": class_to_idx,
            "settings": settings.as_meta(),
            "source_root": source_root if is_url(source_root) else os.path.abspath(source_root)}
    if schema is not None and len(schema):
        meta |= {"format_version": metadata.FIELDS_VERSION, "fields": schema.as_json()}
    return meta | (extra or {})


class StoreWriter:
    """Write a single-file store (or one shard of a folder store) from pixels or records.

    ::

        with shardkit.StoreWriter("train.lmdb", ["cat", "dog"], size=256) as w:
            w.add(pixels, label)                    # HxWx3 uint8 RGB, encoded as `encoding`
            w.add_encoded(jpeg_bytes, label, h, w)  # a record already in `encoding`

    The store is built under the hidden name ``.<name>.partial`` beside ``path``; on a clean
    exit of the ``with`` block (or :meth:`finish`) the index arrays and the metadata are written
    last and the file is moved to ``path`` in one rename (readers of a store it replaces keep
    reading the old one). On an exception (or :meth:`abort`) the partial file is deleted and
    ``path`` is left as it was. :class:`shardkit.ShardDataset` reads the result like any packed
    store.

    Args:
        path: the store file to write; ``.h5``/``.hdf5`` selects HDF5 unless ``format`` is given.
        classes: class names; label ``i`` is ``classes[i]`` unless ``class_to_idx`` says otherwise.
        format: a backend name from ``shardkit.formats.FORMATS`` (default: from ``path``).
        encoding: how :meth:`add` encodes pixels, a name from ``shardkit.codec.ENCODINGS``.
        size: recorded in the metadata as the resize target the records were made with (0: the
            original sizes). Pixels are stored as given: :meth:`add` does not resize.
        quality: the JPEG quality :meth:`add` encodes with (1-100); recorded in the metadata.
        max_pixels: recorded in the metadata (the decode limit the sources were read under).
        class_to_idx: class name -> label; default ``{name: i for i, name in enumerate(classes)}``.
        source_root: the folder ``source_path`` arguments are stored relative to; without it
            they are stored as given. Recorded in the metadata (default: ``path``'s folder).
        kind: ``"single"`` for a store of its own, ``"shard"`` for one shard of a folder store
            (its entry then carries the file's SHA-256 for the manifest).
        overwrite: replace an existing ``path``; without it an existing ``path`` is refused.
        install: ``False`` writes straight to ``path`` and leaves moving it to the caller (the
            packer, whose shards already live in a partial folder).
        shard_index: this shard's number in its folder store (metadata ``shard.index``).
        first_source: the number of this shard's first source in the whole pack (metadata
            ``shard.sources`` is ``[first_source, first_source + records + skipped]``).
        skipped: sources left out before writing, listed first in the metadata.
        schema: the typed fields each record carries (``add(..., **fields)``): a
            :class:`shardkit.fields.Schema`, a list of field kinds, or a schema JSON file. None:
            inferred from the first record's fields (if it has any).
        extra_meta: more JSON-able metadata shared by every shard (e.g. COCO's categories).
        buckets: the :class:`shardkit.packing.buckets.BucketSpec` the records were sized with
            (the packer's); the metadata then lists the buckets the records' sizes fill
            (``buckets``: :mod:`shardkit.bucketmeta`).
        id_key: the source column or member the records' keys (their source paths) were read
            from (``pack(id_key=...)``), recorded in the metadata; None: source paths.
    """

    def __init__(self, path: str | os.PathLike, classes: Iterable[str], *,
                 format: str | None = None, encoding: str = "jpeg", size: int = 256,
                 quality: int = 90, max_pixels: int = PILLOW_PIXEL_LIMIT,
                 class_to_idx: dict[str, int] | None = None, source_root: str | None = None,
                 kind: Kind = "single", overwrite: bool = False, install: bool = True,
                 shard_index: int = 0, first_source: int = 0,
                 skipped: Iterable[Skipped | dict[str, str]] = (), schema: Any = None,
                 extra_meta: dict[str, Any] | None = None, buckets: Any = None,
                 id_key: str | None = None) -> None:
        self.path = os.fspath(path)
        self.classes = list(classes)
        self.settings = PackSettings(size, quality, encoding, format or format_for_path(self.path),
                                     max_pixels, buckets, id_key=id_key)
        self.settings.validate()
        if kind not in KINDS:
            raise PackOptionError(f"`kind` must be {' or '.join(map(repr, KINDS))}, not {kind!r}")
        self.class_to_idx = ({name: i for i, name in enumerate(self.classes)}
                             if class_to_idx is None else dict(class_to_idx))
        self.source_root = source_root
        self.kind, self.overwrite, self._install = kind, overwrite, install
        self.shard_index, self.first_source = shard_index, first_source
        self.skipped: list[Skipped] = [s if isinstance(s, Skipped) else Skipped(**s)
                                       for s in skipped]
        self._extra_skipped = len(self.skipped)
        self._skipped_slots: list[int] = []  # source numbers of skip() calls (the pack layout)
        if install and os.path.lexists(self.path) and not overwrite:
            raise PackError(f"{self.path} already exists (use `overwrite=True` to replace it)")
        self.file = partial_path(self.path) if install else self.path
        if install:
            remove_store_files([self.file], self.settings.format)  # left by a killed writer
        self.labels: list[int] = []
        self.heights: list[int] = []
        self.widths: list[int] = []
        self.crcs: list[int] = []
        self.paths: list[bytes] = []
        self.rows: list[np.ndarray | None] = []  # each JPEG record's MCU row starts (jpegrows)
        self.entry: dict[str, Any] | None = None  # set by finish()
        self.extra_meta = extra_meta
        self.columns = None if schema is None else fieldstore.builder(schema)
        self._writer = open_writer(self.file, self.settings.format)
        self._open = True

    @property
    def count(self) -> int:
        """Records written so far."""
        return len(self.labels)

    def add(self, image: np.ndarray, label: int, source_path: str | None = None,
            **fields: Any) -> None:
        """Encode HxWx3 uint8 RGB pixels with the store's encoding and append them, with the
        record's ``fields`` (every field of the schema; checked against the image's size)."""
        if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3
                and image.shape[2] == 3):
            raise PackOptionError("`image` must be an HxWx3 uint8 RGB array (encoded records "
                                  "go through `add_encoded`)")
        height, width = image.shape[:2]
        checked = self._check_fields(fields, height, width)
        self.add_encoded(encode(image, self.settings.encoding, self.settings.quality), label,
                         height, width, source_path, _checked=checked)

    def add_encoded(self, data: bytes, label: int, height: int, width: int,
                    source_path: str | None = None, crc: int | None = None,
                    _checked: dict[str, Any] | None = None, **fields: Any) -> None:
        """Append a record already in the store's encoding, of ``height`` x ``width`` pixels;
        ``crc`` is its CRC-32 where already known; ``fields`` as in :meth:`add`."""
        self._check_open()
        checked = _checked if _checked is not None else self._check_fields(fields, height, width)
        self._writer.append(data)
        if self.columns is not None:  # masks go to the file now, beside their record
            for stream, raw in self.columns.append(checked).items():
                self._writer.append_side(stream, raw)
        self.labels.append(int(label))
        self.heights.append(height)
        self.widths.append(width)
        self.crcs.append(zlib.crc32(data) if crc is None else crc)
        if self.settings.encoding == "jpeg":
            self.rows.append(row_starts(data))
        if source_path is None:
            source_path = ""
        elif self.source_root is not None:
            source_path = relative_path(self.source_root, source_path)
        self.paths.append(source_path.encode("utf-8", "surrogateescape"))

    def _check_fields(self, fields: dict[str, Any], height: int, width: int) -> dict[str, Any]:
        """The record's fields checked (FieldError naming the field), before anything is written."""
        if self.columns is None:
            if not fields:
                return {}
            if self.count:
                raise PackError(f"this store was started without fields; got {sorted(fields)}")
            self.columns = fieldstore.builder(fieldstore.Schema.infer([fields]))
        return self.columns.check(fields, height, width)

    def skip(self, source_path: str, reason: str) -> None:
        """Record that a source is left out, and why (listed in the metadata's ``skipped``)."""
        self._check_open()
        self._skipped_slots.append(self.first_source + self.count + len(self.skipped)
                                   - self._extra_skipped)
        self.skipped.append(Skipped(source_path, reason))

    def finish(self) -> dict[str, Any]:
        """Write the index arrays and the metadata, move the file into place; returns its entry
        (``file``, ``format``, ``count``, ``bytes``, ``skipped``; a shard's also ``sha256``)."""
        self._check_open()
        try:
            entry = self._write_index()
            if self._install:
                install(self.file, self.path, self.overwrite)
        except BaseException:
            self.abort()
            raise
        self._open = False
        self.entry = entry
        return entry

    def abort(self) -> None:
        """Stop writing and delete the partial file; ``path`` is left as it was."""
        if self._open:
            self._open = False
            self._writer.discard()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        elif self._open:
            self.finish()

    def _check_open(self) -> None:
        if not self._open:
            raise PackError(f"{self.path}: the StoreWriter is closed")

    def _write_index(self) -> dict[str, Any]:
        n = len(self.labels)
        path_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(p) for p in self.paths], out=path_offsets[1:])
        arrays = {
            "labels": np.asarray(self.labels, dtype="<i8"),
            "heights": np.asarray(self.heights, dtype="<i4"),
            "widths": np.asarray(self.widths, dtype="<i4"),
            "crc32": np.asarray(self.crcs, dtype="<u4"),
            "path_offsets": path_offsets,
            "path_blob": np.frombuffer(b"".join(self.paths), dtype=np.uint8),
        }
        skipped = [s.as_json() for s in self.skipped]
        sources = n + len(self.skipped) - self._extra_skipped
        root = self.source_root if self.source_root is not None else os.path.dirname(self.path)
        schema = self.columns.schema if self.columns is not None else None
        described = metadata.describe_arrays(arrays)
        marked = sum(r is not None for r in self.rows)
        if marked:  # stores without row markers: as before
            rows = row_index(self.rows)
            described |= metadata.describe_row_arrays(rows)
            arrays |= rows
        if schema is not None and len(schema):
            columns = self.columns.arrays()
            described |= fieldstore.describe(columns)
            arrays |= columns
        meta = common_meta(self.classes, self.class_to_idx, self.settings, root, schema,
                           self.extra_meta) | {
            "kind": self.kind, "count": n, "skipped": skipped,
            "shard": {"index": self.shard_index, "count": n,
                      "sources": [self.first_source, self.first_source + sources]},
            "arrays": described,
        } | ({"row_markers": marked} if marked else {})
        held = None
        if self.settings.buckets is not None:  # every record is at its bucket's size
            held = bucketmeta.histogram(self.settings.buckets.as_meta(), self.heights,
                                        self.widths)
            meta[bucketmeta.KEY] = held
        self._writer.finish(arrays, metadata.dumps(metadata.seal(meta)))
        entry = {"file": os.path.basename(self.path), "format": self.settings.format,
                 "count": n, "bytes": os.path.getsize(self.file), "skipped": skipped,
                 "sources": [self.first_source, self.first_source + sources],
                 "skipped_slots": self._skipped_slots}
        if marked:
            entry["row_markers"] = marked
        if held is not None:  # the manifest's buckets are the shards' summed
            entry[bucketmeta.KEY] = {k: held[k] for k in ("sizes", "counts")}
        if self.kind == "shard":  # the manifest's checksum (a single-file store has no manifest)
            entry["sha256"] = sha256_file(self.file)
        return entry
