"""How ``ShardDataset`` turns records into items and batches: each sample's draws (one plan per
view), the decode into its outputs, the target moved by the sample's crop, and the recipe's
steps; a batch is read in one transaction per shard and, where every sample has the same size,
decoded straight into one batch buffer (shared memory inside a worker) that ``shardkit.collate``
hands on without a copy.

``Items`` is the reading half of :class:`shardkit.read.dataset.ShardDataset` (its settings live
there): a single crop is one view, so one path serves crops and views alike.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from . import augment, batchpool, draws, recipes, shipping
from . import targets as targetmod
from .batching import Batch
from .indices import check_index, check_indices
from .store import OpenShard


class Items:
    """``__getitem__`` and ``__getitems__`` of ``ShardDataset``."""

    def _origin(self, shard: OpenShard, local: int,
                seed: int | None = None) -> list[augment.Plan | None]:
        """One sample's plan per view ([None]: a plain centre crop or the whole image), drawn
        from torch's global RNG or, with ``seed``, from a generator seeded with it."""
        # Drawn in the calling thread, in sample order: any number of threads decodes the same.
        if self._recipes is None:
            return [None]
        size = (int(shard.heights[local]), int(shard.widths[local]))
        return augment.draw_views(self._recipes, (size,), None if seed is None else (seed,))[0]

    def _present(self, img: np.ndarray) -> Any:
        if self.output == "numpy":
            return img
        if self.output == "pil":
            from PIL import Image

            return Image.fromarray(img, "RGB")
        return torch.from_numpy(img).permute(2, 0, 1)

    def _unwrap(self, per_view: list) -> Any:
        """Per-view results as the item carries them: the list with ``views``, else its one
        element (a single crop is a view of one, and stays a tensor, not a list of one)."""
        return per_view if self.views is not None else per_view[0]

    def _sample(self, imgs: list, label: Any) -> tuple[Any, Any]:
        if self.transform is not None:
            imgs = [self.transform(i) for i in imgs]
        img = self._unwrap(imgs)
        if self.target_transform is not None:
            label = self.target_transform(label)
        if self.transforms is not None:
            img, label = self.transforms(img, label)
        return img, label

    def _label(self, shard: OpenShard, local: int, plans: list[augment.Plan | None]) -> Any:
        """The class label, or with ``fields`` the target dict moved by the sample's crop (with
        ``views``: one per view, each moved by its view)."""
        if self._targets is None:
            return int(shard.labels[local])
        if self.output == "bytes":
            return self._targets.build(shard, local, None)
        height, width = int(shard.heights[local]), int(shard.widths[local])
        return self._unwrap([self._targets.build(shard, local, targetmod.move_for(
            plan, mode, size, height, width)) for plan, (mode, size) in zip(plans, self._moves)])

    def _item(self, shard: OpenShard, k: int, local: int, buf,
              origin: list[augment.Plan | None]) -> tuple[Any, Any]:
        label = self._label(shard, local, origin)
        if self.output == "bytes":
            if self.verify:
                self._decoder.check(shard, k, local, buf)
            return self._sample([bytes(buf)], label)
        if self._sizes is None:
            img = self._decoder.image(shard, k, local, buf)
            if origin[0] is not None and origin[0].flip:  # a bucketed record flipped whole
                img = np.ascontiguousarray(img[:, ::-1])
            return self._sample([self._finish(img, origin, 0)], label)
        outs = [np.empty((h, w, 3), np.uint8) for h, w in self._sizes]
        self._decoder.into(outs, shard, k, local, buf, int(shard.heights[local]),
                           int(shard.widths[local]), origin)
        return self._sample([self._finish(out, origin, v) for v, out in enumerate(outs)], label)

    def _finish(self, img: np.ndarray, plans: list, view: int) -> Any:
        """A decoded view through its recipe's steps (``shardkit.recipes``), then presented."""
        done = None if self._thens is None else recipes.finish_one(img, plans[view],
                                                                   self._thens[view])
        return self._present(img) if done is None else done

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        """Record ``index``: its draws from torch's global RNG, or from its own seed where a
        ``ds.loader`` tagged it (:mod:`shardkit.read.draws`)."""
        seed = draws.seed_of(index)
        k, local = self.store.locate(check_index(index, len(self)))
        shard = self.store.shard(k)
        with shard.reader.records() as get:
            return self._item(shard, k, local, get(local), self._origin(shard, local, seed))

    def __getitems__(self, indices: Sequence[int]) -> list:
        """A batch: one read transaction per shard, optional threads, one buffer when cropping.
        Draws as ``__getitem__``: per-sample seeds where a ``ds.loader`` tagged the batch."""
        seeds = draws.seeds_of(indices)
        indices = check_indices(indices, len(self))
        # (a target_transform of each sample's per-view target lists has no batched form)
        if self.output == "bytes" or self._sizes is None or self.transform is not None \
                or self.transforms is not None or self.output == "pil" \
                or (self.views is not None and self._targets is not None
                    and self.target_transform is not None):
            return self._getitems_each(indices, seeds)
        return self._getitems_batched(indices, seeds)

    def _by_shard(self, indices: Sequence[int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """[(shard, positions in the batch, indices in the shard)], so each shard is read in one
        transaction (vectorised: no Python work per index)."""
        shards, local = self.store.locate_many(indices)
        if len(self.store.shards) == 1:
            return [(0, np.arange(len(local)), local)]
        found = []
        for k in np.unique(shards).tolist():
            positions = np.flatnonzero(shards == k)
            found.append((k, positions, local[positions]))
        return found

    def _getitems_each(self, indices: Sequence[int], seeds: np.ndarray | None = None) -> list:
        results: list = [None] * len(indices)
        located = self._by_shard(indices)
        plans = self._plans(located, len(indices), seeds)
        for k, positions, local in located:
            shard = self.store.shard(k)
            with shard.reader.records() as get:
                jobs = [(shard, k, i, get(i), plans[pos])
                        for pos, i in zip(positions.tolist(), local.tolist())]
                for pos, sample in zip(positions.tolist(), self._fanout.run(self._item, jobs)):
                    results[pos] = sample
        return results

    def _plans(self, located: list[tuple[int, np.ndarray, np.ndarray]], n: int,
               seeds: np.ndarray | None = None) -> list[list[augment.Plan | None]]:
        """Each batch position's boxes and flips (one per view), drawn in batch order (as
        ``__getitem__`` would), or each from its seed in ``seeds`` (batch order)."""
        if self._recipes is None:
            return [[None]] * n
        sizes = np.empty((n, 2), dtype=np.int64)
        for k, positions, local in located:
            shard = self.store.shard(k)
            sizes[positions, 0], sizes[positions, 1] = shard.heights[local], shard.widths[local]
        return augment.draw_views(self._recipes, sizes.tolist(), seeds)

    def _getitems_batched(self, indices: Sequence[int],
                          seeds: np.ndarray | None = None) -> Batch:
        n, sizes = len(indices), self._sizes
        # One reusable buffer (shared memory in a worker, so sending the batch is free), each
        # view's N x H x W x 3 block after the previous one's.
        flat, slot = batchpool.pool(get_worker_info() is not None).take(
            (sum(n * h * w * 3 for h, w in sizes),))
        blocks, start = [], 0
        for h, w in sizes:
            blocks.append(flat[start:start + n * h * w * 3].view(n, h, w, 3))
            start += n * h * w * 3
        pixels = [block.numpy() for block in blocks]
        labels = np.empty(n, dtype=np.int64)
        # per view: each position's target (with fields)
        target_lists: list[list[Any]] = [[None] * n for _ in sizes]
        located = self._by_shard(indices)
        plans = self._plans(located, n, seeds)
        outs = list(zip(*pixels))  # each position's outputs, one per view
        for k, positions, local in located:
            shard = self.store.shard(k)
            labels[positions] = shard.labels[local]
            heights = shard.heights[local].tolist()
            widths = shard.widths[local].tolist()
            local_list = local.tolist()
            with shard.reader.records() as get:
                # Built by C-level zip/map, not a per-sample Python loop: the thread engine's
                # threads share one GIL, and this runs once per record.
                at = positions.tolist()
                jobs = list(zip(map(outs.__getitem__, at), repeat(shard), repeat(k), local_list,
                                map(get, local_list), heights, widths, map(plans.__getitem__, at)))
                self._fanout.run(self._decoder.into, jobs)
            if self._targets is not None:  # boxes of the whole shard's part moved at once
                for v, (mode, size) in enumerate(self._moves):
                    built = self._targets.build_batch(shard, local_list,
                                                      [plans[p][v] for p in positions.tolist()],
                                                      mode, size)
                    for pos, target in zip(positions.tolist(), built):
                        target_lists[v][pos] = target
        # the recipe's steps; float views into the pool's memory where no worker ships them
        finished = recipes.finish_batch(
            self._thens, blocks, plans,
            None if get_worker_info() is not None else batchpool.pool(False).take)
        batch = Batch()
        if self.output == "tensor":
            images = finished or [block.permute(0, 3, 1, 2) for block in blocks]
            samples = [image.unbind(0) for image in images]
        else:
            # numpy samples; the batch is what default_collate makes of them: an N x H x W x C
            # uint8 tensor (here without a copy), so either collate yields the same type.
            images, samples = blocks, pixels
            batch.channels_last = True
        batch.slot = slot
        batch.images = self._unwrap(images)
        label_list = (labels.tolist() if self._targets is None
                      else [self._unwrap(list(ts)) for ts in zip(*target_lists)])
        if self.target_transform is not None:
            label_list = [self.target_transform(t) for t in label_list]
        batch.extend(zip(map(self._unwrap, map(list, zip(*samples))), label_list))
        if self._targets is not None:
            # each view's targets (a single crop's transformed ones: views take the path above)
            per_view = target_lists if self.target_transform is None else [label_list]
            batch.labels = self._unwrap([self._targets.collate(ts) for ts in per_view])
        else:
            batch.labels = (torch.from_numpy(labels) if self.target_transform is None
                            else shipping.default_collate(label_list))
        return batch
