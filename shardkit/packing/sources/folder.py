"""An ImageFolder-layout folder: ``SRC/<class>/<image>``, listed by torchvision's rules
(:func:`shardkit.packing.discovery.discover`). The format any SRC is taken to be when no other
source detects it."""

from __future__ import annotations

from ..discovery import discover
from .base import ImageFilesSource, Scan, SourceOptions


class FolderSource(ImageFilesSource):
    name = "folder"
    summary = "an ImageFolder-layout folder (SRC/<class>/<image>), or a --file-list root"

    def detect(self, src: str) -> bool:
        return True  # the last format asked: any SRC no container claims

    def scan(self, options: SourceOptions) -> Scan:
        return Scan.of(discover(options.src, options.allow_empty))
