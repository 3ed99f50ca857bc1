"""A folder store's manifest is checked before it is trusted: its size before it is read (a huge
file is refused unread), its record count against the per-record files at open."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import shardkit
from helpers import image_tree, one_line_error, run_cli
from helpers.damage import forge_count
from shardkit import ShardDataset, metadata
from shardkit.errors import StoreError


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("manifest-checks")
    image_tree(str(base / "src"), classes=2, per_class=3, seed=3)
    shardkit.pack(str(base / "src"), str(base / "store"), num_shards=2, workers=1,
                  progress=False)
    return str(base / "store")


_OPEN = textwrap.dedent("""
    import resource, sys
    from shardkit import ShardDataset
    from shardkit.errors import StoreError
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        ShardDataset(sys.argv[1])
    except StoreError as exc:
        print(exc)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
""")


def test_an_oversized_manifest_is_refused_unread(store, tmp_path):
    folder = str(tmp_path / "store")
    shutil.copytree(store, folder)
    manifest = os.path.join(folder, metadata.MANIFEST_NAME)
    os.truncate(manifest, metadata.MAX_MANIFEST_BYTES + 1)  # sparse: no disk used
    out = subprocess.run([sys.executable, "-c", _OPEN, folder], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    message, grown_mb = out.stdout.strip().splitlines()
    assert message == (f"{manifest}: manifest is implausibly large "
                       f"({metadata.MAX_MANIFEST_BYTES + 1} bytes; at most "
                       f"{metadata.MAX_MANIFEST_BYTES} are read)")
    assert int(grown_mb) < 32  # not read: reading it would take 512 MiB and more
    proc = run_cli("info", folder)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert "manifest is implausibly large" in proc.stderr


def test_a_forged_record_count_is_refused_at_open(store, tmp_path):
    folder = str(tmp_path / "store")
    shutil.copytree(store, folder)
    forge_count(folder, 2 ** 40)
    manifest = os.path.join(folder, metadata.MANIFEST_NAME)
    with pytest.raises(StoreError, match="^" + re.escape(
            f"{manifest}: manifest says {2 ** 40} records, but labels.npy holds labels of shape "
            "[6]")):
        ShardDataset(folder)
    proc = run_cli("info", folder)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert f"manifest says {2 ** 40} records" in proc.stderr


def test_a_sealed_manifest_with_a_huge_class_name_is_refused_before_it_is_parsed(store, tmp_path):
    """A 16 MB class name, class_to_idx to match and the seal recomputed: every check but the
    string bound passes. It is refused with the bound in the message, and opening costs what
    reading the file costs, not the copies parsing and the seal's check would make."""
    import json
    import tracemalloc
    import zlib

    folder = str(tmp_path / "store")
    shutil.copytree(store, folder)
    path = os.path.join(folder, metadata.MANIFEST_NAME)
    with open(path) as f:
        manifest = json.load(f)
    name = "c" * (16 << 20)
    manifest["classes"][0] = name
    manifest["class_to_idx"] = {c: i for i, c in enumerate(manifest["classes"])}
    body = {k: v for k, v in manifest.items() if k != metadata.SEAL_KEY}
    raw = metadata.dumps(body | {metadata.SEAL_KEY: zlib.crc32(metadata.dumps(body))})
    with open(path, "wb") as f:
        f.write(raw)
    del manifest, body, name
    tracemalloc.start()
    try:
        with pytest.raises(StoreError, match=rf"manifest.json: metadata holds a string of over "
                           rf"{metadata.MAX_STRING_BYTES} bytes, the most shardkit writes "
                           r"\(damaged store or not written by shardkit\)$"):
            ShardDataset(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the read (1 MB blocks joined: twice the file) and the scan's 1 MB blocks; parsing it
    # and checking its seal took three times the file more
    assert peak < 2 * len(raw) + (8 << 20), peak
    # the writer refuses to seal such metadata: no store it could not read
    with pytest.raises(ValueError, match="a string of over 65536 bytes, the most a store may"):
        metadata.seal({"classes": ["c" * (metadata.MAX_STRING_BYTES + 1)]})
