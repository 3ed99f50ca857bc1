"""The tail every benchmark script shares: print its report, and write it to ``--out`` as well.

Imported by the scripts beside it (``python benchmarks/<script>.py`` puts this folder first on
``sys.path``). The files written are the ones benchmarks/results/ holds and the docs link to.
"""

from __future__ import annotations

import os
import sys


def command_line() -> str:
    """``python benchmarks/<script>.py <arguments>``: how this run was started, for a report's
    first line."""
    return f"python benchmarks/{os.path.basename(sys.argv[0])} {' '.join(sys.argv[1:])}"


def emit(lines: list[str], out: str | None, command: str | None = None) -> None:
    """Print ``lines`` as the report; when ``out`` is set, write the report there too, after a
    ``$ <command>`` line when ``command`` is given (the file alone then says how to rerun it)."""
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if out:
        with open(out, "w") as f:
            f.write((f"$ {command}\n" if command else "") + report)
