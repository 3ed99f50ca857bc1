"""Progress bars (tqdm) for packing, exporting and ``verify``: on stderr, and without tqdm's
monitor thread, which outlives the bar (a process with another Python thread alive cannot fork
safely: the next pack in it would spawn its workers instead)."""

from __future__ import annotations

import sys
from typing import Any


class NoProgress:
    """What a disabled bar does: nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, enabled: bool, desc: str, unit: str = "img") -> Any:
    """A tqdm bar of ``total`` ``unit``s on stderr, or :class:`NoProgress` when not ``enabled``."""
    if not enabled:
        return NoProgress()
    from tqdm import tqdm

    class Bar(tqdm):
        monitor_interval = 0  # per class, so the user's own bars keep their monitor

    return Bar(total=total, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True,
               smoothing=0.1)
