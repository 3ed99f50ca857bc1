"""A sharded store's ``manifest.json`` written from a spool file of its shards' records, so the
merging process holds no object per shard: each shard's record is appended to the spool as its
canonical JSON (:func:`ShardSpool.add`) while the entries are read, and the manifest's text is
streamed from it, sealed as :func:`shardkit.metadata.seal` seals it: the same bytes as
``metadata.dumps(metadata.seal(manifest))`` with the whole list in memory."""

from __future__ import annotations

import os
import uuid
import zlib
from collections.abc import Sequence
from typing import Any, Iterator

from .. import metadata
from ..fileutil import remove

SPOOL_NAME = "manifest-shards.spool"  # in the partial folder; a killed merge's is removed
_MARK = "\x00shards\x00"  # where the list goes; no class name or setting holds a NUL


class ShardSpool:
    """The shards' records of a manifest, in order, one canonical JSON line each on disk."""

    def __init__(self, partial: str) -> None:
        self.path = os.path.join(partial, SPOOL_NAME)
        self._file = open(self.path, "wb")
        self.count = 0

    def add(self, record: dict[str, Any]) -> None:
        line = metadata.dumps(record)
        if metadata.longest_string(line) > metadata.MAX_STRING_BYTES:
            raise ValueError(f"metadata holds a string of over {metadata.MAX_STRING_BYTES} "
                             "bytes, the most a store may hold")
        self._file.write(line + b"\n")
        self.count += 1

    def _list(self) -> Iterator[bytes]:
        """The JSON text of the list, in pieces (as ``json.dumps`` joins a list's items)."""
        yield b"["
        with open(self.path, "rb") as f:
            for i, line in enumerate(f):
                yield (b", " if i else b"") + line[:-1]
        yield b"]"

    def write(self, path: str, manifest: dict[str, Any]) -> None:
        """Write ``manifest`` (without ``shards``) with the spooled list as its ``shards``,
        sealed, to ``path`` (synced, replaced whole); the spool is removed."""
        self._file.close()
        body = {k: v for k, v in manifest.items() if k != metadata.SEAL_KEY}
        head, tail = _split(body)
        crc = zlib.crc32(head)
        for piece in self._list():
            crc = zlib.crc32(piece, crc)
        crc = zlib.crc32(tail, crc)
        head, tail = _split(body | {metadata.SEAL_KEY: crc})
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(head)
                for piece in self._list():
                    f.write(piece)
                f.write(tail)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            remove(tmp)
        remove(self.path)

    def close(self) -> None:
        self._file.close()
        remove(self.path)


def _split(body: dict[str, Any]) -> tuple[bytes, bytes]:
    """The canonical JSON of ``body`` with ``shards`` left out: the text before and after
    where the list goes."""
    raw = metadata.dumps(body | {"shards": _MARK})
    if metadata.longest_string(raw) > metadata.MAX_STRING_BYTES:
        raise ValueError(f"metadata holds a string of over {metadata.MAX_STRING_BYTES} bytes, "
                         "the most a store may hold")
    mark = metadata.dumps({"": _MARK})[len(b'{"": '):-1]
    if raw.count(mark) != 1:
        raise ValueError("a manifest's text holds the shards' placeholder")
    head, _, tail = raw.partition(mark)
    return head, tail


class ShardCount(Sequence):
    """A merged manifest's ``shards`` as the merge returns it: their number (the records
    themselves are in the manifest file)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        raise TypeError("the shards' records are in the store's manifest.json")
