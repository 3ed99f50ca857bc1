"""Store addresses with a URL scheme (``s3://bucket/key``): remote stores (:mod:`shardkit.remote`).

Without this check ``s3://bucket/x`` is a relative local path: a folder named ``s3:`` appears.
"""

from __future__ import annotations

import os
import re

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | bytes | os.PathLike) -> bool:
    """True for ``scheme://...`` (any scheme, ``file://`` included)."""
    return bool(_SCHEME.match(os.fsdecode(os.fspath(path))))
