"""LMDB backend: one single-file LMDB environment per shard.

``validate`` holds the on-disk layout (keys, magic) and the page checks run before LMDB maps a
file; ``writer`` and ``reader`` the two sides.
"""

from ..base import Backend
from .reader import LmdbShardReader
from .validate import sniff
from .writer import LmdbShardWriter

BACKEND = Backend(name="lmdb", label="LMDB", suffixes=(".lmdb",), sniff=sniff,
                  reader=LmdbShardReader, writer=LmdbShardWriter)
