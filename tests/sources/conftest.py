"""Sources built by the libraries that write them, from one image folder, and the folder
packed the ordinary way: a container source must give the same store."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import image_tree

import shardkit
from shardkit.read.store import Store

CLASSES = ["c0", "c1", "c2"]


def store_records(path: str) -> list[tuple[bytes, int, int, int, str]]:
    """(record bytes, label, height, width, source path) of every record, in index order."""
    store = Store(path)
    out = []
    try:
        for k, entry in enumerate(store.shards):
            shard = store.shard(k)
            with shard.reader.records() as get:
                for local in range(entry.count):
                    out.append((bytes(get(local)), int(shard.labels[local]),
                                int(shard.heights[local]), int(shard.widths[local]),
                                shard.source_path(local)))
    finally:
        store.close()
    return out


def store_fields(path: str, name: str) -> list:
    """Typed field ``name`` of every record, in index order."""
    store = Store(path)
    try:
        return [store.shard(k).fields.value(name, local)
                for k, entry in enumerate(store.shards) for local in range(entry.count)]
    finally:
        store.close()


def store_files(path: str) -> dict[str, bytes]:
    """Every file of a store (a single file, or a folder's files) by name."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {os.path.basename(path): f.read()}
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> tuple[str, list[tuple[str, int]]]:
    """(root, [(relpath, label)] in ImageFolder order): 3 classes x 8, one PNG per class."""
    root = str(tmp_path_factory.mktemp("src-folder") / "src")
    return root, image_tree(root, classes=3, per_class=8, seed=11, pngs=1, sides=(40, 120))


@pytest.fixture(scope="session")
def folder_store(folder, tmp_path_factory):
    """``folder_store(size)`` -> the folder packed once at that size (workers=1)."""
    cache: dict[int, str] = {}
    base = tmp_path_factory.mktemp("folder-stores")

    def get(size: int = 64) -> str:
        if size not in cache:
            out = str(base / f"folder-{size}.lmdb")
            shardkit.pack(folder[0], out, size=size, workers=1, progress=False)
            cache[size] = out
        return cache[size]

    return get


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def sample_key(rel: str) -> str:
    """A WebDataset key for a folder image: no dot in it (the key rule splits there)."""
    return rel.rsplit(".", 1)[0].replace("/", "_")


@pytest.fixture(scope="session")
def mds_env():
    """(python, env) running mosaicml-streaming: scripts/mds_side_env.sh over .venv-tv."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python = os.environ.get("SHARDKIT_TV_PYTHON") or os.path.join(root, ".venv-tv", "bin",
                                                                   "python")
    target = os.environ.get("SHARDKIT_MDS_PATH") or os.path.join(root, ".venv-mds")
    if not (os.path.exists(python) and os.path.isdir(os.path.join(target, "streaming"))):
        message = f"no MosaicML Streaming side environment at {target} (run scripts/mds_side_env.sh)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI builds it")
        pytest.skip(message)
    env = dict(os.environ, PYTHONPATH=target)
    return python, env


@pytest.fixture(scope="session")
def litdata_env():
    """(python, env) running litdata's writer: scripts/litdata_side_env.sh over .venv."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    target = os.environ.get("SHARDKIT_LITDATA_PATH") or os.path.join(root, ".venv-litdata")
    if not os.path.isdir(os.path.join(target, "litdata")):
        message = f"no LitData side environment at {target} (run scripts/litdata_side_env.sh)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI builds it")
        pytest.skip(message)
    return sys.executable, dict(os.environ, PYTHONPATH=target)


@pytest.fixture(scope="session")
def lerobot_env():
    """(python, env) running LeRobot's LeRobotDataset: scripts/lerobot_side_env.sh over .venv-tv."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python = os.environ.get("SHARDKIT_TV_PYTHON") or os.path.join(root, ".venv-tv", "bin",
                                                                   "python")
    target = os.environ.get("SHARDKIT_LEROBOT_PATH") or os.path.join(root, ".venv-lerobot")
    if not (os.path.exists(python) and os.path.isdir(os.path.join(target, "lerobot"))):
        message = f"no .venv-lerobot environment at {target} (run scripts/lerobot_side_env.sh)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI builds it")
        pytest.skip(message)
    return python, dict(os.environ, PYTHONPATH=target,
                        LD_LIBRARY_PATH=os.path.join(target, "ffmpeg-libs"))


def run_side(mds_env, code: str, *args: str) -> str:
    python, env = mds_env
    proc = subprocess.run([python, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f)
