"""Hugging Face parquet and Arrow: a parquet file, a folder of them (searched recursively, as
the Hub lays them out: ``data/train-00000-of-00004.parquet``), or a ``save_to_disk`` folder of
Arrow stream files. Read with pyarrow (the ``parquet`` extra), no dependency on ``datasets``.

The image column is a Hugging Face ``Image`` struct ``{bytes, path}`` (or a plain binary
column); a row with no bytes reads the file its ``path`` names (``Dataset.to_parquet`` of image
files writes only paths), relative to the parquet file's folder or absolute, as a file list's.
The label column is an integer ``ClassLabel`` (names from the schema metadata key
``huggingface``) or plain integers or strings. Defaults: the columns the metadata marks as
``Image`` and ``ClassLabel``, else the first of ``image;img;jpg;png`` and ``label;labels;cls``.
Other columns become typed fields (text, numbers, lists, structs as JSON); binary columns are
left out. The scan reads the
label and field columns; workers read the image column one row group (one Arrow
record batch) at a time and keep the last one, so memory stays bounded by a row group.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...errors import PackError
from ...urls import is_url
from .base import MemberError, SourceOptions
from .container import ContainerSource, Scanned, Shard, member_name

IMAGE_COLUMNS = ("image", "img", "jpg", "png")
LABEL_COLUMNS = ("label", "labels", "cls", "class")


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise PackError("packing from parquet/Arrow needs pyarrow: pip install "
                        "'shardkit[parquet]'") from None
    return pa


def _is_parquet(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def _is_saved(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "state.json")) and any(
        n.endswith(".arrow") for n in os.listdir(folder))


def source_files(src: str) -> tuple[str, list[str], str]:
    """(root, files, kind) where kind is ``parquet`` or ``arrow``."""
    src = os.path.abspath(src)
    if os.path.isfile(src):
        return os.path.dirname(src), [src], "arrow" if src.endswith(".arrow") else "parquet"
    if not os.path.isdir(src):
        raise PackError(f"source not found: {src}")
    if _is_saved(src):
        try:
            with open(os.path.join(src, "state.json"), "rb") as f:
                names = [d["filename"] for d in json.loads(f.read())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PackError(f"{src}/state.json: not a save_to_disk state ({exc})") from None
        files = [os.path.normpath(os.path.join(src, n)) for n in names]
        outside = [n for n, f in zip(names, files) if not f.startswith(src + os.sep)]
        if outside:
            raise PackError(f"{src}/state.json: data file {outside[0]!r} is outside the folder")
        return src, files, "arrow"
    files = sorted(os.path.join(d, n) for d, _, names in os.walk(src) for n in names
                   if n.endswith(".parquet"))
    if not files:
        raise PackError(f"{src}: no .parquet files and no save_to_disk state.json")
    return src, files, "parquet"


def hf_features(schema: Any) -> dict[str, Any]:
    """The ``features`` of the schema's ``huggingface`` metadata ({} when absent or damaged)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def _column(schema: Any, given: str | None, typed: str, defaults: tuple[str, ...],
            features: dict[str, Any], what: str, path: str) -> str:
    names = schema.names
    if given is not None:
        for name in given.split(";"):
            if name.strip() in names:
                return name.strip()
        raise PackError(f"{path}: no {what} column {given!r} (columns: {', '.join(names)})")
    for name, feature in features.items():
        if isinstance(feature, dict) and feature.get("_type") == typed and name in names:
            return name
    for name in defaults:
        if name in names:
            return name
    raise PackError(f"{path}: no {what} column (looked for {';'.join(defaults)}; columns: "
                    f"{', '.join(names)}); name it with `{what}_key`")


def check_image_type(pa: Any, schema: Any, column: str, path: str) -> None:
    t = schema.field(column).type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:
        b = t.field("bytes").type
        if pa.types.is_binary(b) or pa.types.is_large_binary(b):
            return
    raise PackError(f"{path}: image column {column!r} is {t}, not a Hugging Face Image struct "
                    "{bytes, path} or binary")


def _binary(pa: Any, t: Any) -> bool:
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    return pa.types.is_struct(t) and any(_binary(pa, t.field(i).type)
                                         for i in range(t.num_fields))


def _label_values(pa: Any, array: Any, column: str, path: str) -> list[Any]:
    t = array.type
    if pa.types.is_dictionary(t):
        array, t = array.cast(t.value_type), t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise PackError(f"{path}: label column {column!r} is {t}, not integers or strings")
    return array.to_pylist()


def _key_column(pa: Any, schema: Any, column: str, path: str) -> None:
    """Refuse an ``id_key`` column that is missing or holds no integers or strings."""
    if column not in schema.names:
        raise PackError(f"{path}: no key column {column!r} for `id_key` (columns: "
                        f"{', '.join(schema.names)})")
    t = schema.field(column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise PackError(f"{path}: key column {column!r} (`id_key`) is {t}, not integers or "
                        "strings")


class ParquetSource(ContainerSource):
    name = "parquet"
    summary = "Hugging Face parquet or Arrow (a file, a folder of them, a save_to_disk folder)"
    keyed = True

    def detect(self, src: str) -> bool:
        if os.path.isfile(src):
            return _is_parquet(src) or src.endswith(".arrow")
        if not os.path.isdir(src):
            return False
        if _is_saved(src):
            return True
        return any(n.endswith(".parquet") for n in os.listdir(src)) or any(
            n.endswith(".parquet") for d, _, ns in os.walk(src) for n in ns)

    def scan_shards(self, src: str, options: SourceOptions) -> Scanned:
        pa = _pyarrow()
        root, files, kind = source_files(src)
        scanned = Scanned(root, [])
        for path in files:
            shard = Shard(path, os.path.relpath(path, root))
            try:
                batches = _open_batches(pa, path, kind)
                schema = batches.schema
            except (OSError, pa.ArrowException) as exc:
                raise PackError(f"{path}: not a readable {kind} file ({exc})") from None
            features = hf_features(schema)
            image = _column(schema, options.image_key, "Image", IMAGE_COLUMNS, features,
                            "image", path)
            label = _column(schema, options.label_key, "ClassLabel", LABEL_COLUMNS, features,
                            "label", path)
            check_image_type(pa, schema, image, path)
            names = (features.get(label) or {}).get("names")
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                if scanned.names is not None and scanned.names != names:
                    raise PackError(f"{path}: ClassLabel names differ from the other files'")
                scanned.names = names
            # Binary columns (another image, a mask file) are not read: only small typed values
            # travel in the plan.
            others = [n for n in schema.names if n not in (image, label)
                      and not _binary(pa, schema.field(n).type)]
            key = options.id_key
            if key is not None:
                _key_column(pa, schema, key, path)
            read = [label, *others] + ([key] if key not in (None, label, *others) else [])
            try:
                for g, (values, *columns) in enumerate(batches.columns(read)):
                    extra = [c.to_pylist() for c in columns]
                    keys = None if key is None else values.to_pylist() if key == label \
                        else extra[read.index(key) - 1]
                    for row, value in enumerate(_label_values(pa, values, label, path)):
                        shard.members.append(member_name(shard.name, f"{g}:{row}"))
                        shard.refs.append((g, row))
                        shard.labels.append(value)
                        shard.fields.append({n: col[row] for n, col in zip(others, extra)
                                             if col[row] is not None})
                        if keys is not None:
                            shard.keys.append(keys[row])
            except pa.ArrowException as exc:
                raise PackError(f"{path}: cannot read columns {[label, *others]} ({exc})"
                                ) from None
            shard.file = json.dumps([path, kind, image])  # what a worker opens (Item.file)
            scanned.shards.append(shard)
        return scanned

    @staticmethod
    def read(file: str, a: int, b: int, limit: int | None) -> bytes:
        path, kind, column = json.loads(file)
        pa = _pyarrow()
        try:
            images, paths = _group(pa, path, kind, column, a)
            data = images[b].as_py()
            where = paths[b].as_py() if paths is not None and data is None else None
        except (OSError, pa.ArrowException, IndexError) as exc:
            raise MemberError(f"cannot read row: {exc}") from None
        if data is None and where:  # a path-only Image (Dataset.to_parquet of image files)
            data = _read_image_file(os.path.join(os.path.dirname(path), where), where, limit)
        if data is None:
            raise MemberError("no image bytes and no path (null)")
        if limit is not None and len(data) > limit:
            raise MemberError(f"image of {len(data)} bytes is larger than any image within "
                              "--max-pixels can be")
        return data


def _read_image_file(full: str, where: str, limit: int | None) -> bytes:
    """The bytes of the image file a path-only row names (MemberError with the reason)."""
    if is_url(where):
        raise MemberError(f"image path {where!r} is a URL; only local files are read")
    try:
        with open(full, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if limit is not None and size > limit:
                raise MemberError(f"image file {where!r} of {size} bytes is larger than any "
                                  "image within --max-pixels can be")
            return f.read()
    except OSError as exc:
        raise MemberError(f"cannot read image file {where!r}: {exc.strerror or exc}") from None


class _Batches:
    """Row groups of a parquet file, or record batches of an Arrow stream file."""

    def __init__(self, pa: Any, path: str, kind: str) -> None:
        self.pa, self.path, self.kind = pa, path, kind
        if kind == "parquet":
            self.file = pa.parquet.ParquetFile(path, memory_map=True)  # pages read in place
            self.schema = self.file.schema_arrow
        else:
            reader = pa.ipc.open_stream(pa.memory_map(path))
            self.schema = reader.schema
            self.batches = reader.read_all().to_batches()

    def columns(self, names: list[str]):
        """Per row group (record batch): the arrays of the columns ``names``."""
        if self.kind == "parquet":
            for g in range(self.file.num_row_groups):
                table = self.file.read_row_group(g, columns=names)
                yield [table.column(n).combine_chunks() for n in names]
        else:
            for batch in self.batches:
                yield [batch.column(self.schema.get_field_index(n)) for n in names]

    def group(self, g: int, column: str) -> Any:
        """The image column of row group ``g``: its encoded bytes (a struct's ``bytes``
        field) and, for a struct, its ``path`` field (or None)."""
        if self.kind == "parquet":  # one thread: an encoding worker is one of many processes
            chunked = self.file.read_row_group(g, columns=[column], use_threads=False).column(0)
            array = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
        else:
            array = self.batches[g].column(self.schema.get_field_index(column))
        if self.pa.types.is_struct(array.type):  # flatten: a null struct's fields are null
            fields = dict(zip((f.name for f in array.type), array.flatten()))
            return fields["bytes"], fields.get("path")
        return array, None


def _open_batches(pa: Any, path: str, kind: str) -> _Batches:
    return _Batches(pa, path, kind)


_last: dict[str, Any] = {}


def _group(pa: Any, path: str, kind: str, column: str, g: int) -> Any:
    """The image column of row group ``g``, kept until another one is asked for (and the
    file, until another file is)."""
    key = (os.getpid(), path, column, g)
    if _last.get("key") != key:
        if _last.get("file_key") != key[:2]:
            _last.clear()
            _last.update(file_key=key[:2], batches=_open_batches(pa, path, kind))
        _last.update(key=key, images=_last["batches"].group(g, column))
    return _last["images"]
