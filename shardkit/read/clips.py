"""``Clips``: windows of frames of one video, each one sample ``[T, 3, H, W]``, read from a
store of video frames (``shardkit.pack(..., frames=...)``).

A clip's frames are records of its ``ShardDataset``, read in one batch (one read transaction
per shard; a video's frames lie together in one shard) and decoded as that dataset decodes
them: with its ``crop``/``crop_mode``/``flip``. A clip draws once: every frame of it gets the
same seed (:mod:`shardkit.read.draws`), so the same crop box and the same flip, the box drawn
for the frames' common size. In ``clips.loader`` the seed is the one its sampler's place gives
a sample (the same on any number of workers and after a resume); a clip read without a loader
draws its seed from torch's global RNG.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import OptionError
from . import draws, lifetime, shipping
from .batching import Batch
from .clipwindows import (TOLERANCE_S, Windows, check_count, frame_columns, frame_offsets,
                          split_deltas)
from .dataset import ShardDataset
from .indices import check_index, check_indices
from .loading.engines import loader_for
from .targets import LABEL, store_schema


class Clips(Dataset):
    """Every window of ``frames`` frames of one video in a store of video frames, as a dataset.

    Args:
        dataset: a ``ShardDataset`` over a store packed from videos (records with the fields
            ``video`` and ``frame_index``), with ``output="tensor"``; its ``crop``,
            ``crop_mode``, ``scale``, ``ratio`` and ``flip`` are each clip's, drawn once per
            clip. Not with ``views`` or ``fields`` (pass ``fields`` here).
        frames: ``T``, the frames of a clip.
        stride: ``S``: a clip starting at frame ``i`` holds frames ``i, i + S, ...,
            i + (T - 1) S`` of its video (``frame_index``, the frame's number in the video).
        fields: typed fields of the store to stack over the clip (each ``[T, ...]``), and
            ``"label"`` for the class label; the target is then a dict of them. None: the
            clip's class label.
        delta_timestamps: instead of ``frames``/``stride``, offsets in seconds as LeRobot gives
            them, ``{"observation.image": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]}``: a key
            naming a field of the store stacks that field at those times, the one other key
            (the camera) gives the images' times. Each delta becomes ``round(delta * fps)``
            frames at the video's own rate (``video_fps``), refused unless it is within
            ``tolerance_s`` of a whole frame (LeRobot's check). A clip is anchored on each
            frame in turn (offset 0).
        tolerance_s: LeRobot's ``tolerance_s`` (default ``1e-4``).
        fps: the frame rate ``delta_timestamps`` converts with, for a store whose records have
            no ``video_fps`` (a LeRobot store: its ``meta/info.json`` fps). None: each video's.

    In a LeRobot store (records with a ``camera`` field) the ``delta_timestamps`` camera key
    names the camera whose frames the clips hold, and keys such as ``observation.state`` name
    the fields the store holds as ``observation_state``.

    A window exists only where every frame it needs is in the store: it never crosses a
    video's end (nor its start), nor a frame the pack left out. ``len(clips)`` counts them,
    ``clips[j]`` is ``(images [T, 3, H, W], target)``.
    """

    def __init__(self, dataset: Any, frames: int | None = None, stride: int = 1,
                 fields: Sequence[str] | None = None,
                 delta_timestamps: Mapping[str, Sequence[float]] | None = None,
                 tolerance_s: float = TOLERANCE_S, fps: float | None = None) -> None:
        if not isinstance(dataset, ShardDataset):
            raise OptionError(f"dataset must be a ShardDataset over a store of video frames, "
                              f"got {type(dataset).__name__}")
        if dataset.output != "tensor" or dataset.views is not None or dataset.fields is not None:
            raise OptionError("dataset: clips need a ShardDataset with output='tensor' and "
                              "without views or fields (pass fields= to the clips: they stack "
                              "them over each clip)")
        schema = store_schema(dataset.store)
        names = [] if schema is None else list(schema.names)
        fields = [] if fields is None else fields
        if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
            raise OptionError(f"fields must be a list of field names, got {fields!r}")
        if isinstance(tolerance_s, bool) or not isinstance(tolerance_s, (int, float)) \
                or not tolerance_s >= 0:
            raise OptionError(f"tolerance_s must be a number of seconds >= 0, got "
                              f"{tolerance_s!r}")
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float))
                                or not fps > 0 or delta_timestamps is None):
            raise OptionError(f"fps must be a frame rate > 0, with delta_timestamps, got "
                              f"fps={fps!r}")
        camera = None
        if delta_timestamps is not None:
            if frames is not None or stride != 1:
                raise OptionError("delta_timestamps gives the frames: pass it without frames "
                                  "and stride")
            camera, deltas = split_deltas(delta_timestamps, names)
            fields = [*fields, *(k for k in deltas if k not in fields)]
            image: Any = [0] if camera is None else (
                lambda fps, d=delta_timestamps[camera], k=camera:
                frame_offsets(d, fps, k, tolerance_s))
            offsets: dict[str, Any] = {
                name: (lambda fps, d=deltas[name], k=name: frame_offsets(d, fps, k, tolerance_s))
                if name in deltas else [0] for name in fields if name != LABEL}
        else:
            if frames is None:
                raise OptionError("frames (the frames of a clip) or delta_timestamps is needed")
            frames = check_count(frames, "frames", 1)
            stride = check_count(stride, "stride", 1)
            image = list(range(0, frames * stride, stride))
            offsets = {name: image for name in fields if name != LABEL}
        unknown = [f for f in fields if f != LABEL and f not in names]
        if unknown:
            raise OptionError(f"fields: {unknown[0]!r} is not a field of this store (it has "
                              f"{', '.join(names) or 'none'}; 'label' is the class label)")
        self.dataset = dataset
        self.fields = list(fields) if fields else None
        self.frames, self.stride = frames, (stride if delta_timestamps is None else None)
        self.delta_timestamps = delta_timestamps
        cols = frame_columns(dataset, delta_timestamps is not None, fps, camera is not None)
        only = None
        if cols["camera"] is not None:  # a LeRobot store: the camera key picks its frames
            only = cols["camera"] == camera
            if not only.any():
                raise OptionError(f"delta_timestamps: {camera!r} is neither a field nor a camera "
                                  f"of this store (cameras: "
                                  f"{', '.join(sorted(set(cols['camera'].tolist())))})")
        self.windows = Windows(image, offsets, cols, only)
        if not len(self.windows):
            raise OptionError(f"no clip fits in any of the {len(cols['names'])} videos of this "
                              "store (fewer frames than a clip spans)")

    # -- what samplers and loaders ask of a dataset -----------------------------------------------

    @property
    def random_draws(self) -> bool:
        return self.dataset.random_draws

    def __len__(self) -> int:
        return len(self.windows)

    def first_frames(self) -> np.ndarray:
        """Each clip's first image frame (a dataset index), in clip order."""
        return self.windows.images[:, 0]

    def frame_indices(self, index: int) -> list[int]:
        """The dataset indices of clip ``index``'s images, in clip order."""
        return self.windows.images[check_index(index, len(self))].tolist()

    # -- reading ----------------------------------------------------------------------------------

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        seed = draws.seed_of(index)
        check_index(index, len(self))
        one = [int(index)] if seed is None else draws.Keyed([int(index)], np.array([seed]))
        return self.__getitems__(one)[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, Any]]:
        """A batch of clips: all their frames read as one batch of the dataset, each clip's
        frames under one seed (the clip's)."""
        seeds = draws.seeds_of(indices)
        idx = check_indices(indices, len(self))
        frames = self.windows.images[idx]
        n, t = frames.shape
        flat = frames.reshape(-1).tolist()
        if self.dataset.random_draws:
            if seeds is None:  # untagged: one seed per clip from torch's global RNG
                seeds = torch.randint(0, 1 << 62, (n,), dtype=torch.int64).numpy()
            got = self.dataset.__getitems__(draws.Keyed(flat, np.repeat(seeds, t)))
        else:
            got = self.dataset.__getitems__(flat)
        pixels = None
        if isinstance(got, Batch):
            labels = got.labels[::t].tolist()
            stored = got.images.permute(0, 2, 3, 1)  # the N x H x W x 3 buffer decoded into
            if stored.is_contiguous():
                pixels = stored.view(n, t, *stored.shape[1:])
                clips = list(pixels.permute(0, 1, 4, 2, 3).unbind(0))
            else:  # a recipe's float output, its own layout
                clips = list(got.images.unflatten(0, (n, t)).unbind(0))
        else:
            clips = [torch.stack([got[b * t + j][0] for j in range(t)]) for b in range(n)]
            labels = [got[b * t][1] for b in range(n)]
        if self.fields is None:
            return ClipBatch(zip(clips, labels), pixels)
        targets = [{} for _ in range(n)]
        for name in self.fields:
            if name == LABEL:
                for target, label in zip(targets, labels):
                    target[LABEL] = label
                continue
            for target, value in zip(targets, self._stacked(name, idx)):
                target[name] = value
        return ClipBatch(zip(clips, targets), pixels)

    def _stacked(self, name: str, idx: np.ndarray) -> list[Any]:
        """Field ``name`` of clips ``idx``, each stacked over its offsets (a tensor; a list
        where the values do not stack: text, an absent optional value)."""
        rows = self.windows.fields[name][idx]
        store = self.dataset.store
        shards, local = store.locate_many(rows.reshape(-1))
        values = [store.shard(k).fields.value(name, i)
                  for k, i in zip(shards.tolist(), local.tolist())]
        k = rows.shape[1]
        out = []
        for b in range(len(idx)):
            part = values[b * k:(b + 1) * k]
            try:
                out.append(torch.as_tensor(np.stack(part)))
            except (TypeError, ValueError):
                out.append(part)
        return out

    def loader(self, batch_size: int | None = 1, *, engine: Any = "processes",
               num_threads: int | None = None, prefetch: int | None = None,
               **kwargs: Any) -> DataLoader:
        """A ``ShardLoader`` over the clips, as ``ShardDataset.loader`` makes one (pass
        ``sampler=shardkit.ClipSampler(clips, ...)`` to shuffle, shard over ranks and resume);
        batches are ``[clips [B, T, 3, H, W], targets]``. Without ``sampler``,
        ``batch_sampler`` or ``shuffle`` it reads every clip once, in clip order."""
        if not kwargs.get("shuffle") and kwargs.get("sampler") is None \
                and kwargs.get("batch_sampler") is None:
            kwargs.pop("shuffle", None)
            kwargs["sampler"] = range(len(self))
        return lifetime.track(loader_for(self, batch_size, engine, num_threads, prefetch, kwargs,
                                         collate_clips))

    def __repr__(self) -> str:
        shape = (f"delta_timestamps={self.delta_timestamps!r}" if self.delta_timestamps
                 else f"frames={self.frames}, stride={self.stride}")
        return f"Clips({self.dataset!r}, {shape}, clips={len(self)})"


class ClipBatch(list):
    """A batch of ``(clip, target)`` samples and (``pixels``) the ``[B, T, H, W, 3]`` buffer
    their frames were decoded into, the clips being views of it (None: they are not)."""

    def __init__(self, samples: Any, pixels: torch.Tensor | None) -> None:
        super().__init__(samples)
        self.pixels = pixels

    def __reduce__(self) -> tuple:
        return list, (list(self),)


def collate_clips(batch: Sequence[Any]) -> Any:
    """``[clips [B, T, 3, H, W], targets]``: the clips as a view of the buffer they were decoded
    into, not stacked again (inside a DataLoader worker, that buffer copied whole into memfd
    memory: :mod:`shardkit.read.shipping`); the targets as ``default_collate`` makes them.
    Any other batch: ``default_collate``."""
    pixels = getattr(batch, "pixels", None)
    if pixels is None:
        return shipping.default_collate(list(batch))
    targets = shipping.default_collate([target for _, target in batch])
    return [shipping.ship(pixels).permute(0, 1, 4, 2, 3), targets]


__all__ = ["ClipBatch", "Clips", "collate_clips"]
