"""LitData's optimized folders (``litdata.optimize``, ``BinaryWriter``), read without litdata:
an ``index.json`` whose ``config`` gives each leaf's serializer (``data_format``) and the
samples' structure (``data_spec``), and whose ``chunks`` list each chunk file and its item count.

A chunk file is ``[n: u32] [offsets: u32 x (n+1)] [items]``; an item is the u32 byte size of
each leaf, then each leaf's bytes in leaf order. Leaves are named by the keys of a flat dict
sample (``{"image": ..., "label": ...}``), else by position (``"0"``, ``"1"``...).

Images: ``jpeg`` (the file's bytes), ``pil`` (raw pixels with their mode), ``image:<ext>`` and
``file:<image ext>`` (the file's bytes); the default is the first image leaf. Labels: an ``int``
or ``str`` leaf, by default the first of ``label;labels;cls;class;y``. Further ``int``,
``float`` and ``str`` leaves become typed fields. Any other serializer (``pickle`` above all:
nothing is ever unpickled) refuses the folder with one line naming the leaf and its
serializer; so do compressed or encrypted chunks and item loaders other than ``PyTreeLoader``.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from ...errors import PackError
from .base import MemberError, SourceOptions
from .container import IndexFolderSource, Scanned, Shard, inside_folder, pil_as_file
from .files import open_cached

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm")
LABEL_LEAVES = ("label", "labels", "cls", "class", "y")
SCALARS = {"int": "<q", "float": "<d"}  # LitData's IntegerSerializer / FloatSerializer


def is_image(serializer: str) -> bool:
    kind, _, ext = serializer.partition(":")
    return kind in ("jpeg", "pil") or (kind in ("image", "file") and ext in IMAGE_EXTENSIONS)


def _leaf_value(serializer: str, raw: bytes) -> Any:
    if serializer in SCALARS:
        if len(raw) != 8:
            raise MemberError(f"{serializer} leaf of {len(raw)} bytes, not 8")
        return struct.unpack(SCALARS[serializer], raw)[0]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MemberError("str leaf is not UTF-8") from None


def _leaf_names(spec: Any, count: int, where: str) -> list[str]:
    """The names of a sample's leaves: a flat dict's keys, else their positions."""
    try:
        node = json.loads(spec)[1] if isinstance(spec, str) else None
        if (isinstance(node, dict) and str(node.get("type", "")).endswith("dict")
                and all(not c.get("children_spec") for c in node.get("children_spec", []))):
            names = json.loads(node["context"])
            if isinstance(names, list) and len(names) == count:
                return [str(n) for n in names]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        pass
    return [str(i) for i in range(count)]


def _item_leaves(item: bytes | memoryview, count: int) -> list[tuple[int, int]]:
    """(start, end) of each leaf's bytes within one item."""
    if len(item) < 4 * count:
        raise MemberError("item shorter than its leaf sizes")
    sizes = struct.unpack_from(f"<{count}I", item, 0)
    out, at = [], 4 * count
    for size in sizes:
        if at + size > len(item):
            raise MemberError("a leaf runs past the end of its item")
        out.append((at, at + size))
        at += size
    return out


def _item_values(item: memoryview, formats: list[str], names: list[str], label: int,
                 extra: list[int]) -> tuple[Any, dict[str, Any]]:
    """One item's raw label and its other leaves' values (MemberError for a broken one)."""
    leaves = _item_leaves(item, len(formats))
    a, b = leaves[label]
    value = _leaf_value(formats[label], bytes(item[a:b]))
    return value, {names[c]: _leaf_value(formats[c], bytes(item[s:e]))
                   for c in extra for s, e in [leaves[c]]}


class LitDataSource(IndexFolderSource):
    name = "litdata"
    summary = "a LitData optimized folder (index.json with chunk-*.bin files)"
    part = ("leaf", "leaves")
    kinds = ("a LitData folder", "a LitData index")
    label_names = LABEL_LEAVES

    def is_index(self, index: Any) -> bool:
        return isinstance(index.get("chunks"), list) and isinstance(index.get("config"), dict)

    def parse_index(self, index: Any) -> tuple[dict[str, Any], list[Any], list[str]]:
        config, chunks = index["config"], index["chunks"]
        formats = [str(s) for s in config["data_format"]]
        if not isinstance(chunks, list):
            raise ValueError("'chunks' is not a list")
        return config, chunks, formats

    def scan_shards(self, src: str, options: SourceOptions) -> Scanned:
        folder, where, (config, chunks, formats) = self.read_index(src)
        for key, allowed in (("compression", (None,)), ("encryption", (None,)),
                             ("item_loader", (None, "PyTreeLoader"))):
            if config.get(key) not in allowed:
                raise PackError(f"{where}: {key} {config.get(key)!r} is not supported (only "
                                "uncompressed, unencrypted PyTreeLoader chunks are read)")
        names = _leaf_names(config.get("data_spec"), len(formats), where)
        for name, serializer in zip(names, formats):
            if not (is_image(serializer) or serializer in ("int", "float", "str")
                    or name in (options.image_key, options.label_key)):
                raise PackError(f"{where}: leaf {name!r} uses the {serializer!r} serializer, "
                                "which shardkit does not read (never unpickled); only images "
                                "(jpeg, pil, image, file), int, float and str leaves are")
        image = self.pick_part(names, formats, options.image_key, where, image=True)
        label = self.pick_part(names, formats, options.label_key, where, image=False)
        extra = [c for c in range(len(formats)) if c not in (image, label)]
        scanned = Scanned(folder, [])
        for k, info in enumerate(chunks):
            try:
                file, count = info["filename"], int(info["chunk_size"])
            except (KeyError, TypeError, ValueError) as exc:
                raise PackError(f"{where}: chunk {k} is not described ({exc})") from None
            path = inside_folder(folder, file, where)
            rel = os.path.relpath(path, folder)
            spec = json.dumps([path, image, len(formats), formats[image]])
            shard = Shard(spec, rel)
            scanned.shards.append(shard)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                scanned.skipped.append({"path": path, "reason": "cannot read LitData chunk: "
                                                                f"{exc.strerror or exc}"})
                continue
            self.add_samples(scanned, shard, data, _offsets(data, count, path),
                             lambda item: _item_values(item, formats, names, label, extra))
        return scanned

    def image_format(self, fmt: str) -> bool:
        return is_image(fmt)

    def check_part(self, what: str, name: str, fmt: str, where: str) -> None:
        if what == "image" and not (is_image(fmt) or fmt == "bytes"):
            raise PackError(f"{where}: image leaf {name!r} uses the {fmt!r} serializer, not an "
                            "image one (jpeg, pil, image, file)")
        if what == "label" and fmt not in ("int", "str"):
            raise PackError(f"{where}: label leaf {name!r} uses the {fmt!r} serializer, not int "
                            "or str")

    @staticmethod
    def read(file: str, a: int, b: int, limit: int | None) -> bytes:
        path, leaf, count, serializer = json.loads(file)
        try:
            f = open_cached(path)
            begin, end = struct.unpack("<2I", f.pread(4 * (1 + a), 8))
            if end < begin:
                raise MemberError("item offsets out of order")
            if limit is not None and end - begin > limit + 4 * count + 64:
                raise MemberError(f"item of {end - begin} bytes is larger than any image within "
                                  "--max-pixels can be")
            item = f.pread(begin, end - begin)
            if len(item) != end - begin:
                raise MemberError("truncated item")
            start, stop = _item_leaves(item, count)[leaf]
        except (OSError, struct.error) as exc:
            raise MemberError(f"cannot read item: {exc}") from None
        value = item[start:stop]
        return pil_as_file(value) if serializer == "pil" else value


def _offsets(data: bytes, expected: int, where: str) -> np.ndarray:
    if len(data) < 4:
        raise PackError(f"{where}: not a LitData chunk (too short)")
    n = struct.unpack_from("<I", data, 0)[0]
    if n != expected or len(data) < 4 * (n + 2):
        raise PackError(f"{where}: holds {n} items, index.json says {expected}")
    offsets = np.frombuffer(data, "<u4", n + 1, 4).astype(np.int64)
    if (np.diff(offsets) < 0).any() or offsets[0] < 4 * (n + 2) or offsets[-1] > len(data):
        raise PackError(f"{where}: item offsets point outside the chunk")
    return offsets
