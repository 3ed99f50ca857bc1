"""Fitting shardkit into the training programs people use.

- ``loader``: ``ShardLoader``, the DataLoader ``ShardDataset.loader`` returns: resumable mid-epoch
  through ``state_dict()``/``load_state_dict()`` (the protocol Lightning and torchdata's
  ``StatefulDataLoader`` use), counting the batches the training loop consumed; it refuses to
  run when a wrapper (Lightning's ``DistributedSamplerWrapper``, ...) splits a ``ShardSampler``.
- ``output``: the opt-in normalised float output (``loader(normalize=(mean, std), device=...)``).
- ``lightning``: ``ShardDataModule`` (``shardkit.lightning``).
- ``timm``: ``create_dataset``/``create_loader`` for timm's ``train.py`` (``shardkit.timm``).
- ``accelerate``: ``prepare(accelerator, ...)``, which keeps shardkit loaders as they are under
  accelerate (``shardkit.accelerate``).

The Lightning, timm and accelerate modules import their library only when used; the rest needs
torch only.
"""
