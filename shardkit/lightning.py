"""Lightning integration: ``from shardkit.lightning import ShardDataModule`` (needs
``pip install lightning``). See :mod:`shardkit.integrations.lightning`."""

from .integrations.lightning import ShardDataModule

__all__ = ["ShardDataModule"]
