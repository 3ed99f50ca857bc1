"""A plan folder's identity and seal (the files are :mod:`.plan_store`'s).

The fingerprint (:func:`fingerprint`) says what decides a pack's output: ``resume`` keeps an
earlier run's work only where it is the same. The seal, written with the header
(:func:`write_header`), is every plan file's SHA-256: a plan is checked against it
(:func:`check`) before it is used, once per process and version of its files, since a damaged
or altered plan would pack wrong labels or other images and nothing else in a pack could tell.
Its error, :class:`.plan_store.PlanError`, is not retried.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from .. import metadata
from ..errors import StoreError
from ..fileutil import sha256_file
from .plan_store import (CHUNK, HEADER, INDEX_DTYPE, INDEX_REFS, INDEX_SHARD, LABEL_DTYPE,
                         LABELS, OFFSETS, PATHS, PLACES, SLOTS, PlanError, damaged,
                         read_chunks, relative_chunk)

#: The plan files the seal covers (each that a plan has).
SEALED = (PATHS, OFFSETS, LABELS, SLOTS, PLACES, INDEX_SHARD, INDEX_REFS)

#: The parts of a plan's fingerprint, and what each stands for in a refusal's message.
PARTS = {"options": "settings, classes or shard boundaries", "sources": "source paths",
         "labels": "labels", "layout": "record layout", "fields": "record fields"}


def fingerprint(folder: str, header: dict[str, Any], root: str, extra: bytes = b""
                ) -> dict[str, str]:
    """The plan's identity for ``resume``, part by part (:data:`PARTS`): its settings, classes,
    bounds and layout (the header's ``key``); every source's path relative to ``root`` (and a
    container's index); every label; every slot; ``extra`` (the typed fields' key). Read in
    chunks. Another source list, label, setting or shard size gives another value; the same
    sources under a moved root give the same one. :func:`plan_id` makes it one value."""
    h = {name: hashlib.sha256() for name in PARTS}
    h["options"].update(metadata.dumps(header["key"]))
    h["fields"].update(extra)
    count = header["count"]
    labels = read_chunks(folder, LABELS, LABEL_DTYPE, count)
    with open(os.path.join(folder, PATHS), "rb") as paths:
        for a in range(0, count, CHUNK):
            n = min(CHUNK, count - a)
            offs = _offsets_chunk(folder, a, n)
            blob = paths.read(int(offs[-1] - offs[0]))
            if len(blob) != int(offs[-1] - offs[0]):
                raise damaged(folder, f"{PATHS} is shorter than its offsets say")
            rel, lengths = relative_chunk(blob, offs, root)
            h["sources"].update(rel)
            h["sources"].update(lengths.astype("<i8").tobytes())
            h["labels"].update(next(labels).astype("<i8").tobytes())
    if header.get("index") is not None:  # which bytes of which container each record is
        for name, dtype, width in ((INDEX_SHARD, "<i4", 1), (INDEX_REFS, INDEX_DTYPE, 2)):
            for chunk in read_chunks(folder, name, dtype, count * width):
                h["sources"].update(chunk.tobytes())
    if header.get("mixed"):
        for chunk in read_chunks(folder, SLOTS, INDEX_DTYPE, count):
            h["layout"].update(chunk.tobytes())
    return {name: part.hexdigest() for name, part in h.items()}


def plan_id(parts: dict[str, str]) -> str:
    """The one value of a fingerprint (:func:`fingerprint`): what ``resume`` and each shard's
    entry record."""
    return hashlib.sha256(metadata.dumps(parts)).hexdigest()


def _offsets_chunk(folder: str, a: int, n: int) -> np.ndarray:
    with open(os.path.join(folder, OFFSETS), "rb") as f:
        f.seek(a * INDEX_DTYPE.itemsize)
        data = f.read((n + 1) * INDEX_DTYPE.itemsize)
    if len(data) != (n + 1) * INDEX_DTYPE.itemsize:
        raise damaged(folder, f"{OFFSETS} is shorter than its header says")
    return np.frombuffer(data, INDEX_DTYPE)


# Identities of plan folders whose files this process found to match their seal: checked once
# per process, not once per task. Each file's device, inode, size and modification time, not
# the folder's name: a plan moved into the partial folder is not hashed again.
_sealed: set[tuple[Any, ...]] = set()


def _identity(folder: str) -> tuple[Any, ...]:
    out = []
    for name in (HEADER, *SEALED):
        try:
            st = os.stat(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        out.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def write_header(folder: str, header: dict[str, Any]) -> None:
    """Write the header, sealing the plan: its files' SHA-256 (each of :data:`SEALED` there)
    and the header's own checksum. Written last, once every file is complete."""
    files = {name: sha256_file(os.path.join(folder, name)) for name in SEALED
             if os.path.exists(os.path.join(folder, name))}
    with open(os.path.join(folder, HEADER), "wb") as f:
        f.write(metadata.dumps(metadata.seal(header | {"files": files})))
    _sealed.add(_identity(folder))  # just hashed: this process need not hash them again


def read_header(folder: str) -> dict[str, Any]:
    """The header, refused (:class:`PlanError`) unless it matches its own checksum."""
    try:
        with open(os.path.join(folder, HEADER), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise damaged(folder, f"no {HEADER}") from None
    try:
        header = json.loads(raw)
        whole = isinstance(header, dict) and metadata.seal(header) == header \
            and isinstance(header.get("files"), dict)
    except (ValueError, TypeError, RecursionError):
        header, whole = None, False
    if not whole:
        if isinstance(header, dict) and metadata.SEAL_KEY not in header:
            raise PlanError(f"the pack's plan in {folder} has no seal (written by an earlier "
                            "shardkit)")
        raise damaged(folder, f"{HEADER} does not match its checksum")
    return header


def check(folder: str) -> None:
    """Refuse (:class:`PlanError`) a plan whose files do not match their seal: each file the
    header lists must hold the bytes it was written with. Hashes the files once per process and
    version of them (their identity: a file changed in place or replaced is hashed again)."""
    identity = _identity(folder)
    if identity in _sealed:
        return
    header = read_header(folder)
    files = header["files"]
    needed = {PATHS, OFFSETS, LABELS} | ({SLOTS, PLACES} if header.get("mixed") else set()) \
        | ({INDEX_SHARD, INDEX_REFS} if header.get("index") is not None else set())
    missing = sorted(needed - set(files))
    if missing:
        raise damaged(folder, f"its header has no SHA-256 for {missing[0]}")
    for name, digest in sorted(files.items()):
        if name not in SEALED:
            raise damaged(folder, f"its header lists {name!r}, not a plan file")
        try:
            actual = sha256_file(os.path.join(folder, name))
        except (StoreError, OSError):
            raise damaged(folder, f"{name} is missing or unreadable") from None
        if actual != digest:
            raise damaged(folder, f"{name} does not match the SHA-256 in its header")
    _sealed.add(identity)
