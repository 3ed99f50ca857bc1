"""Loaders over shardkit datasets, and the engines that make their batches.

- ``engines``: ``Threads`` and ``Processes``, the engine objects ``ds.loader(engine=...)``
  takes, and ``loader_for``, the one place a loader is set up for a dataset.
- ``loader``: ``ShardLoader``, the DataLoader every engine returns: resumable mid-epoch
  through ``state_dict()``/``load_state_dict()`` (the protocol Lightning and torchdata's
  ``StatefulDataLoader`` use), counting the batches the training loop consumed; it refuses to
  run when a wrapper (Lightning's ``DistributedSamplerWrapper``, ...) splits a ``ShardSampler``.
- ``thread_engine``: ``ThreadLoader``, batches made by threads of the training process.
- ``output``: the opt-in normalised float output (``loader(normalize=(mean, std), device=...)``).

It is part of the read side: it imports the read side's modules and the core, never
``shardkit.integrations`` (which builds on it).
"""
