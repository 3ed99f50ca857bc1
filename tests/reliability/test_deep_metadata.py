"""Metadata nested deeper than Python's recursion limit: a damaged or hostile ``manifest.json``,
shard metadata (single-file stores of every format) and a remote store's manifest are refused
with ``StoreError``, and ``shardkit info``/``verify`` print one line, no traceback.

``json.loads`` raises RecursionError on such input; nothing may let that through.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import shardkit
from helpers import image_tree, one_line_error, run_cli
from shardkit import metadata
from shardkit.errors import StoreError
from shardkit.fileutil import sha256_file
from shardkit.formats import FORMATS, SUFFIXES
from shardkit.read.store import Store

DEPTH = 30_000  # far past any recursion limit, and under HDF5's 64 KiB attribute limit
NESTED = b"[" * DEPTH + b"]" * DEPTH
TOO_DEEP = "nests too deeply to parse"


def deep_json() -> bytes:
    """A JSON object that starts like shardkit's metadata and holds ``NESTED``."""
    return b'{"format": "shardkit", "format_version": 1, "kind": "sharded", "x": %s}' % NESTED


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("deep") / "src")
    image_tree(root, classes=2, per_class=3, seed=4)
    return root


def _refused_everywhere(path: str, where: str) -> None:
    """Python callers get StoreError naming ``where``; info and verify print one line."""
    with pytest.raises(StoreError) as info:
        Store(path)
    assert TOO_DEEP in str(info.value) and where in str(info.value)
    with pytest.raises(StoreError, match=TOO_DEEP):
        shardkit.ShardDataset(path)
    for command, proc in _info_and_verify(path).items():
        assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr[-2000:]
        assert proc.stderr.startswith(f"shardkit {command}: error: {where}") and \
            TOO_DEEP in proc.stderr, proc.stderr


def _info_and_verify(path: str) -> dict[str, subprocess.CompletedProcess]:
    """``shardkit info PATH`` and ``shardkit verify PATH``, run at the same time."""
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda command: run_cli(command, path), ("info", "verify"))
        return dict(zip(("info", "verify"), done))


def test_deep_manifest_is_a_store_error(src, tmp_path):
    out = str(tmp_path / "store")
    shardkit.pack(src, out, num_shards=2, size=16, workers=1, progress=False)
    manifest = os.path.join(out, "manifest.json")
    with open(manifest, "wb") as f:
        f.write(deep_json())
    _refused_everywhere(out, manifest)


def test_a_nested_format_tag_is_named_briefly(src, tmp_path):
    """Parseable (900 levels) but not shardkit's: the message names the field's kind, not its
    2,000-character repr."""
    out = str(tmp_path / "store")
    shardkit.pack(src, out, num_shards=2, size=16, workers=1, progress=False)
    manifest = os.path.join(out, "manifest.json")
    with open(manifest, "wb") as f:
        f.write(b'{"format": %s}' % (b"[" * 900 + b"]" * 900))
    proc = run_cli("info", out)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr[-2000:]
    assert proc.stderr.strip() == (f"shardkit info: error: {manifest}: not a shardkit store "
                                   "(format tag <a JSON array>)")


def _write_shard_meta(path: str, raw: bytes) -> None:
    """Replace a single-file store's metadata with ``raw``, as an outside tool would."""
    with open(path, "rb") as f:
        hdf5 = f.read(8) == b"\x89HDF\r\n\x1a\n"
    if hdf5:
        import h5py

        with h5py.File(path, "r+") as h:
            assert "shardkit_meta" in h.attrs
            h.attrs["shardkit_meta"] = np.bytes_(raw)
        return
    import lmdb

    env = lmdb.open(path, subdir=False, lock=False, map_size=os.path.getsize(path) + (16 << 20))
    try:
        with env.begin(write=True) as txn:
            assert txn.get(b"__meta__") is not None
            txn.put(b"__meta__", raw)
    finally:
        env.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_deep_shard_metadata_is_a_store_error(src, tmp_path, fmt):
    out = str(tmp_path / f"store{SUFFIXES[fmt]}")
    shardkit.pack(src, out, size=16, workers=1, progress=False)
    _write_shard_meta(out, deep_json().replace(b'"sharded"', b'"single"'))
    _refused_everywhere(out, out)


def test_deep_shard_metadata_in_a_folder_store_is_a_fault(src, tmp_path):
    """The manifest is intact, one shard's own metadata is not: verify lists it as a fault (one
    line per fault, no traceback); reading that shard raises StoreError."""
    out = str(tmp_path / "store")
    shardkit.pack(src, out, num_shards=2, size=16, workers=1, progress=False)
    manifest_path = os.path.join(out, "manifest.json")
    with open(manifest_path, "rb") as f:
        manifest = json.loads(f.read())
    entry = manifest["shards"][1]
    shard = os.path.join(out, entry["file"])
    _write_shard_meta(shard, deep_json().replace(b'"sharded"', b'"shard"'))
    # The manifest vouches for the changed file (size, SHA-256, resealed): only its content is bad.
    entry["bytes"], entry["sha256"] = os.path.getsize(shard), sha256_file(shard)
    with open(manifest_path, "wb") as f:
        f.write(metadata.dumps(metadata.seal(manifest)))
    proc = run_cli("verify", out, "-q")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    faults = [line for line in proc.stderr.splitlines() if line.startswith("fault: ")]
    assert any(shard in line and TOO_DEEP in line for line in faults), proc.stderr
    ds = shardkit.ShardDataset(out)
    read, refused = 0, []
    try:
        for i in range(len(ds)):  # records of shard 0 read; shard 1's are refused
            try:
                ds[i]
                read += 1
            except StoreError as exc:
                refused.append(str(exc))
    finally:
        ds.close()
    assert read == entry["start"] and len(refused) == entry["count"]
    assert all(shard in msg and TOO_DEEP in msg for msg in refused), refused[:2]


def test_deep_remote_manifest_is_a_store_error(src, tmp_path, monkeypatch):
    """A remote store whose ``manifest.json`` object nests too deeply, on a real S3-protocol
    server (moto): the Python API and ``info``/``verify`` on the URL give one StoreError line."""
    pytest.importorskip("s3fs")
    import boto3
    from helpers.s3server import DUMMY_ENV, S3Server

    for key, value in DUMMY_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "cache"))
    local = str(tmp_path / "store")
    shardkit.pack(src, local, num_shards=2, size=16, workers=1, progress=False)
    with S3Server() as server:
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)  # the CLI children inherit it
        bucket = server.new_bucket()
        client = boto3.client("s3", endpoint_url=server.endpoint)
        for name in os.listdir(local):  # the store as uploaded, then its manifest replaced
            with open(os.path.join(local, name), "rb") as f:
                client.put_object(Bucket=bucket, Key=f"train/{name}", Body=f.read())
        client.put_object(Bucket=bucket, Key="train/manifest.json", Body=deep_json())
        url = f"s3://{bucket}/train"
        with pytest.raises(StoreError) as info:
            Store(url)
        assert TOO_DEEP in str(info.value) and "manifest.json" in str(info.value)
        for command, proc in _info_and_verify(url).items():
            assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr[-2000:]
            assert proc.stderr.startswith(f"shardkit {command}: error: ") and \
                TOO_DEEP in proc.stderr and "manifest.json" in proc.stderr, proc.stderr
