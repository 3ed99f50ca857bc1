"""Fixtures the remote test modules share; each module keeps its own parameters.

A module using ``src`` or ``local`` sets ``SOURCE`` (``image_tree`` keywords: classes, per_class,
seed) and ``SHARDS``. Both fixtures are module-scoped: each module gets its own tree and pack,
made once and read by all its tests (treat them as read-only).
"""

from __future__ import annotations

import pytest
from helpers import image_tree
from helpers.s3server import use_dummy_credentials

import shardkit


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
