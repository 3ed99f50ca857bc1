"""glibc's thresholds while a Dask worker packs a shard (:mod:`shardkit.packing.allocator`).

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which pins glibc's mmap
threshold at 128 KiB: every image-sized block is then a fresh mmap. Inside ``image_blocks()``
large blocks come from the heap; after it (once the worker is idle and its heap trimmed) the
pinned behaviour is back; the next task finds the heap the last one grew; without the variable
nothing is touched (glibc's dynamic threshold stays on). Observed in a real process through
``mallinfo2().hblkhd`` (bytes in mmapped blocks), page faults and resident memory."""

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
# Under Dask's setting, the idle trim: the heap the tasks grew goes back, so the first 4 MiB
# block after it is mapped again (while the heap is kept, it comes from there).
for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
    timer.join(30)
    assert not timer.is_alive()
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


IDLE_PROBE = r"""
import ctypes, json, resource, threading
from shardkit.packing import allocator

allocator.IDLE_TRIM_SECONDS = 60  # no trim between the two tasks, however slow the machine
PAGE = resource.getpagesize()
libc = ctypes.CDLL(None)
libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: one fault a page, whatever the THP setting
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
BLOCK = 24 << 20  # under the task's mmap threshold: from the heap

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE

def task(last=False):  # a shard task: an image-sized block, touched, freed
    with allocator.image_blocks():
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        size = BLOCK - (1 << 20) if last else BLOCK  # fits what is left of the first's block
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        seen.setdefault("faults", []).append(
            resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        libc.malloc(64 << 10)  # above it and kept: the block stays a free chunk, not the top
        libc.free(block)
        if last:
            seen["kept"] = resident() - base  # freed, still the heap's
            allocator.IDLE_TRIM_SECONDS = 0.1

def worker():  # one thread runs shard after shard, as a Dask worker's thread does
    task()
    task(last=True)

seen = {"pages": BLOCK // PAGE}
base = resident()
t = threading.Thread(target=worker); t.start(); t.join()
timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
seen["timers"] = len(timers)  # the first task's was cancelled when the second started
for timer in timers:
    timer.join(30)
    assert not timer.is_alive()
seen["idle"] = resident() - base
print(json.dumps(seen))
"""


def test_the_heap_is_trimmed_once_the_worker_is_idle_not_after_every_shard():
    """The next shard finds the heap the last one grew: its block is not faulted in again page
    by page (6,144 faults for 24 MiB of 4 KiB pages); a worker that runs no shard then gives it
    back, as Dask's setting wants."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", IDLE_PROBE], capture_output=True, text=True,
                         env=base | {"MALLOC_TRIM_THRESHOLD_": "65536"}, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    first, second = seen["faults"]
    assert first >= seen["pages"] * 0.9 and second < seen["pages"] // 10, seen  # 6,144 and 0
    assert seen["timers"] == 1, seen
    assert seen["kept"] >= (24 << 20) * 0.9 and seen["idle"] < (24 << 20) // 2, seen
