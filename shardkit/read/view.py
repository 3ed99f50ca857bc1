"""The old import path of :mod:`shardkit.read.storeview` (``StoreView``, ``open_layout``,
``labels_by_place``), kept for one release: ``shardkit.View`` is the view recipe, a store seen
through its layout is a ``StoreView``."""

from .storeview import StoreView, labels_by_place, open_layout

__all__ = ["StoreView", "labels_by_place", "open_layout"]
