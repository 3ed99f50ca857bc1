"""Damaged-store tests' tools: small real stores of every format, and a child process that reads
stores and reports, per store, what a user would get (``helpers.programs.damaged_reader``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import numpy as np
from PIL import Image

import shardkit
from shardkit.codec import ENCODINGS
from shardkit.formats import FORMATS

from helpers import run_program

CASE_TIMEOUT = 20  # seconds per store within a batch before the child counts as hung


def run_batch(paths: list[str], tmp: str) -> tuple[dict[str, dict], dict[str, str]]:
    """Read ``paths`` in child processes; (results by path, {path: fatal problem}).

    A child that dies or hangs is charged to the first store it had not reported yet; the stores
    after that one are retried in a fresh child.
    """
    results: dict[str, dict] = {}
    fatal: dict[str, str] = {}
    pending = list(paths)
    while pending:
        try:
            proc = run_program("damaged_reader", str(CASE_TIMEOUT),
                               input="\n".join(pending) + "\n", capture_output=True,
                               text=True, timeout=60 + CASE_TIMEOUT * len(pending))
            stdout, how = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or b""
            stdout, how = (out.decode() if isinstance(out, bytes) else out), "hang"
            proc = None
        for line in stdout.splitlines():
            res = json.loads(line)
            results[res["path"]] = res
        rest = [p for p in pending if p not in results]
        if not rest:
            break
        if how == 0:
            fatal[rest[0]] = "child exited without reporting it"
        elif how in ("hang", -signal.SIGALRM):
            fatal[rest[0]] = f"hang (no answer within {CASE_TIMEOUT} s)"
        else:
            stderr = proc.stderr[-1500:] if proc is not None else ""
            fatal[rest[0]] = f"child died with status {how} (signal {-how if how < 0 else '-'})\n{stderr}"
        pending = rest[1:]
    return results, fatal


def source_tree(root: str) -> str:
    """12 small images (PNG and JPEG, odd sizes) in two classes, one with a non-ASCII name."""
    rng = np.random.default_rng(5)
    for c in ("cat", "gnu\u00e9"):
        os.makedirs(os.path.join(root, c))
        for i in range(6):
            arr = rng.integers(0, 256, (30 + 3 * i, 41 - i, 3), dtype=np.uint8)
            ext = "png" if i % 2 else "jpg"
            Image.fromarray(arr).save(os.path.join(root, c, f"img{i}.{ext}"))
    return root


# name -> (format, encoding, num_shards): every format as one file (first encoding) and as a
# folder of two shards (last encoding).
STORES = {**{f"{fmt}-single": (fmt, ENCODINGS[0], None) for fmt in FORMATS},
          **{f"{fmt}-sharded": (fmt, ENCODINGS[-1], 2) for fmt in FORMATS}}


def pack_pristine(base: str) -> dict[str, str]:
    """``STORES`` packed under ``base`` from one ``source_tree``: name -> store path."""
    src = source_tree(os.path.join(base, "src"))
    out = {}
    for name, (fmt, encoding, shards) in STORES.items():
        path = os.path.join(base, name)
        shardkit.pack(src, path, format=fmt, encoding=encoding, size=32, workers=1,
                      num_shards=shards, progress=False)
        out[name] = path
    return out


def vouch_for_labels(folder: str) -> None:
    """Make a folder store's manifest vouch for whatever ``labels.npy`` now holds: its sha256
    recorded and the manifest resealed, so only checks beyond the checksum can catch it."""
    from shardkit.fileutil import sha256_file
    from shardkit.metadata import seal

    manifest_path = os.path.join(folder, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["labels"]["sha256"] = sha256_file(os.path.join(folder, "labels.npy"))
    with open(manifest_path, "w") as f:
        json.dump(seal(manifest), f)


def forge_count(folder: str, count: int) -> None:
    """Make a folder store's manifest claim ``count`` records, consistently (its last shard's
    count grown to match) and resealed: only a check against the files themselves can catch it."""
    from shardkit.metadata import seal

    manifest_path = os.path.join(folder, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["shards"][-1]["count"] += count - manifest["count"]
    manifest["count"] = count
    with open(manifest_path, "w") as f:
        json.dump(seal(manifest), f)
