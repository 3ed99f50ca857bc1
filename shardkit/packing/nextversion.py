"""A folder store's next version made beside it and installed (what ``update``, ``add_field``
and ``compact`` share; ``append`` builds its own from a pack): a work folder that only one
writer may hold, the store's manifest carried over with its shards kept as they are, and the
version checked, written and switched in."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .. import metadata, storemeta
from ..errors import PackError
from ..fileutil import remove
from ..urls import is_url
from ..versionmeta import number_of, stamp
from .append import Base, install_checked
from .install import partial_path


@contextlib.contextmanager
def work_folder(base: Base) -> Iterator[str]:
    """The folder the next version's new files are written in (removed afterwards)."""
    remote = is_url(base.out)  # a store at a URL: beside the files downloaded of it
    partial = f"{base.local}-new" if remote else partial_path(base.out)
    if remote:
        remove(partial)  # left by a killed writer here; the prefix's lock says who writes
    elif os.path.lexists(partial):
        raise PackError(f"{partial} exists: another pack or update of {base.out} is running, or "
                        "one was interrupted (finish it with `resume=True`, or delete it)")
    os.makedirs(partial)
    try:
        yield partial
    finally:
        remove(partial)


def carried(base: Base, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """The store's manifest as the next version starts from it: its shards as they are (each
    with its own number and the classes it was written with), without ``drop``'s keys."""
    old = base.manifest
    manifest = {k: v for k, v in old.items() if k != metadata.SEAL_KEY and k not in drop}
    manifest["shards"] = [e | {"index": e.get("index", k),
                               "classes": e.get("classes", len(old["classes"]))}
                          for k, e in enumerate(old["shards"])]
    return manifest


def install(base: Base, partial: str, manifest: dict[str, Any], change: dict[str, Any],
            uploader: Any = None) -> int:
    """``manifest`` as the store's next version, made by ``change``: checked as every reader
    checks it, written into ``partial`` and installed. Returns its number. ``uploader``: the
    one holding the URL prefix's lock that uploaded the version's new shards."""
    number = number_of(base.manifest) + 1
    if is_url(base.out):
        from .append_remote import install_at_url

        install_at_url(partial, base, stamp(manifest, number, change), uploader)
        return number
    raw = metadata.dumps(stamp(manifest, number, change))
    storemeta.parse_manifest(raw, partial)  # never install what a reader would refuse
    with open(os.path.join(partial, metadata.MANIFEST_NAME), "wb") as f:
        f.write(raw)
    install_checked(partial, base)
    return number


__all__ = ["carried", "install", "work_folder"]
