"""pyproject's extras: none requests an extra its package does not provide (pip only warns,
and the requirement it meant is silently dropped), and the README lists every one."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_requested_extras_exist_in_the_installed_packages():
    checked = 0
    for extra, requirements in EXTRAS.items():
        for requirement in requirements:
            match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*\[([^\]]+)\]", requirement)
            if not match:
                continue
            name, wanted = match.group(1), match.group(2).split(",")
            try:
                provided = importlib.metadata.metadata(name).get_all("Provides-Extra") or []
            except importlib.metadata.PackageNotFoundError:
                continue  # not installed here: nothing to compare against
            missing = {_norm(w) for w in wanted} - {_norm(p) for p in provided}
            assert not missing, f"[{extra}] {requirement}: {name} has no extra {missing}"
            checked += 1
    assert checked >= 2  # dask[distributed], moto[server] at least


def test_the_readme_lists_every_extra():
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"^Extras: (.*?)\.$", readme, re.M | re.S).group(1)
    assert sorted(re.findall(r"`([a-z]+)`", listed)) == sorted(EXTRAS)
