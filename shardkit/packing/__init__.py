"""The pack side: sources in (:mod:`.sources`), stores out. Imports only shardkit's core,
never the reader.

* :mod:`.api`          ``pack``, ``merge``, ``PackResult``: check options, plan, run, install
* :mod:`.options`      the records ``pack`` takes: ``Resize``, ``Buckets``, ``Shards``,
                       ``Local``, ``Dask``, ``Nodes`` (the sources': :mod:`.sources.specs`)
* :mod:`.shortcuts`    ``pack``'s keyword shortcuts (the CLI's flags) building those records
* :mod:`.running`      run a plan and install it (single file, sharded, resume, uploads)
* :mod:`.settings`     ``PackSettings`` (per-image transform) and small records (``Skipped``)
* :mod:`.sources`      every input of ``pack`` behind one interface and one registry (folder,
                       file list, COCO, metadata/captions, WebDataset, parquet, MDS, LitData)
* :mod:`.discovery`    the folder and file-list listings (torchvision ``ImageFolder`` rules)
* :mod:`.coco` · :mod:`.annotations`  the COCO file and metadata tables those sources read
* :mod:`.record_fields`  the interface of a source's typed fields
* :mod:`.imaging`      decode one source safely (limits, EXIF, colour) · :mod:`.resize` the kernel
* :mod:`.plan`         ``PackPlan``: sources and shard boundaries, fixed before encoding
* :mod:`.writer`       ``StoreWriter``: write a store (or one shard) record by record
* :mod:`.workers`      an encoding process: ``encode_file`` per source; how one is started
* :mod:`.stream`       ``WorkerStream``: drives the encoding processes, records in source order
* :mod:`.local`        the local engine; ``pack_shard`` (one shard in this process)
* :mod:`.dask_engine`  the Dask engine (a task per shard, or per few short ones): its run loop
* :mod:`.dask_session` its client and local cluster · :mod:`.dask_tasks` what runs on a worker
  (and the hand-over while a shard uploads) · :mod:`.dask_watch` the slow-shard watch
* :mod:`.grain`        how many shards one Dask task packs
* :mod:`.staging`      the partial folder: plan, per-shard entries (resume), manifest merge
* :mod:`.install`      move a finished store into OUT without disturbing its readers
* :mod:`.console`      Ctrl-C deferral and the progress bar
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: an encoding worker started as a fresh interpreter imports only
# ``.workers`` (and what it needs), not the planner and writer behind ``pack``.
_PUBLIC = {"PackResult": ".api", "merge": ".api", "pack": ".api", "PackSettings": ".settings",
           "Skipped": ".settings", "StoreWriter": ".writer"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
