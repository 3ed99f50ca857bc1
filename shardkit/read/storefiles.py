"""A store's files checked and measured without reading a record: the per-record arrays' shapes
against the manifest's count, the bytes a store takes on disk, and how many shard files a
process may hold open.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .. import metadata, storemeta
from ..errors import StoreError
from ..fields import added
from ..fileutil import file_size


def default_max_open_shards() -> int:
    """A quarter of this process's open-file limit (``ulimit -n``), within 8..4096: each open
    shard costs one descriptor, and a shuffled read reopens shards when fewer fit than it uses."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
    except (ImportError, OSError, ValueError):  # no such limit here (Windows)
        soft = 1024
    return max(8, min(4096, soft // 4))


def check_record_arrays(meta: dict[str, Any], local: Any, where: str) -> None:
    """A folder store's per-record files (``labels.npy``, the record layout's ``layout.npy``)
    hold as many records as the manifest's ``count``: read from their ``.npy`` headers (memory
    maps, no data read), so a manifest whose count is wrong is refused at open, before anything
    sizes memory by it. ``local(name, sha256)`` is the file's local path."""
    count = meta["count"]
    files = [(meta["labels"], (count,), "labels")]
    if "layout" in meta:
        files.append((meta["layout"], (2, count), "record layout"))
    if "records" in meta:
        files.append((meta["records"], (meta["records"]["count"],), "live records"))
    for info, shape, what in files:
        path = local(info["file"], info["sha256"])
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise StoreError(f"{what} file not found: {path}") from None
        except Exception as exc:  # noqa: BLE001 - numpy reports a bad header as many types
            raise StoreError(f"{path}: cannot load {what}: {exc}") from None
        found = tuple(arr.shape)
        del arr
        if found != shape:
            raise StoreError(f"{where}: manifest says {count} records, but {info['file']} holds "
                             f"{what} of shape {list(found)} (damaged or forged store)")


def disk_bytes(path: str) -> int:
    """Bytes of a local store's files: the file of a single-file store; the manifest and the
    files it names for a folder store (not leftovers such as shards still held by old readers)."""
    if not os.path.isdir(path):
        return file_size(path)
    manifest = os.path.join(path, metadata.MANIFEST_NAME)
    with open(manifest, "rb") as f:
        meta = storemeta.parse_manifest(f.read(), manifest)
    names = [e["file"] for e in meta["shards"]] + [
        meta[key]["file"] for key in metadata.SIDE_FILES if key in meta] + [
        e["file"] for e in added.files(meta)]
    return file_size(manifest) + sum(file_size(os.path.join(path, n)) for n in names)
