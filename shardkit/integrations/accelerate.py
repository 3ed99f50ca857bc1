"""accelerate (diffusers' training scripts, and most fine-tuning scripts): ``shardkit.accelerate``.

``Accelerator.prepare(loader)`` rebuilds a DataLoader as accelerate's own ``DataLoaderShard``
around the old loader's batch sampler, wrapped in a ``BatchSamplerShard`` that keeps every
``num_processes``-th full batch. A shardkit sampler (``ShardSampler``, ``MixSampler``,
``BucketSampler``) deals each rank its own share already, so that splits the share again (a
rank trained a fraction of its data, then ranks with different counts waited for each other
forever); and the rebuilt loader has no engine (``engine="threads"``), ``state_dict`` or
per-sample draws. So ``accelerator.prepare`` refuses a ``ShardLoader`` in one line, and a
shardkit sampler refuses to be read through a loader accelerate rebuilt
(:mod:`shardkit.read.consumers`). The way that works, in place of the script's
``accelerator.prepare(...)``::

    import shardkit.accelerate

    sampler = shardkit.BucketSampler(ds, batch_size, seed=0, num_replicas=accelerator.num_processes,
                                     rank=accelerator.process_index)
    train_dataloader = ds.loader(batch_sampler=sampler, engine="threads")
    unet, optimizer, train_dataloader, lr_scheduler = shardkit.accelerate.prepare(
        accelerator, unet, optimizer, train_dataloader, lr_scheduler)

:func:`prepare` hands every other object to ``accelerator.prepare`` and returns each shardkit
loader as an :class:`AcceleratedLoader`: the same loader (its engine, workers, sampler), with
what accelerate's own loader does:

- each batch moved to ``accelerator.device`` (``device_placement``, ``non_blocking`` as
  accelerate's), with accelerate's ``send_to_device``;
- ``set_epoch`` of its samplers at the start of every epoch (the epoch count, as accelerate's
  ``DataLoaderShard`` does, so a script that never calls it still reshuffles);
- the gradient-accumulation state: ``accelerator.accumulate`` syncs at the epoch's last batch
  (``end_of_dataloader``, found by reading one batch ahead, as accelerate does);
- its position in ``accelerator.save_state`` / ``load_state`` (``register_for_checkpointing``):
  the state is the loader's own ``state_dict()`` as it was when the loop received its latest
  batch (not one batch further, where the look-ahead is), and the epoch; ``load_state``
  continues mid-epoch at exactly the next batch. accelerate saves it from the main process only
  (diffusers calls ``save_state`` there alone), so the state must not depend on the rank: a
  shardkit sampler's does not, and :func:`prepare` checks that the ranks' draw seeds agree.

It refuses, in one line each: a loader whose sampler is not sharded for this process
(``num_replicas``, ``rank``) where accelerate runs several, ``split_batches`` and
``dispatch_batches`` (the loader's batch size is a rank's; every rank reads its own share),
tensor or context parallelism (ranks that share batches), and a plain ``DataLoader`` over a
shardkit sampler (``ds.loader`` gives the ``ShardLoader`` whose position can be saved).
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch
from accelerate.data_loader import DataLoaderStateMixin
from accelerate.state import GradientState
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader, DistributedSampler

from ..errors import OptionError
from ..read.consumers import ACCELERATE_WAY
from ..read.loading.loader import ShardLoader
from ..read.sampler import OrderedSampler

STATE_VERSION = 1
#: Draw seeds are compared modulo this (a seed may be any 64-bit number; tensors are signed).
SEED_MODULUS = (1 << 62) - 1


def _samplers(loader: Any) -> list[Any]:
    """The loader's sampler, batch sampler and the batch sampler's sampler, each once."""
    found: list[Any] = []
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (getattr(loader, "sampler", None), batch_sampler,
                    getattr(batch_sampler, "sampler", None)):
        if sampler is not None and all(sampler is not seen for seen in found):
            found.append(sampler)
    return found


def _sharded(loader: Any) -> DistributedSampler | None:
    """The sampler that gives this loader its rank's share (a shardkit sampler or torch's
    ``DistributedSampler``), if any."""
    for sampler in _samplers(loader):
        if isinstance(sampler, DistributedSampler):
            return sampler
    return None


def _check_accelerator(accelerator: Any) -> None:
    for name, why in (("split_batches", "the loader's batch size is a rank's"),
                      ("dispatch_batches", "every rank reads its own share")):
        if getattr(accelerator, name, None):
            raise OptionError(f"shardkit.accelerate.prepare: Accelerator({name}=True) is not "
                              f"supported ({why}): leave {name} off")
    config = getattr(accelerator, "parallelism_config", None)
    if config is not None and (getattr(config, "tp_enabled", False)
                               or getattr(config, "cp_enabled", False)):
        raise OptionError("shardkit.accelerate.prepare: tensor or context parallel ranks share "
                          "batches, which a shardkit sampler's ranks never do: not supported")


def _check_loader(accelerator: Any, loader: ShardLoader) -> None:
    """Refuse a loader that would not give this process exactly its own share."""
    world, rank = accelerator.num_processes, accelerator.process_index
    sampler = _sharded(loader)
    if sampler is None:
        if world > 1:
            kind = type(_samplers(loader)[0]).__name__ if _samplers(loader) else "sampler"
            raise OptionError(
                f"this loader's {kind} would give each of the {world} processes the whole "
                "dataset: build it with sampler=shardkit.ShardSampler(ds, num_replicas="
                "accelerator.num_processes, rank=accelerator.process_index) (a bucketed store: "
                "batch_sampler=shardkit.BucketSampler(ds, batch_size, num_replicas=..., "
                "rank=...))")
        return
    if (sampler.num_replicas, sampler.rank) != (world, rank):
        raise OptionError(
            f"this loader's {type(sampler).__name__} is rank {sampler.rank} of "
            f"{sampler.num_replicas}, but accelerate runs this process as rank {rank} of "
            f"{world}: build it with num_replicas=accelerator.num_processes, "
            "rank=accelerator.process_index")


def _draw_seed(loader: ShardLoader) -> int:
    """The seed the loader's next epoch draws with, unless a resume pins another (see
    :class:`shardkit.read.loading.loader.ShardLoader`)."""
    generator = loader.generator
    return generator.initial_seed() if generator is not None else torch.initial_seed()


def _draws_randomly(dataset: Any) -> bool:
    """Whether the loader's seed decides anything in the batches of ``dataset``: random crops,
    flips or views, or a per-sample transform (which may draw); a ``Mix`` when any part does.
    A dataset that does not say is taken to draw."""
    parts = getattr(dataset, "datasets", None)
    if parts is not None:
        return any(_draws_randomly(p) for p in parts)
    if getattr(dataset, "transform", None) is not None \
            or getattr(dataset, "target_transform", None) is not None:
        return True
    return bool(getattr(dataset, "random_draws", True))


def _check_seeds(accelerator: Any, loaders: Sequence[ShardLoader]) -> None:
    """Every rank's loaders that draw (:func:`_draws_randomly`) draw with the same seeds:
    accelerate saves the main process's state alone, and every rank resumes with its seed. A
    loader whose seed decides nothing is not asked (each process has its own default seed, as
    in a script without ``set_seed``). A collective: every process prepares, one value a
    loader (-1: not asked), so the ranks' tensors always match in shape."""
    if accelerator.num_processes <= 1 or not loaders:
        return
    mine = torch.tensor([_draw_seed(loader) % SEED_MODULUS
                         if _draws_randomly(loader.dataset) else -1 for loader in loaders],
                        dtype=torch.int64, device=accelerator.device)
    every = accelerator.gather(mine).reshape(accelerator.num_processes, -1)
    if not bool((every == every[0]).all()):
        raise OptionError(
            "the processes' loaders draw random crops, flips or transforms with different "
            "seeds (each process has its own torch.initial_seed() unless set_seed(seed) ran "
            "on every process, and device_specific=True makes them differ), and accelerate "
            "saves one state for all: pass generator=torch.Generator().manual_seed(seed) to "
            "ds.loader, the same seed on every process")


class AcceleratedLoader(DataLoaderStateMixin):
    """A shardkit loader as :func:`prepare` returns it (see the module docstring).

    ``loader`` is the ``ShardLoader`` itself; every attribute this class does not have is the
    loader's (``dataset``, ``sampler``, ``batch_sampler``, ``batch_size``, ...), and ``len()`` is
    its batches per epoch.
    """

    def __init__(self, loader: ShardLoader, device: torch.device | None,
                 non_blocking: bool = False, num_processes: int = 1) -> None:
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        self.num_processes = num_processes
        self.gradient_state = GradientState()
        epochs = [s.epoch for s in _samplers(loader)
                  if isinstance(getattr(s, "epoch", None), int)]
        #: The epoch the next iteration sets on the samplers.
        self.epoch = epochs[0] if epochs else 0
        self._saved: tuple[dict[str, Any], int] | None = None

    def __getattr__(self, name: str) -> Any:
        loader = self.__dict__.get("loader")
        if loader is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(loader, name)

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def total_batch_size(self) -> int:
        """Samples a step takes over all processes (accelerate's ``DataLoaderShard`` has it)."""
        size = self.loader.batch_size or getattr(self.loader.batch_sampler, "batch_size", 1)
        return int(size) * self.num_processes

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the loader's samplers now, and for the next iteration."""
        if epoch != self.epoch:
            self._saved = None
        self.epoch = int(epoch)
        self._apply_epoch()

    def _apply_epoch(self) -> None:
        for sampler in _samplers(self.loader):
            setter = getattr(sampler, "set_epoch", None)
            if setter is not None:
                setter(self.epoch)

    def begin(self) -> None:
        super().begin()
        # Padding here is whole batches of the rank's own samples, not accelerate's: there is
        # no remainder gather_for_metrics could cut correctly, so it cuts none.
        self.remainder = -1

    def __iter__(self) -> Iterator[Any]:
        self._apply_epoch()  # the epoch a resumed state holds keeps its position
        self.begin()
        try:
            batches = iter(self.loader)
            try:
                current = next(batches)
            except StopIteration:
                self.end_of_dataloader = True
                self.epoch += 1
                return
            while True:
                if self.device is not None:
                    current = send_to_device(current, self.device,
                                             non_blocking=self.non_blocking)
                state = self.loader.state_dict()  # the loop has received `current`, no more
                try:
                    following = next(batches)
                except StopIteration:
                    self.end_of_dataloader = True
                    self._saved = (state, self.epoch + 1)
                    self.epoch += 1
                    yield current
                    return
                self._saved = (state, self.epoch)
                yield current
                current = following
        finally:
            self.end()

    def state_dict(self) -> dict[str, Any]:
        """The loader's position as of the latest batch the loop received, and the epoch the
        next iteration starts (torch-serialisable; the same on every rank)."""
        if self._saved is None:
            state, epoch = self.loader.state_dict(), self.epoch
        else:
            state, epoch = self._saved
        return {"version": STATE_VERSION, "epoch": epoch, "loader": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields the rest of its epoch."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION \
                or not isinstance(state.get("loader"), dict):
            raise OptionError(f"unsupported shardkit accelerate loader state {state!r:.80}")
        epoch = state.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise OptionError("cannot resume: the shardkit accelerate loader state's epoch must "
                              f"be an integer >= 0, got {epoch!r}")
        self.loader.load_state_dict(state["loader"])
        self.epoch = epoch
        self._saved = None

    def __repr__(self) -> str:
        return f"AcceleratedLoader({self.loader!r}, device={self.device})"


def _is_shardkit(obj: Any) -> bool:
    if isinstance(obj, ShardLoader):
        return True
    if isinstance(obj, DataLoader):
        ordered = [s for s in _samplers(obj) if isinstance(s, OrderedSampler)]
        if ordered:
            raise OptionError(
                f"a torch DataLoader over a {type(ordered[0]).__name__}: make it with "
                f"ds.loader(...) (a ShardLoader, whose position can be saved) and {ACCELERATE_WAY}")
    return False


def prepare(accelerator: Any, *objects: Any,
            device_placement: Sequence[bool | None] | None = None) -> Any:
    """``accelerator.prepare(*objects)``, except that each shardkit loader (``ds.loader(...)``,
    a ``ShardLoader``) is kept, checked and returned as an :class:`AcceleratedLoader` (see the
    module docstring); the other objects go to ``accelerator.prepare`` in one call, in order.

    Args:
        accelerator: the ``accelerate.Accelerator``.
        objects: models, optimizers, loaders and schedulers, as ``accelerator.prepare`` takes.
        device_placement: one bool (or None: the accelerator's ``device_placement``) per object,
            as ``accelerator.prepare`` takes it; for a loader, whether batches move to
            ``accelerator.device``.

    Returns the objects in the order given (one object: itself, as ``accelerator.prepare``).
    """
    if device_placement is not None and len(device_placement) != len(objects):
        raise OptionError(f"device_placement must hold one value per object ({len(objects)}), "
                          f"got {len(device_placement)}")
    places = list(device_placement) if device_placement is not None else [None] * len(objects)
    mine = [i for i, obj in enumerate(objects) if _is_shardkit(obj)]
    if mine:  # refused before any model is wrapped
        _check_accelerator(accelerator)
        for i in mine:
            _check_loader(accelerator, objects[i])
        _check_seeds(accelerator, [objects[i] for i in mine])
    out = list(objects)
    others = [i for i in range(len(objects)) if i not in mine]
    if others:
        prepared = accelerator.prepare(
            *(objects[i] for i in others),
            device_placement=None if device_placement is None else [places[i] for i in others])
        prepared = prepared if len(others) > 1 else (prepared,)
        for i, obj in zip(others, prepared):
            out[i] = obj
    for i in mine:
        place = accelerator.device_placement if places[i] is None else places[i]
        wrapped = AcceleratedLoader(objects[i], accelerator.device if place else None,
                                    bool(accelerator.non_blocking), accelerator.num_processes)
        accelerator.register_for_checkpointing(wrapped)
        out[i] = wrapped
    return out[0] if len(out) == 1 else tuple(out)
