"""The thread engine, where it was first published: it lives in
:mod:`shardkit.read.loading.thread_engine` (the engine objects in
:mod:`shardkit.read.loading.engines`)."""

from ..read.loading.engines import ENGINES, Processes, Threads, check_engine, engine_loader
from ..read.loading.thread_engine import (HELD_BATCHES, PROCESS_ONLY, STOP_WAIT, ThreadLoader,
                                          default_prefetch, default_threads, warn_transforms)

__all__ = ["ENGINES", "PROCESS_ONLY", "HELD_BATCHES", "STOP_WAIT", "ThreadLoader", "Threads",
           "Processes", "check_engine", "engine_loader", "default_prefetch", "default_threads",
           "warn_transforms"]
