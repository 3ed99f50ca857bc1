"""Who is reading a shardkit sampler or loader: refusing the trainers' loader rebuilds that would
silently split a rank's share again or drop a loader's engine and resume state.

Hugging Face accelerate's ``Accelerator.prepare`` (and ``prepare_data_loader``,
``skip_first_batches``) rebuilds a DataLoader as one of its own, around the old loader's batch
sampler: with several processes wrapped in a ``BatchSamplerShard`` that keeps every
``num_processes``-th batch (a ``ShardSampler``, ``MixSampler`` or ``BucketSampler`` already
deals each rank its own share, so a rank would read a share of that share, and ranks whose counts
then differ wait for each other forever), and in any case without the ``ShardLoader`` (its
engine, ``state_dict`` and per-sample draws). The signal: the code that consumes the sampler,
past shardkit's and torch's own frames, is accelerate's. ``shardkit.accelerate.prepare`` keeps
the loader as it is instead (:mod:`shardkit.integrations.accelerate`).
"""

from __future__ import annotations

import sys

from ..errors import OptionError

#: Where to read about the way that works (every message names it).
ACCELERATE_WAY = ("prepare it with shardkit.accelerate.prepare(accelerator, ...) in place of "
                  "accelerator.prepare (docs/trainers.md, 'accelerate and diffusers')")
#: Frames of these packages are passed over: the consumer is the first frame of another one.
OWN = ("shardkit", "torch")
#: Frames looked at, at most (a sampler is a few torch frames below its consumer).
DEPTH = 24


def _package(frame) -> str:
    return str(frame.f_globals.get("__name__", "")).partition(".")[0]


def called_from_accelerate(skip: int = 1) -> bool:
    """Whether the first frame above the caller's that belongs neither to shardkit nor to torch
    is accelerate's (``skip``: frames of the caller's own to pass over first)."""
    getframe = getattr(sys, "_getframe", None)
    if getframe is None:  # pragma: no cover - not CPython: nothing to look at
        return False
    try:
        frame = getframe(skip + 1)
    except ValueError:
        return False
    for _ in range(DEPTH):
        if frame is None:
            return False
        package = _package(frame)
        if package not in OWN:
            return package == "accelerate"
        frame = frame.f_back
    return False


def check_sampler_consumer(sampler: object) -> None:
    """Raise ``OptionError`` if accelerate's rebuilt loader is reading ``sampler`` (see the
    module docstring); a no-op for every other reader."""
    if called_from_accelerate(2):
        raise OptionError(
            f"accelerate is reading this {type(sampler).__name__} through a DataLoader it "
            "rebuilt (accelerator.prepare, prepare_data_loader or skip_first_batches): with "
            "several processes each rank would read a share of its own share, and in any case "
            "without the loader's engine and resume state; build the loader with "
            f"ds.loader(...) and {ACCELERATE_WAY}")


def loader_rebuild_message(loader: object) -> str:
    """The one line ``accelerator.prepare`` gets for a ``ShardLoader``."""
    return (f"accelerator.prepare would rebuild this {type(loader).__name__} as accelerate's "
            "own DataLoader (a rank's sampler split again, the engine, state_dict and per-sample "
            f"draws lost): {ACCELERATE_WAY}")
