"""Deterministic faults for testing the Dask engine's failure handling on a real cluster, where
nothing can be patched inside the worker processes (docs/cluster.md).

``SHARDKIT_FAULTS`` names a JSON file, read at the start of each shard task while it exists::

    {"3": {"fail": 2}}            # attempts 1 and 2 at shard 3 raise OSError(EIO); -1: every one
    {"5": {"hold": "/tmp/go"}}    # attempt 1 at shard 5 waits until the file /tmp/go exists
                                  # (then fails, if "fail" says so too)
    {"7": {"task": 1}}            # the first task holding shard 7 raises before any shard of it
                                  # runs (a task that fails as a whole: not one of its shards)

Every attempt at a listed shard appends a line (the shard number) to ``<file>.attempts``, and
an attempt that holds writes its process id to ``<file>.held-<shard>`` first (so a test can
SIGKILL the worker that runs it). Unset (the default), a task pays one environment lookup.
"""

from __future__ import annotations

import errno
import json
import os
import time

ENV = "SHARDKIT_FAULTS"


def _spec(k: int) -> tuple[str, dict] | None:
    """(the spec file, shard ``k``'s entry) when ``SHARDKIT_FAULTS`` lists ``k``."""
    spec_path = os.environ.get(ENV)
    if not spec_path:
        return None
    try:
        with open(spec_path, "rb") as f:
            spec = json.loads(f.read()).get(str(k))
    except FileNotFoundError:
        return None
    return (spec_path, spec) if spec else None


def _count(path: str, k: int) -> int:
    """Append ``k`` to the file ``path``; how many times it is there now."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{k}\n".encode())  # one small O_APPEND write: atomic between processes
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        return f.read().split().count(str(k).encode())


def inject_task(group: list[int]) -> None:
    """Raise as ``SHARDKIT_FAULTS`` says for a task holding the shards ``group`` ("task": the
    first N such tasks of a shard raise); each counted in ``<file>.tasks``."""
    for k in group:
        found = _spec(k)
        if found and "task" in found[1]:
            attempt = _count(f"{found[0]}.tasks", k)
            if attempt <= int(found[1]["task"]):
                raise OSError(errno.EIO, f"injected task fault at shard {k}, task {attempt} "
                                         f"({ENV})")


def inject(k: int) -> None:
    """Raise or wait as ``SHARDKIT_FAULTS`` says for this attempt at shard ``k``."""
    found = _spec(k)
    if not found or set(found[1]) == {"task"}:
        return
    spec_path, spec = found
    attempt = _count(f"{spec_path}.attempts", k)
    hold = spec.get("hold")
    if hold and attempt == 1:
        with open(f"{spec_path}.held-{k}.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(f"{spec_path}.held-{k}.tmp", f"{spec_path}.held-{k}")
        while not os.path.exists(hold):
            time.sleep(0.05)
    fail = int(spec.get("fail", 0))
    if fail < 0 or attempt <= fail:
        raise OSError(errno.EIO, f"injected fault at shard {k}, attempt {attempt} ({ENV})")
