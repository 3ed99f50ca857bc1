"""A file list (``file_list``): a CSV/TSV of ``path,label`` rows, paths relative to SRC
(:func:`shardkit.packing.discovery.read_file_list`). A list whose header row names more columns
than ``path,label`` is the metadata source's (:mod:`.metadata`): those columns are fields."""

from __future__ import annotations

from ..discovery import read_file_list
from .base import ImageFilesSource, Scan, SourceOptions


class FileListSource(ImageFilesSource):
    name = "file-list"
    summary = "a CSV/TSV of path,label rows (`file_list`), paths relative to SRC"
    option = "file_list"

    def scan(self, options: SourceOptions) -> Scan:
        return Scan.of(read_file_list(options.file_list, options.src))
