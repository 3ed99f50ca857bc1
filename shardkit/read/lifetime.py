"""Workers of the loaders that ``ShardDataset.loader`` made end cleanly at interpreter exit.

``ds.loader`` keeps its workers alive between epochs (``persistent_workers=True``), so they are
still running when a script ends. multiprocessing's exit hook would then terminate them, and
torch's SIGCHLD handler reports that as "DataLoader worker (pid N) is killed by signal:
Terminated" ("Exception ignored in atexit callback"). An exit hook of ours, registered after
multiprocessing's and so run before it, shuts them down first, as deleting the loader would.
"""

from __future__ import annotations

import atexit
import os
import weakref

from torch.utils.data import DataLoader

_LOADERS: weakref.WeakKeyDictionary[DataLoader, int] = weakref.WeakKeyDictionary()
_HOOKED = False


def track(loader: DataLoader) -> DataLoader:
    """Shut ``loader``'s persistent workers down at exit (in the process that made it)."""
    global _HOOKED
    if not _HOOKED:
        atexit.register(_shut_down)
        _HOOKED = True
    _LOADERS[loader] = os.getpid()
    return loader


def _shut_down() -> None:
    pid = os.getpid()
    for loader, owner in list(_LOADERS.items()):
        # The workers' iterator's own shutdown, which torch runs when the loader is deleted
        # (a forked child's copy of a loader is not its to shut down).
        stop = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
        if owner == pid and stop is not None:
            stop()
