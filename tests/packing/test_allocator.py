"""glibc's thresholds while a Dask worker packs a shard (:mod:`shardkit.packing.allocator`).

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which pins glibc's mmap
threshold at 128 KiB: every image-sized block is then a fresh mmap. Inside ``image_blocks()``
large blocks come from the heap; after it the pinned behaviour is back; without the variable
nothing is touched (glibc's dynamic threshold stays on). Observed in a real process through
``mallinfo2().hblkhd`` (bytes in mmapped blocks)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")

PROBE = r"""
import ctypes, json, threading
from shardkit.packing.allocator import image_blocks

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mapped(n=4 << 20):
    before = libc.mallinfo2().hblkhd
    p = libc.malloc(n)
    got = libc.mallinfo2().hblkhd - before >= n
    libc.free(p)
    return got

seen = {"before": [mapped(), mapped()]}
with image_blocks():
    seen["inside"] = [mapped(), mapped()]
    # a second task on another thread of the same worker: the first to end restores nothing
    inner = threading.Event(); leave = threading.Event()
    def other():
        with image_blocks():
            inner.set(); leave.wait()
    t = threading.Thread(target=other); t.start(); inner.wait()
seen["other task still running"] = [mapped(), mapped()]
leave.set(); t.join()
seen["after"] = [mapped(), mapped()]
print(json.dumps(seen))
"""


def _probe(env: dict[str, str]) -> dict[str, list[bool]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE], env=base | env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_large_blocks_come_from_the_heap_during_a_task_under_dasks_pinned_thresholds():
    seen = _probe({"MALLOC_TRIM_THRESHOLD_": "65536"})  # what Dask's nanny sets
    assert seen == {"before": [True, True], "inside": [False, False],
                    "other task still running": [False, False], "after": [True, True]}


def test_nothing_is_touched_without_pinned_thresholds():
    """glibc's dynamic threshold stays on (a freed 4 MiB block raises it: the next one comes
    from the heap), inside and after; a user's own mmap threshold is left as it is."""
    assert _probe({}) == {"before": [True, False], "inside": [False, False],
                          "other task still running": [False, False], "after": [False, False]}
    pinned = {"MALLOC_TRIM_THRESHOLD_": "65536", "MALLOC_MMAP_THRESHOLD_": "131072"}
    assert _probe(pinned) == {"before": [True, True], "inside": [True, True],
                              "other task still running": [True, True], "after": [True, True]}
