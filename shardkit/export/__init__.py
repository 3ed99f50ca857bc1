"""``shardkit export``: a store back out as WebDataset tars or Hugging Face parquet.

:data:`TARGETS` is the one list of export formats (the CLI's ``--to`` choices derive from it).
Records leave in the dataset's order (``ShardDataset(store)[i]``, through a mixed layout), split into numbered files of about
``shard_size`` bytes named by a printf pattern (``out/train-%06d.tar``).

* :mod:`.base`        the shared steps: reading records in order, splitting, naming files
* :mod:`.webdataset`  tar members ``KEY.jpg`` + ``KEY.cls`` (+ fields), ``classes.json`` beside
* :mod:`.parquet`     an ``image`` struct ``{bytes, path}`` + ``label`` ClassLabel (+ fields)
"""

from __future__ import annotations

import os

from ..errors import OptionError
from .base import DEFAULT_SHARD_SIZE, ExportResult, Exporter
from .parquet import ParquetExporter
from .webdataset import WebDatasetExporter

_EXPORTERS: dict[str, type[Exporter]] = {"webdataset": WebDatasetExporter,
                                         "parquet": ParquetExporter}
#: every export format: name -> one-line summary
TARGETS: dict[str, str] = {name: cls.summary for name, cls in _EXPORTERS.items()}

__all__ = ["DEFAULT_SHARD_SIZE", "TARGETS", "ExportResult", "export"]


class ExportOptionError(OptionError):
    """An invalid option of :func:`export`."""


def export(store: str | os.PathLike, pattern: str | os.PathLike, *, to: str = "webdataset",
           shard_size: int = DEFAULT_SHARD_SIZE, overwrite: bool = False,
           progress: bool = True) -> ExportResult:
    """Write every record of ``store`` into files named by ``pattern``.

    Args:
        store: a shardkit store (file or folder).
        pattern: the output files, with one printf integer field for the file number
            (``'out/train-%06d.tar'``); missing folders are created (``mkdir -p``).
        to: ``'webdataset'`` (tars that ``webdataset.WebDataset`` reads as ``(jpg, cls)``;
            JPEG records are written byte for byte, raw records as lossless PNG) or
            ``'parquet'`` (the Hugging Face ``Image`` struct and a ``ClassLabel``, which
            ``datasets.load_dataset("parquet", ...)`` reads with the class names).
        shard_size: start a new file once one holds about this many bytes.
        overwrite: replace output files that exist (else they are refused).
        progress: show a progress bar on stderr.

    Returns:
        an :class:`ExportResult` (the files written, records, bytes).
    """
    if to not in _EXPORTERS:
        raise ExportOptionError(f"`to` must be one of {', '.join(_EXPORTERS)}, not {to!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size <= 0:
        raise ExportOptionError(f"`shard_size` must be a positive number of bytes, not "
                                f"{shard_size!r}")
    return _EXPORTERS[to](os.fspath(store), os.fspath(pattern), shard_size, overwrite,
                          progress).run()
