"""HDF5 backend: one HDF5 file of plain contiguous datasets per shard (layout: ``reader``)."""

from ..base import Backend
from .reader import Hdf5ShardReader, sniff
from .writer import Hdf5ShardWriter

BACKEND = Backend(name="hdf5", label="HDF5", suffixes=(".h5", ".hdf5"), sniff=sniff,
                  reader=Hdf5ShardReader, writer=Hdf5ShardWriter)
