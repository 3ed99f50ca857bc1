"""A real S3-protocol server for tests: moto's ThreadedMotoServer on 127.0.0.1, with a request log.

The log records every request the server receives (method, path), so tests count downloads and
uploads from the server's side. ``hold(path)`` makes GETs of that object wait until
``release()``, so a test can keep a download in flight while it checks what other processes do.
"""

from __future__ import annotations

import threading
import uuid

from moto.server import ThreadedMotoServer

DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


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

    def start(self) -> "S3Server":
        self._moto.start()
        wsgi = self._moto._server  # werkzeug's server: it calls .app for every request
        inner = wsgi.app

        def app(environ, start_response):
            method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
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
