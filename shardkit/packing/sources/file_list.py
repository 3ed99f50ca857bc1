"""A file list (``file_list``): a CSV/TSV of ``path,label`` rows, paths relative to SRC
(:func:`shardkit.packing.discovery.read_file_list`). A list whose header row names more columns
than ``path,label`` is the metadata source's (:mod:`.metadata`): those columns are fields."""

from __future__ import annotations

from typing import Any

from ..discovery import list_file_list, read_file_list
from .base import ImageFilesSource, Scan, SourceOptions


class FileListSource(ImageFilesSource):
    name = "file-list"
    summary = "a CSV/TSV of path,label rows (`file_list`), paths relative to SRC"
    option = "file_list"

    def scan(self, options: SourceOptions) -> Scan:
        return Scan.of(read_file_list(options.file_list, options.src))

    def scan_into(self, options: SourceOptions, folder: str, lister: Any = None) -> Scan:
        return Scan.of(list_file_list(options.file_list, options.src, folder))
