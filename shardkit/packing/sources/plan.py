"""A container source in the pack's plan: its samples as a :class:`Discovery` (display names
and labels, what the store records) beside the :class:`ContainerIndex` workers read from."""

from __future__ import annotations

import os
from typing import Any

from ...errors import PackError
from ..discovery import Discovery
from . import FOLDER, scan
from .base import ContainerIndex, SourceOptions


def discover_container(src: str, source_format: str | None, options: Any = None
                       ) -> tuple[Discovery | None, ContainerIndex | None]:
    """(Discovery, index) of a container source; (None, None) for an image folder."""
    if source_format in (None, FOLDER):
        return None, None
    root, classes, class_to_idx, samples, skipped, index = scan(
        os.fspath(src), source_format, options or SourceOptions())
    if not samples:
        first = f"; first: {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
        raise PackError(f"{src}: no usable samples in this {source_format} source "
                        f"({len(skipped)} skipped{first})")
    return Discovery(root, classes, class_to_idx, samples, skipped), index
