"""shardkit: pack an image folder once into LMDB/HDF5 shards, then feed GPUs from them fast.

Names are imported on first use, so that the CLI does not pay for importing torch where it
needs none (info, verify, --help).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

_EXPORTS = {
    "ShardDataset": "read.dataset", "Batch": "read.dataset", "collate": "read.dataset",
    "worker_init_fn": "read.dataset", "normalize": "read.augment", "View": "read.augment",
    "Fields": "read.fieldspec",
    "ShardSampler": "read.sampler", "MixSampler": "read.mix", "Mix": "read.mix",
    "BucketSampler": "read.buckets", "Clips": "read.clips", "ClipSampler": "read.clipsampler",
    "ShardLoader": "read.loading.loader", "sample_seed": "read.draws",
    "Threads": "read.loading.engines", "Processes": "read.loading.engines",
    "pack": "packing.api", "merge": "packing.api", "PackResult": "packing.api",
    "StoreWriter": "packing.writer", "update": "packing.update",
    "UpdateResult": "packing.update", "add_field": "mapping", "AddFieldResult": "mapping",
    "compact": "compaction", "CompactResult": "compaction",
    "Resize": "packing.options", "Buckets": "packing.options", "Shards": "packing.options",
    "Local": "packing.options", "Dask": "packing.options", "Nodes": "packing.options",
    "info": "read.inspect", "verify": "read.inspect",
    "IMG_EXTENSIONS": "packing.discovery", "find_classes": "packing.discovery",
    "make_dataset": "packing.discovery",
    "ShardkitError": "errors", "PackError": "errors", "StoreError": "errors",
    "OptionError": "errors",
}

__all__ = ["__version__", *_EXPORTS, "fields", "recipes", "sources", "storelog"]


_SUBPACKAGES = ("fields", "recipes", "sources", "storelog")  # shardkit.fields.Boxes etc. without an import of their own


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
