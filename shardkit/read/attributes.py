"""What ``ShardDataset`` reads from its store's metadata rather than its records: ImageFolder's
``classes``/``class_to_idx``/``targets``, the length, a record's source path, and a bucketed
store's buckets (:class:`StoreAttributes`, a part of :class:`shardkit.read.dataset.ShardDataset`)."""

from __future__ import annotations

import numpy as np

from .indices import check_index


class StoreAttributes:
    """The attributes of ``ShardDataset`` that come from ``self.store``."""

    @property
    def classes(self) -> list[str]:
        return self.store.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        return self.store.class_to_idx

    @property
    def targets(self) -> np.ndarray:
        """Label of every record (int64 array, not a list: no per-record Python objects)."""
        return self.store.labels

    @property
    def bucket_sizes(self) -> np.ndarray | None:
        """A store packed with ``buckets=``: each aspect-ratio bucket's (height, width), a
        ``(K, 2)`` int64 array (``docs/buckets.md``); None for a store packed without."""
        from .buckets import bucket_sizes

        return bucket_sizes(self.store)

    @property
    def buckets(self) -> np.ndarray | None:
        """Each record's bucket (an index into ``bucket_sizes``), an int64 array in this
        dataset's order (a subset: its records); None for a store packed without buckets.
        Computed on each access from the shards' memory-mapped heights and widths: keep it."""
        from .buckets import record_buckets

        sizes = self.bucket_sizes
        return None if sizes is None else record_buckets(self.store, sizes)

    @property
    def encoding(self) -> str:
        return self.store.encoding

    def __len__(self) -> int:
        return self.store.count

    @property
    def version(self) -> int:
        """The store version this dataset reads (``ShardDataset(path, version=N)`` pins one;
        by default the latest when it was made; 1 for a store never changed)."""
        return self.store.version

    def key(self, index: int) -> str:
        """Record ``index``'s key: its source path relative to SRC, or the value of the source
        column ``id_key`` named at pack time (what ``append`` compares; ``docs/lifecycle.md``)."""
        return self.source_path(index)

    def index_of(self, key: str) -> int:
        """The index of the record whose key is ``key`` (KeyError if none). The first call
        reads every record's key (a pass over the shards' path arrays) into a sorted table of
        64-bit hashes, kept in this process."""
        table = self.__dict__.get("_key_table")
        if table is None:
            from .keys import KeyTable

            table = self.__dict__["_key_table"] = KeyTable(self.key, len(self))
        return table.find(key, self.key)

    def source_path(self, index: int) -> str:
        """Path of record ``index``'s source image, relative to the packed folder."""
        k, local = self.store.locate(check_index(index, len(self)))
        return self.store.shard(k).source_path(local)
