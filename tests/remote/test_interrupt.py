"""Ctrl-C ends a loop whose reads wait on a stalled download, on every engine, at once.

A real moto S3 server behind ``helpers.faultproxy``, which holds every shard's GET; one reading
program per engine (``helpers/programs/stalled_reader.py``: a ``ShardSampler``'s read-ahead and
the loop's own reads both wait), each in its own process group, sent SIGINT as a terminal's
Ctrl-C is, once the proxy holds its GETs. A stalled read there gives up only after 600 s.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from helpers import program_cmd, program_env
from helpers.faultproxy import FaultProxy
from helpers.s3server import S3Server

from shardkit.remote import upload_folder_store

SOURCE = {"classes": 2, "per_class": 4, "seed": 53}  # src and local: tests/remote/conftest.py
SHARDS = 2
ENGINES = ("threads", "main", "workers")


@pytest.fixture(scope="module")
def server(s3_env):
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
        yield s3


def test_ctrl_c_ends_a_loop_waiting_on_a_stalled_download(server, local, tmp_path):
    bucket = server.new_bucket()
    for engine in ENGINES:
        upload_folder_store(local, f"s3://{bucket}/{engine}")
    with FaultProxy(server.endpoint) as proxy:
        for engine in ENGINES:
            proxy.add("GET", f"/{bucket}/{engine}/shard-*", "stall", at=10, times=None)
        env = program_env({"AWS_ENDPOINT_URL": proxy.endpoint})
        runs = {engine: subprocess.Popen(
            [*program_cmd("stalled_reader"), f"s3://{bucket}/{engine}",
             str(tmp_path / f"cache-{engine}"), engine], env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for engine in ENGINES}
        try:
            # each program's reads are waiting: the proxy holds a GET of one of its shards
            assert proxy.wait_for(lambda log: all(
                any(method == "GET" and path.startswith(f"/{bucket}/{engine}/shard-")
                    for method, path in log) for engine in ENGINES), 120)
            for run in runs.values():
                os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
            ended = {}
            for engine, run in runs.items():
                try:  # a guard against a hang, not a timing: a stalled read lasts 600 s
                    out, err = run.communicate(timeout=60)
                    ended[engine] = (run.returncode, out, err.strip().splitlines()[-1:])
                except subprocess.TimeoutExpired:
                    ended[engine] = "still running 60 s after Ctrl-C"
        finally:
            for run in runs.values():
                if run.poll() is None:
                    os.killpg(run.pid, signal.SIGKILL)
                    run.communicate()
            proxy.release()
    assert ended == {engine: (-signal.SIGINT, "", ["KeyboardInterrupt"]) for engine in ENGINES}
