"""``ShardLoader``: the ``torch.utils.data.DataLoader`` that ``ShardDataset.loader`` returns.

It behaves as the DataLoader built from the same arguments, plus:

- ``state_dict()`` / ``load_state_dict()`` in the protocol Lightning (2.x) and torchdata's
  ``StatefulDataLoader`` use: the state counts the batches the training loop has *received* from
  this loader in the current epoch (not what workers prefetched), so a checkpoint written
  after step ``k`` resumes at batch ``k + 1`` of that epoch, exactly, with no user code. With a
  ``ShardSampler`` the state is the sampler's own (so it also resumes at another world size
  that divides its ``num_canonical``, and with ``load_state_dict(state, across_versions=True)``
  on the records a later store version shares with the saved one); with another sampler the
  loader skips the consumed batches' indices (no decoding) after restoring the epoch, or the
  generator of a ``RandomSampler``. A sampler whose order cannot be reproduced is refused at resume.
- ``len(loader)`` stays the epoch's full batch count after a resume (what Lightning expects).
- It refuses to iterate when its sampler is a wrapper around a ``ShardSampler`` (Lightning's
  ``DistributedSamplerWrapper``, for one): the wrapper would give each rank a share of a share.
  ``accelerator.prepare`` (accelerate) is refused when it asks, before rebuilding the loader as
  its own (see :mod:`shardkit.integrations.accelerate`).
- ``normalize=(mean, std)``, ``device``: normalised float batches (see ``output``).
- One reproducible stream: it tags every index it hands out with its sample's draw seed, a
  function of the loader's seed, the epoch and the sample's place in the epoch
  (:mod:`shardkit.read.draws`), so a ``ShardDataset``'s random crops and flips are the same on
  any number of workers or threads, on any engine, and after a resume (torch's own ``Subset``
  and ``ConcatDataset`` lose the seeds: around a dataset that draws they are refused, naming
  ``ds.subset`` and ``shardkit.Mix``, which keep them). The seed is the
  ``generator``'s ``initial_seed()`` if one was passed, else ``torch.initial_seed()``, taken as
  each epoch's iterator starts; ``state_dict()`` saves it, and ``load_state_dict()`` pins it for
  every later epoch of this loader (a resumed run draws what the uninterrupted one drew).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import (DataLoader, DistributedSampler, RandomSampler, SequentialSampler,
                              SubsetRandomSampler, WeightedRandomSampler)

from ...errors import OptionError
from .. import draws
from ..buckets import BucketSampler
from ..consumers import called_from_accelerate, loader_rebuild_message
from ..sampler import OrderedSampler
from .output import BatchOutput, WorkerOutput

STATE_VERSION = 1


def wrapped_sampler(sampler: Any) -> Any:
    """The ``OrderedSampler`` (``ShardSampler``...) that ``sampler`` wraps, if it is a wrapper."""
    if sampler is None or isinstance(sampler, OrderedSampler):
        return None
    dataset = getattr(sampler, "dataset", None)  # Lightning: DistributedSamplerWrapper.dataset
    for inner in (getattr(sampler, "sampler", None), getattr(sampler, "_sampler", None),
                  getattr(dataset, "_sampler", None), getattr(dataset, "sampler", None)):
        if isinstance(inner, OrderedSampler):
            return inner
    return None


def check_not_wrapped(loader: DataLoader) -> None:
    """Raise if the loader's sampler wraps a ShardSampler (never train a fraction silently)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (loader.sampler, getattr(batch_sampler, "sampler", None)):
        inner = wrapped_sampler(sampler)
        if inner is not None:
            raise OptionError(
                f"this loader's sampler is a {type(sampler).__name__} wrapped around a "
                f"{type(inner).__name__}: each rank would read 1/{inner.num_replicas} of its "
                "own share. Use the ShardSampler as the loader's sampler (Lightning leaves a "
                "DistributedSampler, which ShardSampler is, as it is; with "
                "Trainer(use_distributed_sampler=False) it never wraps)")


def _reproducible(sampler: Any) -> bool:
    """Whether ``sampler`` gives the same order again (so consumed batches can be skipped)."""
    if isinstance(sampler, (DistributedSampler, SequentialSampler, range, list, tuple)):
        return True
    if isinstance(sampler, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)):
        return getattr(sampler, "generator", None) is not None
    return False


class _Progress:
    """Where the loader is in its epoch (batches handed to the loop) and what a resume set."""

    def __init__(self) -> None:
        self.batches = 0         # batches handed to the training loop this epoch
        self.sizes: list[int] = []  # cumulative samples of the epoch's batches, as indexed
        self.base_batches = 0    # batches a resume already counts (kind "sampler")
        self.base_samples = 0    # samples those batches held
        self.epoch: Any = None   # the sampler's epoch this iteration runs
        self.rng_start: torch.Tensor | None = None  # a RandomSampler generator at epoch start
        self.pending: dict[str, Any] | None = None  # a loaded "skip" state, for the next epoch
        self.armed = False       # a ShardSampler was resumed: the next iteration continues it
        self.in_resume = False   # this iteration continues a resumed ShardSampler epoch
        self.resume_epoch: Any = None
        self.pinned_seed: int | None = None  # the draw seed a resume restored (None: live)
        self.draw_seed: int | None = None    # the draw seed of the iteration under way
        self.draw_epoch: int | None = None   # its draw epoch
        self.draw_next = 0       # epochs started, for a sampler without an epoch of its own

    def seed_now(self, generator: torch.Generator | None) -> int:
        """The draw seed an iteration starting now takes (see ``ShardLoader``)."""
        if self.pinned_seed is not None:
            return self.pinned_seed
        return generator.initial_seed() if generator is not None else torch.initial_seed()

    def start_draws(self, generator: torch.Generator | None, epoch: Any) -> tuple[int, int]:
        """An iteration starts: its draw seed and epoch (the sampler's ``epoch`` if it has
        one, else the count of iterations started before)."""
        self.draw_seed = self.seed_now(generator)
        counted, self.draw_next = self.draw_next, self.draw_next + 1
        self.draw_epoch = int(epoch) if isinstance(epoch, int) else counted
        return self.draw_seed, self.draw_epoch


class _Keys:
    """What keys a loader's draws (:mod:`shardkit.read.draws`): its ``generator`` (the seed)
    and the samplers that give each sample its epoch and place."""

    def __init__(self, generator: torch.Generator | None, sampler: Any,
                 batch_sampler: Any) -> None:
        self.generator = generator
        self.batch_sampler = batch_sampler
        # the sampler whose indices the batches hold
        self.source = sampler if batch_sampler is None else getattr(batch_sampler, "sampler",
                                                                    None)

    def epoch(self) -> Any:
        for sampler in (self.batch_sampler, self.source):
            epoch = getattr(sampler, "epoch", None)
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                return epoch
        return None

    def places(self) -> tuple[int, int, int]:
        """``(first, step, unit)``: with ``unit`` 0 the epoch's ``k``-th sample is at place
        ``first + k * step``; else batch ``b`` (a sampler dealing whole batches, as
        ``BucketSampler``) is at ``first + b * step`` and its ``j``-th sample at that place
        times ``unit`` (its batch size) plus ``j``. Under a ``ShardSampler`` (or other
        ``OrderedSampler``) the place in the global sequence every world size shares; under a
        ``DistributedSampler`` its place in the sampler's list for all ranks; else ``k``."""
        if isinstance(self.batch_sampler, OrderedSampler):
            first, step = self.batch_sampler.global_places()
            return first, step, max(int(getattr(self.batch_sampler, "batch_size", 1)), 1)
        if isinstance(self.source, OrderedSampler):
            return (*self.source.global_places(), 0)
        if isinstance(self.source, DistributedSampler):
            return int(self.source.rank), int(self.source.num_replicas), 0
        return 0, 1, 0


class _Resuming:
    """The loader's index sampler, wrapped: counts each batch's samples, restores a
    RandomSampler's generator, skips the batches a resume says were consumed and tags each
    batch with its samples' draw seeds (:mod:`shardkit.read.draws`).

    It holds the loader's progress and samplers, never the loader: a persistent-workers loader
    keeps its iterator, which keeps this, and a reference back would make a cycle that only the
    cyclic GC frees (the workers, their open shards and batch memory lived on until then).
    """

    def __init__(self, inner: Any, progress: _Progress, samplers: tuple[Any, ...],
                 keys: _Keys | None = None) -> None:
        self.inner = inner
        self.progress = progress
        self.samplers = samplers
        self.keys = keys

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[Any]:
        progress = self.progress
        generator = _generator_of(self.samplers)
        skip = 0
        pending, progress.pending = progress.pending, None
        if pending is not None and pending["kind"] == "skip":
            if generator is not None and pending.get("rng") is not None:
                generator.set_state(pending["rng"])
            skip = 0 if pending["complete"] else pending["batches"]
        progress.rng_start = None if generator is None else generator.get_state()
        progress.sizes = []
        total = 0
        keys = self.keys
        if keys is not None:
            seed, epoch = progress.start_draws(keys.generator, keys.epoch())
            first, step, unit = keys.places()
        for number, batch in enumerate(self.inner):
            size = len(batch) if hasattr(batch, "__len__") else 1
            if number >= skip and keys is not None:
                batch = (draws.tag(batch, seed, epoch, first, step, total) if not unit else
                         draws.tag(batch, seed, epoch, (first + number * step) * unit, 1, 0))
            total += size
            progress.sizes.append(total)
            if number >= skip:
                yield batch


def _generator_of(samplers: tuple[Any, ...]) -> torch.Generator | None:
    """The ``torch.Generator`` of the first of ``samplers`` that has one."""
    for sampler in samplers:
        generator = getattr(sampler, "generator", None)
        if isinstance(generator, torch.Generator):
            return generator
    return None


class ShardLoader(DataLoader):
    """A ``DataLoader`` with a resumable position and opt-in normalised output.

    Args:
        dataset, batch_size, **kwargs: as ``torch.utils.data.DataLoader``.
        normalize: ``(mean, std)``: yield ``[float images, labels]`` normalised as
            ``images.float() / 255`` then ``v2.Normalize(mean, std)``, in ``memory_format``
            (contiguous NCHW by default), instead of uint8 ``[B, 3, H, W]`` channels-last views.
        device: move the uint8 batch there before converting (needs ``normalize``).
        dtype: the float type of normalised batches.
        memory_format: ``torch.contiguous_format`` or ``torch.channels_last``.
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, *args: Any,
                 normalize: Any = None, device: Any = None, dtype: torch.dtype = torch.float32,
                 memory_format: torch.memory_format = torch.contiguous_format,
                 **kwargs: Any) -> None:
        if isinstance(kwargs.get("sampler"), BucketSampler):  # its items are whole batches
            raise OptionError("sampler: a BucketSampler yields batches; pass it as "
                              "batch_sampler=, with no batch_size, shuffle or drop_last")
        draws.check_carried(dataset)  # the draw seeds reach every dataset that draws
        super().__init__(dataset, batch_size, *args, **kwargs)
        self._output = BatchOutput.make(normalize, device, dtype, memory_format)
        if self._output is not None:
            self._output.check(dataset)
        self._loop_output = self._output  # what the loop applies to each batch it receives
        if self._output is not None and self._output.in_workers(dataset) \
                and self._auto_collation:
            self.collate_fn = WorkerOutput(self.collate_fn, self._output)
            self._loop_output = None
        self._progress = _Progress()
        sampler = self.sampler
        if isinstance(sampler, RandomSampler) and sampler.generator is None:
            # RandomSampler would seed a fresh generator from torch's RNG each epoch, an order
            # no checkpoint can replay; one generator seeded from that RNG once can be saved.
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            sampler.generator = torch.Generator().manual_seed(seed)
        check_not_wrapped(self)

    @property
    def _is_accelerate_prepared(self) -> bool:
        # What accelerate's Accelerator.prepare asks before it rebuilds a loader as its own:
        # refused there, in one line naming the way that keeps this loader.
        if called_from_accelerate():
            raise OptionError(loader_rebuild_message(self))
        raise AttributeError("_is_accelerate_prepared")

    @property
    def normalize(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The ``(mean, std)`` batches are normalised with (None: uint8 batches)."""
        return None if self._output is None else (self._output.mean, self._output.std)

    @property
    def device(self) -> torch.device | None:
        """Where normalised batches are made (None: where the loader runs)."""
        return None if self._output is None else self._output.device

    # -- iteration ------------------------------------------------------------------------------

    @property
    def _index_sampler(self) -> Any:
        return _Resuming(super()._index_sampler, self._progress, self._samplers(),
                         _Keys(self.generator, self.sampler, self.batch_sampler))

    def _samplers(self) -> tuple[Any, ...]:
        # the batch sampler itself may be an OrderedSampler (a BucketSampler, counted in batches)
        return self.sampler, self.batch_sampler, getattr(self.batch_sampler, "sampler", None)

    def _ordered(self) -> OrderedSampler | None:
        """The ShardSampler (or other OrderedSampler) this loader draws from, if any."""
        found = [s for s in self._samplers() if isinstance(s, OrderedSampler)]
        return found[0] if found else None

    def _sampler_generator(self) -> torch.Generator | None:
        return _generator_of(self._samplers())

    def _epoch(self) -> Any:
        for sampler in self._samplers():
            if hasattr(sampler, "epoch"):
                return sampler.epoch
        return None

    def __iter__(self) -> Iterator[Any]:
        check_not_wrapped(self)
        progress = self._progress
        progress.epoch = self._epoch()
        progress.draw_seed = progress.draw_epoch = None  # set as its first index is drawn
        # A ShardSampler resumed by load_state_dict yields only the rest of its epoch: the
        # batches before count as done, for this one iteration.
        progress.in_resume, progress.armed = progress.armed, False
        if not progress.in_resume:
            progress.base_batches = progress.base_samples = 0
        pending = progress.pending  # kind "skip": _Resuming applies it as the epoch starts
        progress.batches = progress.base_batches
        if pending is not None and not pending["complete"]:
            progress.batches = pending["batches"]
        return self._counted(super().__iter__())

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        progress, output = self._progress, self._loop_output
        for batch in batches:
            progress.batches += 1
            yield batch if output is None else output(batch)

    def __len__(self) -> int:
        progress, ordered = self._progress, self._ordered()
        resumed = (progress.armed or progress.in_resume) and ordered is not None \
            and ordered.epoch == progress.resume_epoch
        return super().__len__() + (progress.base_batches if resumed else 0)

    # -- checkpointing --------------------------------------------------------------------------

    def _consumed_samples(self) -> int:
        """Samples of the current epoch in the batches the loop has received."""
        progress = self._progress
        done = progress.batches - progress.base_batches
        if done <= 0:
            return progress.base_samples
        if done > len(progress.sizes):  # cannot happen: a batch is indexed before it is yielded
            raise RuntimeError("ShardLoader lost count of its batches")
        if self.batch_sampler is not None and self._ordered() is self.batch_sampler:
            return progress.base_samples + done  # a BucketSampler's state counts batches
        return progress.base_samples + progress.sizes[done - 1]

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is in this epoch (torch-serialisable)."""
        progress = self._progress
        ordered = self._ordered()
        state: dict[str, Any] = {"version": STATE_VERSION, "batches": progress.batches,
                                 "epoch": self._epoch(), "batches_per_epoch": len(self)}
        # The draws' seed, and the draw epoch the next iteration takes (a sampler without an
        # epoch counts iterations): a resume in another process draws the same pixels.
        done = int(progress.draw_epoch is not None and progress.batches >= len(self))
        seed = progress.seed_now(self.generator) if progress.draw_seed is None \
            else progress.draw_seed
        state["draws"] = {"seed": seed, "epoch": progress.draw_next if progress.draw_epoch is None
                          else progress.draw_epoch + done}
        if ordered is not None:
            state.update(kind="sampler", samples=self._consumed_samples(),
                         sampler=ordered.state_dict(consumed=self._consumed_samples()))
            return state
        complete = progress.batches >= len(self)
        generator = self._sampler_generator()
        rng = None
        if generator is not None:  # complete: the next epoch starts from the generator as it is
            rng = generator.get_state() if complete or progress.rng_start is None \
                else progress.rng_start
        state.update(kind="skip", complete=complete, rng=rng)
        return state

    def load_state_dict(self, state: dict[str, Any], across_versions: bool = False) -> None:
        """Continue from ``state``: the next ``iter()`` yields the rest of that epoch.
        ``across_versions``: a state saved over another version of the store resumes on the
        records both share (the sampler's ``load_state_dict``, :mod:`shardkit.read.bridge`)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise OptionError(f"unsupported ShardLoader state {state!r:.80}")
        ordered = self._ordered()
        if across_versions and ordered is None:
            raise OptionError("across_versions needs a loader that reads with a ShardSampler "
                              f"(this one's is a {type(self.sampler).__name__})")
        kind = "sampler" if ordered is not None else "skip"
        if state.get("kind") != kind:
            raise OptionError(f"cannot resume: the state was saved with a "
                              f"{'ShardSampler' if state.get('kind') == 'sampler' else 'sampler'} "
                              f"of another kind than this loader's {type(self.sampler).__name__}")
        batches = state.get("batches")
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise OptionError(f"cannot resume: the ShardLoader state's batches must be an "
                              f"integer >= 0, got {batches!r}")
        if kind == "skip" and not isinstance(state.get("complete"), bool):
            raise OptionError("cannot resume: the ShardLoader state's complete must be true or "
                              f"false, got {state.get('complete')!r}")
        if kind == "sampler" and not isinstance(state.get("sampler"), dict):
            raise OptionError("cannot resume: the ShardLoader state has no sampler state")
        saved = state.get("draws")  # absent: a state from before draws were keyed
        if saved is not None and not (
                isinstance(saved, dict) and all(
                    isinstance(saved.get(k), int) and not isinstance(saved.get(k), bool)
                    and saved[k] >= 0 for k in ("seed", "epoch"))):
            raise OptionError("cannot resume: the ShardLoader state's draws must hold an "
                              f"integer seed and epoch >= 0, got {saved!r:.80}")
        progress = self._progress
        progress.pending = None
        progress.armed = False
        if saved is not None:
            progress.pinned_seed, progress.draw_next = saved["seed"], saved["epoch"]
            progress.draw_seed = progress.draw_epoch = None
        if ordered is not None:
            ordered.load_state_dict(state["sampler"], across_versions=across_versions)
            if len(ordered) == 0:  # the saved epoch was complete: the next one starts afresh
                ordered.set_epoch(ordered.epoch + 1)
                return
            progress.base_samples = ordered.consumed
            # Bridged from another store version, the epoch restarts at place 0 of the bridge:
            # the saved batch count is not this one's.
            same_world = ordered.num_replicas == state["sampler"].get("num_replicas") \
                and ordered.position() == state["sampler"].get("position")
            progress.base_batches = state["batches"] if same_world \
                else self._batches_for(ordered.consumed)
            progress.batches = progress.base_batches  # saving again before iterating
            progress.armed, progress.resume_epoch = True, ordered.epoch
            return
        if state.get("batches_per_epoch") != len(self):
            raise OptionError(f"cannot resume: the state is for {state.get('batches_per_epoch')} "
                              f"batches per epoch, this loader has {len(self)} (batch_size, "
                              "drop_last, the dataset or the world size changed)")
        epoch = state.get("epoch")
        setter = getattr(self.sampler, "set_epoch", None)
        if epoch is not None and setter is not None:
            setter(epoch + 1 if state["complete"] else epoch)
        if not state["complete"] and state["batches"] and not _reproducible(self.sampler):
            raise OptionError(f"cannot resume mid-epoch: {type(self.sampler).__name__} does not "
                              "give the same order again; use shardkit.ShardSampler(dataset, "
                              "num_replicas=1, rank=0) (or a sampler with a seeded generator)")
        progress.pending = dict(state)
        progress.batches = 0 if state["complete"] else state["batches"]

    def _batches_for(self, samples: int) -> int:
        """Batches that hold ``samples`` samples at this loader's batch size (another world size
        resumed: the position is in samples, its batch count follows)."""
        size = self.batch_size or 1
        return -(-samples // size)

