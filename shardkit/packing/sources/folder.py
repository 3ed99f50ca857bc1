"""An ImageFolder-layout folder: ``SRC/<class>/<image>``, listed by torchvision's rules
(:func:`shardkit.packing.discovery.discover`), or the same layout under a URL prefix
(``s3://bucket/train``, any fsspec URL: :mod:`.url_folder`), which packs exactly as the same
tree in a local folder. The format any SRC is taken to be when no other source detects it."""

from __future__ import annotations

from typing import Any

from ...urls import is_url
from ..discovery import discover, list_folder
from .base import ImageFilesSource, Scan, SourceOptions


class FolderSource(ImageFilesSource):
    name = "folder"
    summary = ("an ImageFolder-layout folder (SRC/<class>/<image>; also under a URL prefix), "
               "or a --file-list root")
    remote = True  # a URL prefix holding the layout (the sources asked for by a file stay local)

    def detect(self, src: str) -> bool:
        return True  # the last format asked: any SRC no container claims

    def scan(self, options: SourceOptions) -> Scan:
        if is_url(options.src):
            from .url_folder import scan_url_folder

            return Scan.of(scan_url_folder(options.src, options.allow_empty))
        return Scan.of(discover(options.src, options.allow_empty))

    def scan_into(self, options: SourceOptions, folder: str, lister: Any = None) -> Scan:
        if is_url(options.src):
            return self.scan(options)
        return Scan.of(list_folder(options.src, folder, options.allow_empty, lister))
