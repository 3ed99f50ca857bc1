"""Resuming a ``ShardSampler`` state saved over another version of the store, on the records both
versions share (``sampler.load_state_dict(state, across_versions=True)``; docs/lifecycle.md).

The rest of the saved epoch is what the saved run had not consumed, in its global order: the
saved version is opened again (``ShardDataset(path, version=saved)``, the whole store), a sampler
with the saved parameters at one rank loads the state there, and its indices are that rest (an
elastic resume makes them the same at any world size). Each is mapped by key to this dataset's
version; a record this version no longer holds is dropped, and a record new in it is not in the
rest. That list, the *bridge*, is the epoch's global sequence: the ranks of this run split it as
they split the ordinary one (rank ``r`` of ``W`` reads places ``r, r + W, ...``, padded or cut
as the sampler's ``drop_last`` says), and the epochs after it are this version's own order.

A state saved during the bridged epoch holds the state it bridges from (``bridge``) and its
position in the bridge, so it resumes exactly, at any world size, while the saved version is
kept (``shardkit gc`` may drop it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import versions
from ..errors import OptionError


@dataclass(frozen=True)
class Bridge:
    """A bridged epoch: ``indices``, this dataset's, are its global sequence; ``state`` is the
    state it bridges from."""

    indices: np.ndarray
    state: dict[str, Any]


def saved_version(state: dict[str, Any]) -> int:
    """The one store version ``state`` was saved over (a state without ``store_version`` was
    saved over version 1)."""
    found = state.get("store_version") or [1]
    if not isinstance(found, list) or len(found) != 1 or isinstance(found[0], bool) \
            or not isinstance(found[0], int) or found[0] < 1:
        raise OptionError(f"across_versions: the state's store_version must name one version of "
                          f"one store, got {found!r}")
    return found[0]


def check_bridge(bridge: Any) -> None:
    """A state's ``bridge`` entry, of its shape (a hand-edited one is refused by name)."""
    if not isinstance(bridge, dict) or sorted(bridge) != ["length", "state"] \
            or not isinstance(bridge["state"], dict) or isinstance(bridge["length"], bool) \
            or not isinstance(bridge["length"], int) or bridge["length"] < 0:
        raise OptionError("cannot resume: the state's bridge must hold the state it bridges "
                          f"from and an integer length >= 0, got {bridge!r:.80}")


def resumed(state: dict[str, Any], other: bool,
            build_from: Callable[[dict[str, Any]], Bridge]) -> Bridge | None:
    """The bridge a sampler resumes ``state`` on: from ``state`` itself where it was saved over
    another version (``other``), the same one again where it was saved in a bridged epoch over
    this one, else None (the epoch's own order)."""
    if other:
        return build_from(state)
    if "bridge" not in state:
        return None
    check_bridge(state["bridge"])
    found = build_from(state["bridge"]["state"])
    if len(found.indices) != state["bridge"]["length"]:
        raise OptionError(f"cannot resume: the state's bridge held {state['bridge']['length']} "
                          f"samples, the versions it joins share {len(found.indices)}")
    return found


def build(dataset: Any, state: dict[str, Any], make: Callable[..., Any]) -> Bridge:
    """The bridge from ``state`` (saved over another version of ``dataset``'s store) to
    ``dataset``; ``make`` builds the sampler that reads the saved version (``ShardSampler``)."""
    if not (hasattr(dataset, "index_of") and hasattr(dataset, "root")
            and hasattr(dataset, "store")):
        raise OptionError(f"across_versions needs a sampler over one ShardDataset (records found "
                          f"again by key), not a {type(dataset).__name__}")
    saved = saved_version(state)
    root, store = dataset.root, dataset.store
    cache = getattr(store, "cache", None)
    if cache is None and os.path.isdir(root):
        kept = versions.numbers(root)
        if saved not in kept:
            raise OptionError(f"across_versions: version {saved} of {root}, which the state was "
                              "saved over, is no longer kept (kept: "
                              f"{', '.join(map(str, kept)) or 'only the current one'})")
    options = {} if cache is None else {
        "cache_dir": cache.root, "cache_limit": cache.cache_limit,
        "storage_options": getattr(cache.remote, "storage_options", None)}
    old_ds = type(dataset)(root, version=saved, **options)
    try:
        old = make(old_ds, num_replicas=1, rank=0, shuffle=state.get("shuffle"),
                   seed=state.get("seed"), drop_last=state.get("drop_last"))
        try:
            old.load_state_dict(state)
        except OptionError as exc:
            raise OptionError(f"across_versions: the state does not resume on version {saved} "
                              f"of {root} read whole ({exc})") from None
        keys = [old_ds.key(i) for i in old.indices().tolist()]
    finally:
        old_ds.close()
    found = []
    for key in keys:
        try:
            found.append(dataset.index_of(key))
        except KeyError:  # deleted or compacted away since: not in the rest
            pass
    return Bridge(np.asarray(found, dtype=np.int64), state)
