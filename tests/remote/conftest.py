"""Fixtures the remote test modules share; each module keeps its own parameters.

A module using ``src`` or ``local`` sets ``SOURCE`` (``image_tree`` keywords: classes, per_class,
seed) and ``SHARDS``. Both fixtures are module-scoped: each module gets its own tree and pack,
made once and read by all its tests (treat them as read-only).

A module reading a URL source through the fault proxy uploads its tree with ``proxied_s3`` (one
server and proxy for the module) and takes ``proxy`` in tests that inject faults.
"""

from __future__ import annotations

import boto3
import fsspec
import pytest
from helpers import image_tree
from helpers.faultproxy import FaultProxy
from helpers.s3server import S3Server, use_dummy_credentials

import shardkit
import shardkit.remote.access


def _module(request) -> str:
    return request.module.__name__.rsplit(".", 1)[-1]


@pytest.fixture(scope="module")
def src(request, tmp_path_factory) -> str:
    """The module's ImageFolder tree: ``image_tree(**SOURCE)``."""
    root = str(tmp_path_factory.mktemp(_module(request)) / "src")
    image_tree(root, **request.module.SOURCE)
    return root


@pytest.fixture(scope="module")
def local(request, src, tmp_path_factory) -> str:
    """``src`` packed locally into ``SHARDS`` shards: the reference remote reads are compared
    with."""
    out = str(tmp_path_factory.mktemp(f"{_module(request)}-local") / "train")
    shardkit.pack(src, out, num_shards=request.module.SHARDS, workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def s3_env():
    """A ``MonkeyPatch`` holding the dummy credentials for the whole module; a server fixture
    sets ``AWS_ENDPOINT_URL`` on it where the module's clients should reach that server."""
    with pytest.MonkeyPatch.context() as mpatch:
        use_dummy_credentials(mpatch)
        yield mpatch


@pytest.fixture(scope="module")
def proxied_s3(s3_env):
    """(proxy, upload): a moto server with the fault proxy in front, one for the module. Every
    client of this process (and of the workers it starts) goes through the proxy, from the
    start: a URL source's filesystem is made once per process and keeps the endpoint it was
    made with. ``upload(tree, name, objects=None)`` puts the local folder ``tree``, and
    ``objects`` ({key below ``name``: bytes}, keys a folder cannot hold included), straight to
    the server under ``s3://<a new bucket>/<name>`` and returns that URL."""
    with S3Server() as server, FaultProxy(server.endpoint) as proxy:
        s3_env.setenv("AWS_ENDPOINT_URL", proxy.endpoint)

        def upload(tree: str, name: str, objects: dict[str, bytes] | None = None) -> str:
            bucket = server.new_bucket()
            fsspec.filesystem("s3", skip_instance_cache=True, endpoint_url=server.endpoint).put(
                tree + "/", f"{bucket}/{name}/", recursive=True)
            client = boto3.client("s3", endpoint_url=server.endpoint)
            for key, data in (objects or {}).items():
                client.put_object(Bucket=bucket, Key=f"{name}/{key}", Body=data)
            return f"s3://{bucket}/{name}"

        yield proxy, upload


@pytest.fixture
def proxy(proxied_s3, monkeypatch):
    """The module's fault proxy, with quick retries in this process; its faults and held
    transfers cleared after the test."""
    proxy = proxied_s3[0]
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.05, 0.05))
    yield proxy
    proxy.clear()
