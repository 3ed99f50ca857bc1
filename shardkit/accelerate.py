"""accelerate integration: ``shardkit.accelerate.prepare(accelerator, *objects)`` in place of
``accelerator.prepare(*objects)`` for scripts whose loaders come from ``ds.loader(...)`` (needs
``pip install accelerate``). See :mod:`shardkit.integrations.accelerate`."""

from .integrations.accelerate import AcceleratedLoader, prepare

__all__ = ["AcceleratedLoader", "prepare"]
