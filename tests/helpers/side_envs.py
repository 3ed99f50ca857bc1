"""pytest plugin that ``scripts/test.sh`` loads (``-p helpers.side_envs``): after the run, one line
per side environment whose tests skipped because it is missing (see ``_side_python`` in
tests/conftest.py), with how many skipped and the command that builds it."""

from __future__ import annotations

import re
from collections import Counter

# The skip reason tests/conftest.py gives: "no .venv-tv environment at PATH (run scripts/X.sh)".
_MISSING = re.compile(r"no (\.venv[\w-]*) environment at .* \(run (scripts/[\w.-]+)\)")


def missing_side_envs(reasons) -> Counter:
    """(venv, build script) -> how many of ``reasons`` are that environment's absence."""
    return Counter(m.groups() for r in reasons if (m := _MISSING.search(r)))


def pytest_terminal_summary(terminalreporter) -> None:
    reasons = [rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
               for rep in terminalreporter.stats.get("skipped", [])]
    for (venv, script), n in sorted(missing_side_envs(reasons).items()):
        terminalreporter.write_line(
            f"{n} tests skipped without {venv}; to run them: "
            f"./{script} {venv} && ./scripts/test.sh")
