"""A store's metadata parsed and checked in full: what :mod:`shardkit.metadata` checks (format,
version, index arrays, shard entries), then the typed fields' declarations and columns
(:func:`shardkit.fields.check_meta`) and a bucketed store's ``buckets``
(:func:`shardkit.bucketmeta.check`). ``metadata`` sits below ``fields`` (which uses its
checksums), so the two checks meet here, above both; every reader of a store parses through
this module.
"""

from __future__ import annotations

from typing import Any

from . import bucketmeta, metadata, versionmeta
from .fields import added, check_meta


def parse_shard_meta(raw: bytes | str, where: str) -> dict[str, Any]:
    """A shard's (or single-file store's) metadata; StoreError naming ``where`` if it is not
    one shardkit can read."""
    obj = metadata.parse_shard_meta(raw, where)
    check_meta(obj, where)
    bucketmeta.check(obj, where)
    return obj


def parse_manifest(raw: bytes | str, where: str) -> dict[str, Any]:
    """A folder store's ``manifest.json``; StoreError naming ``where`` if it is not one
    shardkit can read."""
    obj = metadata.parse_manifest_layout(raw, where)
    versionmeta.check_record(obj, where)
    check_meta(obj, where)
    added.check(obj, where)
    bucketmeta.check(obj, where)
    return obj
