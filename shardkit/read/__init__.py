"""The read side: a packed store opened, located, decoded and served to PyTorch.

- ``store``: a store's metadata and per-process shard handles; ``Store.locate_many`` maps global
  indices to (shard, index in shard).
- ``decode``: a record's CRC check and decoding, with errors naming store, shard and record (the
  one place; ``ShardDataset`` and ``verify`` both use it).
- ``augment``: crop boxes and flips drawn as torchvision draws them, resized at decode.
- ``batchpool``: reusable (shared-memory) batch buffers.
- ``threads``: the ``threads=N`` fan-out of one batch's records.
- ``dataset``: ``ShardDataset``, ``collate``, ``worker_init_fn`` (orchestration of the above);
  ``items``: how it reads items and batches; ``attributes``: what it reads from the store's
  metadata (classes, targets, buckets); ``fieldspec``: ``Fields``, the typed fields it returns;
  ``cut``: boxes cut, resized and flipped.
- ``loading``: the loaders and their engines (``Threads``, ``Processes``, ``ShardLoader``).
- ``storeview``: a store seen through the pack's record layout and an optional subset
  (``StoreView``: logical index -> physical place).
- ``order``: the epoch order, a pure function of (seed, epoch) over a canonical partition.
- ``sampler``: ``ShardSampler``, a DistributedSampler whose ranks read whole shards and resume
  at any world size dividing ``num_canonical``.
- ``subset``: ``ds.subset(...)``/``ds.split(...)`` without repacking.
- ``mix``: ``Mix`` and ``MixSampler``, several stores with exact per-epoch quotas.
- ``inspect``: ``info`` and ``verify``.

It imports only the core (errors, metadata, swap, urls, remote, codec, formats, fileutil).
"""
