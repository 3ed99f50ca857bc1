"""Output is written under a hidden partial name beside OUT and moved into place when complete,
never disturbing processes reading the OUT it replaces."""

from __future__ import annotations

import os

from .. import swap
from ..errors import PackError
from ..fileutil import fsync_dir


def partial_path(out: str) -> str:
    """Where OUT is built: the hidden sibling ``.<name>.partial``."""
    head, tail = os.path.split(os.path.abspath(out))
    return os.path.join(head, f".{tail}.partial")


def install(partial: str, out: str, overwrite: bool) -> None:
    """Move a finished store from its partial name to OUT, never disturbing readers of OUT.

    A new OUT, or a file replacing a file: one rename. A folder store replacing a folder store:
    new shard files under unused names, then ``manifest.json`` replaced by rename, old files
    deleted once no reader holds them (:mod:`shardkit.swap`). Replacing a file by a folder or the
    reverse cannot be one rename: OUT is moved aside first (missing for a moment, never mixed),
    and a folder store moved aside is deleted once no reader holds it.
    """
    if os.path.lexists(out) and not overwrite:
        raise PackError(f"{out} already exists (use `overwrite=True` to replace it)")
    if not os.path.lexists(out):
        if os.path.isdir(partial):
            os.rename(partial, out)
            swap.collect_garbage(out)  # side files a killed writer may have left
        else:
            os.replace(partial, out)
    elif os.path.isdir(partial) and swap.is_folder_store(out):
        swap.install_folder(partial, out)
    elif os.path.isdir(partial) or (os.path.isdir(out) and not os.path.islink(out)):
        swap.swap_aside(partial, out)
    else:
        os.replace(partial, out)  # atomic; processes that opened the old file keep reading it
    fsync_dir(os.path.dirname(os.path.abspath(out)))
    swap.collect_aside(out)


def install_finished(partial: str, out: str, overwrite: bool) -> None:
    """:func:`install` a finalized folder store; on a disk error it stays there for ``merge``."""
    try:
        install(partial, out, overwrite)
    except OSError as exc:
        raise PackError(f"cannot install {out}: {exc.strerror or exc}; the finished store is "
                        f"kept in {partial} (`shardkit merge {out}` installs it)") from None
