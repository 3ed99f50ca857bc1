"""Deterministic faults for testing the Dask engine's failure handling on a real cluster, where
nothing can be patched inside the worker processes (docs/cluster.md).

``SHARDKIT_FAULTS`` names a JSON file, read at the start of each shard task while it exists::

    {"3": {"fail": 2}}            # attempts 1 and 2 at shard 3 raise OSError(EIO); -1: every one
    {"5": {"hold": "/tmp/go"}}    # attempt 1 at shard 5 waits until the file /tmp/go exists
                                  # (then fails, if "fail" says so too)

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


def inject(k: int) -> None:
    """Raise or wait as ``SHARDKIT_FAULTS`` says for this attempt at shard ``k``."""
    spec_path = os.environ.get(ENV)
    if not spec_path:
        return
    try:
        with open(spec_path, "rb") as f:
            spec = json.loads(f.read()).get(str(k))
    except FileNotFoundError:
        return
    if not spec:
        return
    fd = os.open(f"{spec_path}.attempts", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{k}\n".encode())  # one small O_APPEND write: atomic between processes
    finally:
        os.close(fd)
    with open(f"{spec_path}.attempts", "rb") as f:
        attempt = f.read().split().count(str(k).encode())
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
