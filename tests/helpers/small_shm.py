"""Running a program under a 64 MB ``/dev/shm`` (Docker's default): a mount namespace whose
/dev/shm is a fresh 64 MB tmpfs (``unshare -m``, as root). Used by ``tests/read/test_shm.py``
(every ``ds.loader`` path through worker processes) and ``tests/integrations/
test_thread_engine.py`` (the thread engine)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from helpers import program_cmd, program_env


def namespace_or_skip() -> None:
    """Skip where a 64 MB /dev/shm cannot be mounted in a namespace, except under CI (env
    ``CI`` set), where it fails."""
    why = None
    if os.geteuid() != 0:
        why = "needs root (mount a 64 MB tmpfs on /dev/shm in a mount namespace)"
    elif shutil.which("unshare") is None:
        why = "needs unshare (util-linux)"
    else:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs "
                                "/dev/shm && df -k /dev/shm"], capture_output=True, text=True)
        if probe.returncode != 0 or " 65536 " not in probe.stdout:
            why = f"cannot mount a 64 MB /dev/shm in a mount namespace: {probe.stderr.strip()}"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why + " (CI must run this test)")
        pytest.skip(why)


def run_in_small_shm(store: str, context: str, cases: list[str]) -> dict[str, dict]:
    """Read each of ``cases`` in turn (``helpers.programs.shm_loader``), in one process under a
    64 MB /dev/shm: {case: its JSON line}; a case with no line (the process died first) gets
    ``error``: how it ended."""
    command = " ".join([*program_cmd("shm_loader"), store, context, *cases])
    done = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs "
                           f"/dev/shm && exec {command}"], capture_output=True, text=True,
                          env=program_env(), timeout=300)
    got = {}
    for line in done.stdout.splitlines():
        entry = json.loads(line)
        got[entry.pop("case")] = entry
    for case in cases:
        got.setdefault(case, {"error": f"no result: exit status {done.returncode}; "
                                       f"{done.stderr[-3000:]}"})
    return got
