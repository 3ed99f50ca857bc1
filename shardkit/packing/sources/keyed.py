"""Records keyed by a column or member of their source (``id_key``): each record's key is that
value instead of its ``shard#member`` path (docs/lifecycle.md "Keys").

A key travels where a source path does (the record's path is ``SRC/<key>``), so ``ds.key(i)``,
``index_of``, appends, ``update`` and dedup use it unchanged. A record whose value is missing or
not usable as a key is skipped, with the reason, as one with a bad label is; two records with
one key are an error (an append could not tell them apart).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import PackError


def key_text(value: Any) -> tuple[str | None, str | None]:
    """(the key, None), or (None, why ``value`` cannot key a record): a string, an integer
    (in decimal) or UTF-8 bytes, that is a normalised relative path (keys are stored as source
    paths: no empty, ``.`` or ``..`` part, no leading ``/``)."""
    if value is None:
        return None, "no key (null)"
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None, "key is not UTF-8 text"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value)), None
    if not isinstance(value, str):
        return None, f"key {value!r} is not a string or an integer"
    if "\0" in value or value.startswith("/") or any(
            p in ("", ".", "..") for p in value.split("/")):
        return None, (f"key {value!r} is not usable as a key (keys are relative paths: no empty,"
                      " '.' or '..' part, no leading '/')")
    return value, None


def apply_keys(scanned: Any, id_key: str) -> None:
    """Name every sample of ``scanned`` (a :class:`.container.Scanned`) by its key (each shard's ``keys``, raw values): samples
    whose value cannot key a record move to the skip list; PackError naming both records where
    two share a key."""
    seen: dict[str, str] = {}
    for shard in scanned.shards:
        if len(shard.keys) != len(shard.members):
            raise PackError(f"{os.path.join(scanned.root, shard.name)}: no {id_key!r} value "
                            "read for its samples")  # a backend fault, never a user's
        keep = []
        for i, (member, raw) in enumerate(zip(shard.members, shard.keys)):
            key, reason = key_text(raw)
            where = os.path.join(scanned.root, member)
            if reason is not None:
                scanned.skipped.append({"path": where, "reason": f"{id_key}: {reason}"})
                continue
            if key in seen:
                raise PackError(f"{where}: key {key!r} (`id_key` {id_key!r}) is also the key of "
                                f"{seen[key]}; keys must be unique")
            seen[key] = where
            shard.members[i] = key
            keep.append(i)
        if len(keep) < len(shard.members):
            names = ("members", "refs", "labels", "keys") + (
                ("fields",) if len(shard.fields) == len(shard.members) else ())
            for name in names:
                values = getattr(shard, name)
                setattr(shard, name, [values[i] for i in keep])
