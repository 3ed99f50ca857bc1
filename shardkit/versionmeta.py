"""A folder store's ``version`` record (:mod:`shardkit.versions`), in its manifest: which
version the manifest is, its parent, when it was made and what changed."""

from __future__ import annotations

import datetime
from typing import Any

from . import metadata
from .errors import StoreError

KEY = "version"


def number_of(manifest: dict[str, Any]) -> int:
    """The version a manifest is: its ``version`` record's number, 1 for a store never changed."""
    record = manifest.get(KEY)
    return 1 if record is None else int(record["number"])


def check_record(obj: dict[str, Any], where: str) -> None:
    """A manifest's ``version`` record, if any: a number >= 1, a parent below it, a change."""
    record = obj.get(KEY)
    if record is None:
        return
    if not isinstance(record, dict):
        raise StoreError(f"{where}: version record is not an object")
    number, parent = record.get("number"), record.get("parent")
    if not _whole(number) or number < 1 or not (parent is None or (_whole(parent)
                                                                    and 1 <= parent < number)):
        raise StoreError(f"{where}: version record {record!r} is not a version number with "
                         "its parent")
    if not isinstance(record.get("change", {}), dict) or \
            not isinstance(record.get("time", ""), str):
        raise StoreError(f"{where}: version record's change or time is malformed")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def stamp(manifest: dict[str, Any], number: int, change: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` as version ``number`` (the child of ``number - 1``), made now by ``change``;
    sealed again."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    record = {"number": number, "parent": number - 1 if number > 1 else None,
              "time": now.isoformat().replace("+00:00", "Z"), "change": change}
    return metadata.seal(manifest | {KEY: record})
