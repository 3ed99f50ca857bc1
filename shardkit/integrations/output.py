"""The normalised float output, where it was first published: it lives in
:mod:`shardkit.read.loading.output`."""

from ..read.loading.output import BatchOutput, WorkerOutput

__all__ = ["BatchOutput", "WorkerOutput"]
