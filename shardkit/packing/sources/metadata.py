"""Typed fields beside image files: a metadata table (``metadata_file``: JSON Lines or CSV/TSV
with a ``file_name`` column, Hugging Face's ``imagefolder`` layout; or a file list whose header
row names more columns than ``path,label``) and/or captions (``captions``: ``<stem>.txt`` beside
each image), as :class:`shardkit.packing.annotations.MetadataFields` reads them. The images are
listed as the folder or the file list lists them, every one matched to its row."""

from __future__ import annotations

from ..annotations import MetadataFields, names_columns
from ..discovery import discover, read_file_list
from .base import ImageFilesSource, Scan, SourceOptions
from .imagefolder import reads


class MetadataSource(ImageFilesSource):
    name = "metadata"
    summary = ("typed fields from a metadata table (`metadata_file`, or a file list's extra "
               "columns) and/or captions (`captions`), over the folder or the file list")
    option = "metadata_file"

    def asked(self, options: SourceOptions) -> bool:
        return (options.metadata_file is not None or bool(options.captions)
                or options.schema is not None
                or (options.file_list is not None and names_columns(options.file_list))
                ) and not reads(options)  # SRC is the imagefolder layout: that source's options

    def parameter(self, options: SourceOptions) -> str:
        return next(name for name, given in (
            ("metadata_file", options.metadata_file is not None), ("captions", options.captions),
            ("schema", options.schema is not None), ("file_list", True)) if given)

    def scan(self, options: SourceOptions) -> Scan:
        table = MetadataFields(options.src, metadata=options.metadata_file,
                               file_list=options.file_list, captions=options.captions,
                               schema=options.schema, allow_empty=options.allow_empty)
        if len(table.schema):
            return Scan.of(table.discovery(), table)
        # No field to pack (a table of file names alone): the images as listed without one.
        return Scan.of(read_file_list(options.file_list, options.src) if options.file_list
                       else discover(options.src, options.allow_empty))
