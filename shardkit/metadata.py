"""The JSON metadata of shards and manifests: building it, and parsing it strictly.

Everything a reader trusts is checked here: the format tag, the version, the types of every field
it uses, and that array descriptions are plain numeric dtypes of the promised length. Metadata is
JSON only; nothing in a store is ever unpickled.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ._version import __version__
from .codec import ENCODINGS
from .errors import StoreError
from .jpegrows import ROW_ARRAYS

FORMAT_TAG = "shardkit"
FORMAT_VERSION = 1
FIELDS_VERSION = 2  # a store with typed fields (shardkit.fields); one without stays version 1
LAYOUT_VERSION = 3  # a folder store whose physical order is not the logical one (a manifest's
#                    `layout`, shardkit.packing.layout; fields allowed); its shards stay 1 or 2
SUPPORTED_VERSIONS = (1, 2, 3)
MANIFEST_NAME = "manifest.json"
#: A folder store's per-record files beside its shards, by manifest key: labels (logical order),
#: the record layout, and a later version's live records (:mod:`shardkit.versions`)
SIDE_FILES = ("labels", "layout", "records", "dedup")
MAX_META_BYTES = 1 << 30
#: The largest ``manifest.json`` read, checked against the file's or object's size before any of
#: it is read. A shard's entry takes about 190 bytes and a skipped source about 120, so 1M shards
#: and 1M skipped sources come to ~310 MB: 512 MiB leaves headroom over that.
MAX_MANIFEST_BYTES = 512 << 20
#: The longest string (a class name, a path, a skip reason, ...) metadata may hold: bytes as
#: written in the JSON, escapes included. Checked on the raw bytes before they are parsed, so a
#: forged 100 MB class name costs a scan, not the copies that parsing and the seal's check make
#: of it. A path or a reason is a few kB at most.
MAX_STRING_BYTES = 1 << 16

# Per-record index arrays every shard holds (name -> dtype); path_blob/path_offsets hold the
# UTF-8 (surrogate-escaped) source paths back to back.
RECORD_ARRAYS: dict[str, str] = {
    "labels": "<i8",
    "heights": "<i4",
    "widths": "<i4",
    "crc32": "<u4",
    "path_offsets": "<i8",
    "path_blob": "|u1",
}
ALLOWED_DTYPES = frozenset(RECORD_ARRAYS.values())


def dumps(obj: dict[str, Any]) -> bytes:
    """Canonical JSON (sorted keys) so identical packs give identical bytes."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=True, allow_nan=False).encode("ascii")


SEAL_KEY = "meta_crc32"


def seal(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` plus its own checksum: CRC32 of its canonical JSON (``dumps``) without the seal.

    Shard metadata and manifests are sealed, so a damaged byte that still leaves valid JSON (a
    class name, a count, a setting) is refused instead of read as different data. ValueError
    for a string over ``MAX_STRING_BYTES``, which no reader would accept: shardkit never writes
    a store it cannot read.
    """
    body = {k: v for k, v in obj.items() if k != SEAL_KEY}
    raw = dumps(body)
    if longest_string(raw) > MAX_STRING_BYTES:
        raise ValueError(f"metadata holds a string of over {MAX_STRING_BYTES} bytes, the most "
                         "a store may hold")
    return body | {SEAL_KEY: zlib.crc32(raw)}


def check_seal(obj: dict[str, Any], where: str) -> None:
    """Refuse metadata whose content does not match the checksum written with it."""
    stored = obj.get(SEAL_KEY)
    if not isinstance(stored, int) or isinstance(stored, bool):
        raise StoreError(f"{where}: metadata checksum {SEAL_KEY!r} is missing "
                         "(damaged store or not written by shardkit)")
    try:
        actual = zlib.crc32(dumps({k: v for k, v in obj.items() if k != SEAL_KEY}))
    except (TypeError, ValueError, RecursionError):
        actual = None
    if actual != stored:
        raise StoreError(f"{where}: metadata checksum mismatch (damaged store)")


def longest_string(raw: bytes) -> int:
    """The bytes of the longest string in the JSON text ``raw`` (escapes counted as written; an
    unterminated one to the end), read in blocks without copies of the text.

    A quote opens or closes a string unless an odd run of backslashes precedes it; the quotes
    that do pair up in order, the first opening. A run of backslashes longer than
    ``MAX_STRING_BYTES`` lies in a string at least that long: its length is returned then."""
    import numpy as np

    data = np.frombuffer(raw, np.uint8)
    longest, opened, block = 0, -1, 1 << 20
    for start in range(0, len(data), block):
        quotes = np.flatnonzero(data[start:start + block] == 0x22) + start
        run = np.zeros(quotes.size, np.int64)  # backslashes just before each quote
        active = np.flatnonzero(data[np.maximum(quotes - 1, 0)] == 0x5C) if start or \
            not quotes.size or quotes[0] else np.flatnonzero(
                (quotes > 0) & (data[np.maximum(quotes - 1, 0)] == 0x5C))
        k = 1
        while active.size:
            run[active] = k
            if k > MAX_STRING_BYTES:
                return k
            before = quotes[active] - 1 - k
            active = active[before >= 0]
            active = active[data[before[before >= 0]] == 0x5C]
            k += 1
        quotes = quotes[run % 2 == 0]
        if opened >= 0:
            quotes = np.concatenate(([opened], quotes))
        opens, closes = quotes[0::2], quotes[1::2]
        if closes.size:
            longest = max(longest, int((closes - opens[:closes.size]).max()) - 1)
        opened = int(opens[-1]) if opens.size > closes.size else -1
    return max(longest, len(data) - opened - 1) if opened >= 0 else longest


def loads(raw: bytes | str, where: str) -> dict[str, Any]:
    if len(raw) > MAX_META_BYTES:
        raise StoreError(f"{where}: metadata is implausibly large ({len(raw)} bytes)")
    if len(raw) > MAX_STRING_BYTES:
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        if longest_string(data) > MAX_STRING_BYTES:
            raise StoreError(f"{where}: metadata holds a string of over {MAX_STRING_BYTES} "
                             "bytes, the most shardkit writes (damaged store or not written by "
                             "shardkit)")
    try:
        obj = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"{where}: metadata is not valid JSON ({exc}); "
                         "damaged store or not written by shardkit") from None
    except RecursionError:  # shardkit's own metadata nests 4 levels at most
        raise StoreError(f"{where}: metadata nests too deeply to parse; damaged store or not "
                         "written by shardkit") from None
    if not isinstance(obj, dict):
        raise StoreError(f"{where}: metadata is not a JSON object")
    return obj


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name}")


def _shown(value: Any) -> str:
    """A field's value for an error message: short, whatever a damaged file holds there (a
    deeply nested list's repr would recurse; a huge string would flood the message)."""
    if value is None or isinstance(value, (bool, int, float)):
        text = repr(value)
    elif isinstance(value, str):
        text = repr(value[:60] + ("..." if len(value) > 60 else ""))
    else:
        return f"<a JSON {'object' if isinstance(value, dict) else 'array'}>"
    return text if len(text) <= 80 else text[:77] + "..."


def _need(obj: dict, key: str, types: type | tuple[type, ...], where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, types) or (isinstance(value, bool) and types is int):
        raise StoreError(f"{where}: metadata field {key!r} is missing or has the wrong type")
    return value


def check_header(obj: dict[str, Any], where: str, kind: str | tuple[str, ...]) -> None:
    """Format tag, version and kind: the first thing checked in any metadata."""
    if obj.get("format") != FORMAT_TAG:
        raise StoreError(f"{where}: not a shardkit store (format tag {_shown(obj.get('format'))})")
    version = obj.get("format_version")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        supported = ", ".join(map(str, SUPPORTED_VERSIONS))
        raise StoreError(f"{where}: store format version {_shown(version)} is not supported by "
                         f"shardkit {__version__} (supports version {supported}); "
                         "upgrade shardkit or re-pack the data")
    kinds = (kind,) if isinstance(kind, str) else kind
    if obj.get("kind") not in kinds:
        raise StoreError(f"{where}: metadata kind {_shown(obj.get('kind'))}, "
                         f"expected {' or '.join(kinds)}")


def check_dataset_fields(obj: dict[str, Any], where: str) -> None:
    """Fields shared by single-file stores, shards and manifests."""
    count = _need(obj, "count", int, where)
    if count < 0:
        raise StoreError(f"{where}: negative record count")
    classes = _need(obj, "classes", list, where)
    if not all(isinstance(c, str) for c in classes):
        raise StoreError(f"{where}: classes must be strings")
    class_to_idx = _need(obj, "class_to_idx", dict, where)
    if class_to_idx != {c: i for i, c in enumerate(classes)}:
        raise StoreError(f"{where}: class_to_idx does not match classes")
    settings = _need(obj, "settings", dict, where)
    if settings.get("encoding") not in ENCODINGS:
        raise StoreError(f"{where}: unknown record encoding {_shown(settings.get('encoding'))}")
    skipped = obj.get("skipped", [])
    if not isinstance(skipped, list) or not all(
            isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("reason"), str)
            for s in skipped):
        raise StoreError(f"{where}: skipped-file list is malformed")


def check_shard_fields(obj: dict[str, Any], where: str) -> None:
    """Array descriptions and the shard's position, for a shard or single-file store."""
    shard = _need(obj, "shard", dict, where)
    count = obj["count"] if obj.get("kind") == "single" else _need(shard, "count", int, where)
    for key in ("index", "count"):
        if not isinstance(shard.get(key), int) or isinstance(shard.get(key), bool) or shard[key] < 0:
            raise StoreError(f"{where}: shard field {key!r} is missing or invalid")
    if shard["count"] != count:
        raise StoreError(f"{where}: shard count disagrees with store count")
    arrays = _need(obj, "arrays", dict, where)
    for name, dtype in RECORD_ARRAYS.items():
        desc = arrays.get(name)
        if not isinstance(desc, dict) or desc.get("dtype") != dtype:
            raise StoreError(f"{where}: index array {name!r} is missing or not {dtype}")
        shape = desc.get("shape")
        if not (isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int)
                and shape[0] >= 0):
            raise StoreError(f"{where}: index array {name!r} has an invalid shape")
        expected = count + 1 if name == "path_offsets" else count
        if name != "path_blob" and shape[0] != expected:
            raise StoreError(f"{where}: index array {name!r} has {shape[0]} entries, "
                             f"expected {expected}")
        crc = desc.get("crc32")
        if not isinstance(crc, int) or isinstance(crc, bool):
            raise StoreError(f"{where}: index array {name!r} has no checksum (damaged store)")
    check_row_arrays(arrays, count, where)


def check_row_arrays(arrays: dict[str, Any], count: int, where: str) -> None:
    """The optional MCU row index of JPEG records (``jpegrows.ROW_ARRAYS``): both or neither.

    A store without it reads as before (every record decoded whole); readers that predate it
    load it as an extra index array and ignore it, so it needs no new format version."""
    present = [name for name in ROW_ARRAYS if name in arrays]
    if not present:
        return
    if len(present) != len(ROW_ARRAYS):
        raise StoreError(f"{where}: index array {present[0]!r} without its pair (damaged store)")
    for name, dtype in ROW_ARRAYS.items():
        desc = arrays[name]
        shape = desc.get("shape") if isinstance(desc, dict) else None
        if not isinstance(desc, dict) or desc.get("dtype") != dtype or not (
                isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int)
                and not isinstance(shape[0], bool) and 0 <= shape[0] < 1 << 48):
            raise StoreError(f"{where}: index array {name!r} is not a 1-d {dtype} array")
        if name == "row_offsets" and shape[0] != count + 1:
            raise StoreError(f"{where}: index array {name!r} has {shape[0]} entries, "
                             f"expected {count + 1}")
        crc = desc.get("crc32")
        if not isinstance(crc, int) or isinstance(crc, bool):
            raise StoreError(f"{where}: index array {name!r} has no checksum (damaged store)")


def describe_row_arrays(arrays: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``describe_arrays`` for the row index (``jpegrows.row_index``'s arrays)."""
    return {name: {"dtype": dtype, "shape": [int(arrays[name].shape[0])],
                   "crc32": array_crc32(arrays[name])} for name, dtype in ROW_ARRAYS.items()}


def parse_shard_meta(raw: bytes | str, where: str) -> dict[str, Any]:
    """A shard's metadata, checked except for its typed fields (:mod:`shardkit.storemeta`
    parses with those: the fields sit above this module)."""
    obj = loads(raw, where)
    check_header(obj, where, ("single", "shard"))
    check_seal(obj, where)
    check_dataset_fields(obj, where)
    check_shard_fields(obj, where)
    check_fields_version(obj, where)
    return obj


def check_fields_version(obj: dict[str, Any], where: str) -> None:
    """The format version and the presence of field declarations agree."""
    version = obj.get("format_version")
    if version != LAYOUT_VERSION and (version == FIELDS_VERSION) != ("fields" in obj):
        raise StoreError(f"{where}: format version and field declarations disagree")


def parse_manifest_layout(raw: bytes | str, where: str) -> dict[str, Any]:
    """A manifest's layout (header, seal, shard entries), checked without its typed fields:
    :func:`shardkit.storemeta.parse_manifest` parses a whole manifest."""
    from .formats import FORMATS  # here: the registry's modules import this one (fileutil)

    obj = loads(raw, where)
    check_header(obj, where, "sharded")
    check_seal(obj, where)
    check_dataset_fields(obj, where)
    check_fields_version(obj, where)
    shards = _need(obj, "shards", list, where)
    start = 0
    for k, entry in enumerate(shards):
        if not isinstance(entry, dict):
            raise StoreError(f"{where}: shard entry {k} is not an object")
        _plain_name(_need(entry, "file", str, where), where)
        if entry.get("format") not in FORMATS:
            raise StoreError(f"{where}: shard {k} has unknown format {_shown(entry.get('format'))}")
        for key in ("count", "start", "bytes"):
            _need(entry, key, int, where)
        _need(entry, "sha256", str, where)
        for key in ("index", "classes"):  # a later version's entry for an earlier shard
            if key in entry and (not isinstance(entry[key], int) or isinstance(entry[key], bool)
                                 or entry[key] < 0):
                raise StoreError(f"{where}: shard {k} has a malformed {key!r}")
        if entry["start"] != start:
            raise StoreError(f"{where}: shard {k} starts at {entry['start']}, expected {start}")
        start += entry["count"]
    if start != obj["count"]:
        raise StoreError(f"{where}: shards hold {start} records, manifest says {obj['count']}")
    labels = _need(obj, "labels", dict, where)
    _plain_name(_need(labels, "file", str, where), where)
    _need(labels, "sha256", str, where)
    check_layout(obj, where)
    if "records" in obj:  # a version that deleted or replaced records: the live ones
        records = _need(obj, "records", dict, where)
        _plain_name(_need(records, "file", str, where), where)
        _need(records, "sha256", str, where)
        if _need(records, "count", int, where) < 0:
            raise StoreError(f"{where}: live record count is negative")
    if "dedup" in obj:  # the records' hashes of pack(dedup=...), for a later append's dedup
        dedup = _need(obj, "dedup", dict, where)
        _plain_name(_need(dedup, "file", str, where), where)
        _need(dedup, "sha256", str, where)
        if dedup.get("mode") not in ("exact", "near") or not isinstance(dedup.get("threshold"),
                                                                         int):
            raise StoreError(f"{where}: dedup entry is malformed")
    if not isinstance(obj.get("labels_set", False), bool):
        raise StoreError(f"{where}: labels_set must be true or false")
    return obj


def check_layout(obj: dict[str, Any], where: str) -> None:
    """A version-3 manifest's ``layout`` (the physical order, ``layout.npy``); others have none."""
    if (obj.get("format_version") == LAYOUT_VERSION) != ("layout" in obj):
        raise StoreError(f"{where}: format version and record layout disagree")
    if "layout" in obj:
        layout = _need(obj, "layout", dict, where)
        _plain_name(_need(layout, "file", str, where), where)
        _need(layout, "sha256", str, where)
        _need(layout, "seed", int, where)
        if layout.get("order") != "mixed":
            raise StoreError(f"{where}: unknown record layout {_shown(layout.get('order'))}")


def describe_arrays(arrays: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Dtype, shape and CRC32 of each index array (numpy arrays in ``RECORD_ARRAYS`` dtypes)."""
    out = {}
    for name, dtype in RECORD_ARRAYS.items():
        arr = arrays[name]
        if arr.dtype != dtype or arr.ndim != 1:
            raise ValueError(f"index array {name!r} must be a 1-d {dtype} array")
        out[name] = {"dtype": dtype, "shape": [int(arr.shape[0])], "crc32": array_crc32(arr)}
    return out


def array_crc32(arr: Any) -> int:
    """CRC32 of an index array's bytes (C order), as stored in its description."""
    import numpy as np

    return zlib.crc32(np.ascontiguousarray(arr))


def _plain_name(name: str, where: str) -> None:
    """A file named by a manifest must lie in the store's folder: no paths, no '..'."""
    if "/" in name or "\\" in name or "\0" in name or name in ("", ".", ".."):
        raise StoreError(f"{where}: file name {name!r} in the manifest is not a plain file name")


def array_descriptions(count: int, path_blob_len: int) -> dict[str, dict[str, Any]]:
    return {name: {"dtype": dtype,
                   "shape": [path_blob_len if name == "path_blob"
                             else count + 1 if name == "path_offsets" else count]}
            for name, dtype in RECORD_ARRAYS.items()}
