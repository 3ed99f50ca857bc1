"""timm integration: ``from shardkit.timm import create_dataset, create_loader`` (needs timm).
See :mod:`shardkit.integrations.timm`."""

from .integrations.timm import create_dataset, create_loader, find_store

__all__ = ["create_dataset", "create_loader", "find_store"]
