"""A real Dask cluster on 127.0.0.1 for tests and benchmarks: ``dask scheduler`` and ``dask
worker`` started as separate processes (the deployment a user runs), stopped with the context."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(address: str, nworkers: int = 1) -> list[str]:
    """``dask worker`` for the scheduler at ``address``: ``nworkers`` single-threaded
    processes on 127.0.0.1."""
    return [os.path.join(os.path.dirname(sys.executable), "dask"), "worker", address,
            "--nworkers", str(nworkers), "--nthreads", "1", "--no-dashboard", "--host",
            "127.0.0.1"]


@contextlib.contextmanager
def dask_cluster(nworkers: int = 2, timeout: float = 120, env: dict | None = None
                 ) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """(scheduler address, [scheduler process, worker process]): ``nworkers`` single-threaded
    worker processes under one ``dask worker`` (with its nanny), ready when the context opens;
    ``nworkers=0``: the scheduler alone (``worker_command`` starts a worker for it)."""
    from dask.distributed import Client

    bindir = os.path.dirname(sys.executable)
    dask = os.path.join(bindir, "dask")
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    env = dict(os.environ, **(env or {}))
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], env=env, start_new_session=True, **quiet)]
    try:
        if nworkers:
            procs.append(subprocess.Popen(worker_command(address, nworkers), env=env,
                                          start_new_session=True, **quiet))
        deadline = time.monotonic() + timeout
        while True:
            try:
                with Client(address, timeout=5) as client:
                    if nworkers:
                        client.wait_for_workers(nworkers,
                                                timeout=max(1, deadline - time.monotonic()))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield address, procs
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
