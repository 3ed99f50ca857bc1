"""Store-folder readers for the multi-shard, resume, Dask and sampler tests (their image trees
come from ``helpers.image_tree``)."""

from __future__ import annotations

import hashlib
import json
import os

from shardkit.read.store import Store


def manifest(store: str) -> dict:
    with open(os.path.join(store, "manifest.json"), "rb") as f:
        return json.loads(f.read())


def shard_digests(store: str) -> list[tuple[str, int, str]]:
    """(file, count, sha256) of every shard, from the manifest."""
    return [(e["file"], e["count"], e["sha256"]) for e in manifest(store)["shards"]]


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def store_files(store: str) -> dict[str, str]:
    """Every file of a store folder -> its sha256."""
    return {name: sha256(os.path.join(store, name)) for name in sorted(os.listdir(store))}


def partial_of(out: str) -> str:
    head, tail = os.path.split(os.path.abspath(out))
    return os.path.join(head, f".{tail}.partial")


def records(store: str) -> list[tuple]:
    """(record bytes, label, height, width, source path relative to the root), index order."""
    s = Store(store)
    try:
        out = []
        for k, entry in enumerate(s.shards):
            shard = s.shard(k)
            with shard.reader.records() as get:
                out += [(bytes(get(i)), int(shard.labels[i]), int(shard.heights[i]),
                         int(shard.widths[i]), shard.source_path(i)) for i in range(entry.count)]
        return out
    finally:
        s.close()
