"""The pack side: image folders in, stores out. Imports only shardkit's core, never the reader.

* :mod:`.api`          ``pack``, ``merge``, ``PackResult``: check options, plan, run, install
* :mod:`.settings`     ``PackSettings`` (per-image transform) and small records (``Skipped``)
* :mod:`.discovery`    find sources and labels (torchvision ``ImageFolder`` rules, file lists)
* :mod:`.imaging`      decode one source safely (limits, EXIF, colour) · :mod:`.resize` the kernel
* :mod:`.plan`         ``Plan``: sources and shard boundaries, fixed before encoding
* :mod:`.writer`       ``StoreWriter``: write a store (or one shard) record by record
* :mod:`.workers`      an encoding process: ``encode_file`` per source; how one is started
* :mod:`.stream`       ``WorkerStream``: drives the encoding processes, records in source order
* :mod:`.local`        the local engine; ``pack_shard`` (one shard in this process)
* :mod:`.dask_engine`  the Dask engine (one task per shard)
* :mod:`.staging`      the partial folder: plan, per-shard entries (resume), manifest merge
* :mod:`.install`      move a finished store into OUT without disturbing its readers
* :mod:`.console`      Ctrl-C deferral and the progress bar
"""

from .api import PackResult, merge, pack
from .settings import PackSettings, Skipped
from .writer import StoreWriter

__all__ = ["PackResult", "PackSettings", "Skipped", "StoreWriter", "merge", "pack"]
