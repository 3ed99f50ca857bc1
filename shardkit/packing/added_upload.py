"""The column files of fields added to a store at a URL (``add_field``): uploaded under names no
version uses (``column-<name>-<sha256 prefix>.npy``), and an object already under such a name
kept only where it holds those very bytes (a killed run uploaded it): never written over."""

from __future__ import annotations

import os
from typing import Any

from ..errors import PackError
from ..fields import added
from ..fileutil import sha256_file


def renamed(partial: str, old: dict[str, Any], manifest: dict[str, Any]
            ) -> tuple[dict[str, Any], list[str]]:
    """``manifest`` with the added columns that ``old`` (the version replaced) does not hold
    renamed in ``partial`` by their content, and those names."""
    had = {(c["file"], c["sha256"]) for c in added.files(old)}
    names: list[str] = []
    entries = []
    for entry in added.entries(manifest):
        columns = {}
        for col, info in entry["columns"].items():
            if (info["file"], info["sha256"]) not in had:
                stem, ext = os.path.splitext(info["file"])
                name = f"{stem}-{info['sha256'][:16]}{ext}"
                os.replace(os.path.join(partial, info["file"]), os.path.join(partial, name))
                info = info | {"file": name}
                names.append(name)
            columns[col] = info
        entries.append(entry | {"columns": columns})
    return (manifest | {added.KEY: entries} if names else manifest), names


def missing(uploader: Any, partial: str, names: list[str]) -> list[str]:
    """Of the column files ``names`` (in ``partial``), those to upload: not yet under the
    prefix. One there with other bytes is a PackError (nothing switched). Called under the
    prefix's lock (``uploader``'s)."""
    from ..remote.verify import stored_problem

    remote, out = uploader.remote, []
    for name in names:
        local = os.path.join(partial, name)
        if not remote.retry(name, lambda n=name: remote.fs.exists(remote.path(n))):
            out.append(name)
            continue
        problem = remote.retry(name, lambda n=name, p=local: stored_problem(
            remote, p, n, os.path.getsize(p), sha256_file(p)))
        if problem:
            raise PackError(f"{remote.where(name)}: an object shardkit did not write is there "
                            f"({problem}); the store is unchanged")
    return out


__all__ = ["missing", "renamed"]
