"""``verify``'s check of a folder store's kept versions (:mod:`shardkit.versions`): each one
opens, its side files (labels, layout, live records, added fields' columns) match their
checksums and shapes, and the shard files only earlier versions use match theirs. The current
version's shards are decoded by ``verify`` itself."""

from __future__ import annotations

import os
from typing import Callable

from .. import versions
from ..errors import StoreError
from ..fileutil import sha256_file
from .addedcols import AddedColumns
from .store import Store
from .storeview import StoreView, live_records


def verify_versions(path: str, checked: set[str], fault: Callable[[str], None]) -> int:
    """Check every kept version of the local folder store ``path``; ``checked``: shard files
    already verified (their names). Returns how many versions were checked."""
    if not os.path.isdir(path):
        return 0
    kept = versions.numbers(path)
    for number in kept:
        try:
            store = Store(path, version=number)
        except StoreError as exc:
            fault(f"version {number}: {exc}")
            continue
        try:
            store.labels  # checked against the manifest's checksum and count
            if "layout" in store.meta:
                StoreView(store).layout
            if "records" in store.meta:
                live_records(store)
            cols = AddedColumns(store)
            for f in cols.schema:
                cols.rows(f.name)
            for entry in store.meta["shards"]:
                name = entry["file"]
                if name in checked:
                    continue
                full = os.path.join(path, name)
                if not os.path.exists(full):
                    fault(f"version {number}: shard file {name} is missing")
                elif sha256_file(full) != entry["sha256"]:
                    fault(f"version {number}: shard file {name} is damaged (checksum differs "
                          "from the manifest)")
                checked.add(name)
        except StoreError as exc:
            fault(f"version {number}: {exc}")
        finally:
            store.close()
    return len(kept)
