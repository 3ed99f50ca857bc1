"""MosaicML Streaming MDS: a folder with an ``index.json`` (version 2) and its shards, raw or
compressed (gzip and bzip2 with the standard library; zstd with ``zstandard``), read without
the ``streaming`` package.

A shard file is ``[n: u32] [offsets: u32 x (n+1)] [config JSON] [samples]``; a sample is the
u32 sizes of its variable-size columns, then each column's bytes in column order. The image
column is ``jpeg``, ``png`` or ``pil`` (raw pixels with their mode); the label an integer
(``int``, ``int8``..``uint64``, ``str_int``) or ``str`` column. Defaults: the first image
column, and the first of ``label;labels;cls;class;y``; ``int``/``float``/``str``/``json``/
``ndarray`` columns become typed fields. ``pkl`` columns are never decoded:
each is listed in the skip list (a ``pkl`` image or label column refuses the source).
A shard name that leads outside the folder (``../``, an absolute path, a symlink out) refuses
the source with one line.
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
from typing import Any

import numpy as np

from ...errors import PackError
from .base import MemberError, SourceOptions
from .container import IndexFolderSource, Scanned, Shard, inside_folder, member_name, pil_as_file
from .fields import FieldRejected, decode_mds, is_mds_field
from .files import open_cached

IMAGE_ENCODINGS = ("jpeg", "png", "pil")
INT_ENCODINGS = {"int": "<i8", "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
                 "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8"}
LABEL_COLUMNS = ("label", "labels", "cls", "class", "y")


def _decompress(data: bytes, compression: str, where: str) -> bytes:
    algo = compression.split(":", 1)[0]
    if algo == "gz":
        return gzip.decompress(data)
    if algo == "bz2":
        return bz2.decompress(data)
    if algo == "zstd":
        try:
            import zstandard
        except ImportError:
            raise PackError(f"{where}: zstd-compressed MDS shards need zstandard: pip install "
                            "zstandard") from None
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    raise PackError(f"{where}: MDS compression {compression!r} is not supported (raw, gz, bz2, "
                    "zstd are)")


def _sample_columns(data: memoryview | bytes, sizes: list[int | None]) -> list[tuple[int, int]]:
    """(start, end) of each column's bytes within one sample."""
    variable = sum(1 for s in sizes if not s)
    if len(data) < 4 * variable:
        raise MemberError("sample shorter than its column sizes")
    heads = np.frombuffer(bytes(data[:4 * variable]), "<u4").tolist()
    idx, out, v = 4 * variable, [], 0
    for s in sizes:
        if not s:
            s, v = heads[v], v + 1
        if idx + s > len(data):
            raise MemberError("a column runs past the end of its sample")
        out.append((idx, idx + s))
        idx += s
    return out


def _label(encoding: str, raw: bytes) -> Any:
    if encoding in INT_ENCODINGS:
        return int(np.frombuffer(raw, INT_ENCODINGS[encoding])[0]) if raw else None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text


def _sample_values(sample: memoryview, sizes: list[int | None], encodings: list[str],
                   names: list[str], label: int, extra: list[int]) -> tuple[Any, dict[str, Any]]:
    """One sample's raw label and its field columns' values (MemberError, FieldRejected)."""
    columns = _sample_columns(sample, sizes)
    start, end = columns[label]
    value = _label(encodings[label], bytes(sample[start:end]))
    values = {}
    for c in extra:
        a, b = columns[c]
        values[names[c]] = decode_mds(encodings[c], bytes(sample[a:b]))
    return value, values


class _Spec:
    """What a worker needs to find one column in a shard's samples (sent as ``Item.file``)."""

    @staticmethod
    def dump(path: str, compression: str | None, column: int, sizes: list[int | None],
             encoding: str) -> str:
        return json.dumps([path, compression, column, sizes, encoding])

    @staticmethod
    def load(text: str) -> tuple[str, str | None, int, list[int | None], str]:
        path, compression, column, sizes, encoding = json.loads(text)
        return path, compression, column, sizes, encoding


def _shard_bytes(path: str, compression: str | None, where: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    return _decompress(data, compression, where) if compression else data


def _offsets(data: bytes | memoryview, expected: int, where: str) -> np.ndarray:
    if len(data) < 4:
        raise PackError(f"{where}: not an MDS shard (too short)")
    n = int(np.frombuffer(bytes(data[:4]), "<u4")[0])
    if n != expected or len(data) < 4 * (n + 2):
        raise PackError(f"{where}: holds {n} samples, index.json says {expected}")
    offsets = np.frombuffer(bytes(data[4:4 * (n + 2)]), "<u4").astype(np.int64)
    if (np.diff(offsets) < 0).any() or offsets[0] < 4 * (n + 2) or offsets[-1] > len(data):
        raise PackError(f"{where}: sample offsets point outside the shard")
    return offsets


class MDSSource(IndexFolderSource):
    name = "mds"
    summary = "MosaicML Streaming MDS (a folder with index.json)"
    label_names = LABEL_COLUMNS
    kinds = ("an MDS folder", "an MDS v2 index")

    def is_index(self, index: Any) -> bool:
        return isinstance(index.get("shards"), list)

    def parse_index(self, index: Any) -> list[Any]:
        shards = index["shards"]
        if index.get("version") != 2 or not isinstance(shards, list):
            raise ValueError(f"version {index.get('version')!r}, expected 2")
        return shards

    def scan_shards(self, src: str, options: SourceOptions) -> Scanned:
        folder, where, shards = self.read_index(src)
        scanned = Scanned(folder, [])
        refused: set[str] = set()
        for k, info in enumerate(shards):
            try:
                names, encodings = list(info["column_names"]), list(info["column_encodings"])
                sizes = list(info["column_sizes"])
                raw_name = info["raw_data"]["basename"]
                zipped = info.get("zip_data")
                compression = info.get("compression")
                count = int(info["samples"])
                if info.get("format") != "mds" or not len(names) == len(encodings) == len(sizes):
                    raise ValueError("not an mds shard")
            except (KeyError, TypeError, ValueError) as exc:
                raise PackError(f"{where}: shard {k} is not described as an MDS shard ({exc})"
                                ) from None
            image = self.pick_part(names, encodings, options.image_key, where, image=True)
            label = self.pick_part(names, encodings, options.label_key, where, image=False)
            for name, enc in zip(names, encodings):
                if enc == "pkl" and name not in refused:
                    refused.add(name)
                    scanned.skipped.append({"path": member_name(where, name), "reason":
                                            "pickled column refused (never loaded)"})
            raw_path = inside_folder(folder, raw_name, where)
            if compression and not os.path.exists(raw_path):
                path = inside_folder(folder, (zipped or {}).get("basename"), where)
            else:
                path, compression = raw_path, None
            rel = os.path.relpath(path, folder)
            shard = Shard(_Spec.dump(path, compression, image, sizes, encodings[image]), rel)
            try:
                data = _shard_bytes(path, compression, os.path.join(folder, rel))
            except (OSError, EOFError, ValueError) as exc:
                scanned.skipped.append({"path": os.path.join(folder, rel),
                                        "reason": f"cannot read MDS shard: {exc}"})
                scanned.shards.append(shard)
                continue
            extra = [c for c, enc in enumerate(encodings)
                     if c not in (image, label) and is_mds_field(enc)]
            self.add_samples(scanned, shard, data, _offsets(data, count, os.path.join(folder, rel)),
                             lambda sample: _sample_values(sample, sizes, encodings, names, label,
                                                           extra),
                             (MemberError, FieldRejected))
            scanned.shards.append(shard)
        return scanned

    def image_format(self, fmt: str) -> bool:
        return fmt in IMAGE_ENCODINGS

    def check_part(self, what: str, name: str, fmt: str, where: str) -> None:
        if fmt == "pkl":
            raise PackError(f"{where}: {what} column {name!r} is pickled (pkl); refusing to load "
                            "it")
        if what == "image" and fmt not in IMAGE_ENCODINGS + ("bytes",):
            raise PackError(f"{where}: image column {name!r} is {fmt!r}, not one of "
                            f"{', '.join(IMAGE_ENCODINGS)}")
        if what == "label" and fmt not in INT_ENCODINGS and fmt not in ("str", "str_int"):
            raise PackError(f"{where}: label column {name!r} is {fmt!r}, not an integer or str "
                            "column")

    @staticmethod
    def read(file: str, a: int, b: int, limit: int | None) -> bytes:
        path, compression, column, sizes, encoding = _Spec.load(file)
        try:
            if compression:
                data = _decompressed(path, compression)
                begin, end = np.frombuffer(data[4 * (1 + a):4 * (3 + a)], "<u4").tolist()
                sample = data[begin:end]
            else:
                f = open_cached(path)
                begin, end = np.frombuffer(f.pread(4 * (1 + a), 8), "<u4").tolist()
                if limit is not None and end - begin > limit + 64:
                    raise MemberError(f"sample of {end - begin} bytes is larger than any image "
                                      "within --max-pixels can be")
                sample = f.pread(begin, end - begin)
            if end < begin or len(sample) != end - begin:
                raise MemberError("truncated sample")
            start, stop = _sample_columns(sample, sizes)[column]
        except (OSError, ValueError, EOFError) as exc:
            raise MemberError(f"cannot read sample: {exc}") from None
        value = bytes(sample[start:stop])
        return pil_as_file(value) if encoding == "pil" else value


_last: dict[str, Any] = {}


def _decompressed(path: str, compression: str) -> bytes:
    key = (os.getpid(), path)
    if _last.get("key") != key:
        _last.clear()
        _last.update(key=key, data=_shard_bytes(path, compression, path))
    return _last["data"]
