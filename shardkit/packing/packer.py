"""``shardkit.pack``: decode every source image once, resize, re-encode, write a store.

Work is split by a *plan* fixed before any pixel is decoded: the ordered source list and the
shard boundaries (by count). Every engine (in-process, a local process pool, Dask, or several
nodes each packing their share) produces the same shards from the same plan. Output is written
under a hidden ``.<name>.partial`` sibling, metadata last, and renamed to OUT only when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import threading
import time
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .. import metadata
from .._version import __version__
from ..codec import ENCODINGS, encode
from .discovery import Discovery, discover, read_file_list
from ..errors import Interrupted, PackError, ShardkitError
from ..formats import FORMATS, SUFFIXES, format_for_path, open_writer
from .imaging import PILLOW_PIXEL_LIMIT, ImageRejected, load_rgb
from . import resize
from .. import swap
from ..store import sha256_file
from ..urls import is_url

PLAN_NAME = "plan.json"
SIZE_SAMPLE = 32  # images encoded up front to estimate bytes per record for --shard-size


@dataclass(frozen=True)
class PackSettings:
    """How each image is transformed; stored verbatim in the metadata."""

    size: int = 256
    quality: int = 90
    encoding: str = "jpeg"
    format: str = "lmdb"
    max_pixels: int = PILLOW_PIXEL_LIMIT

    def as_meta(self) -> dict[str, Any]:
        return {"size": self.size, "quality": self.quality, "encoding": self.encoding,
                "format": self.format, "max_pixels": self.max_pixels, "resample": "bicubic",
                "alpha_background": "white", "chroma_subsampling": "4:2:0"}

    def validate(self) -> None:
        if self.size < 0:
            raise PackError("`size` must be >= 0 (0 keeps the original size)")
        if not 1 <= self.quality <= 100:
            raise PackError("`quality` must be between 1 and 100")
        if self.encoding not in ENCODINGS:
            raise PackError(f"`encoding` must be one of {', '.join(ENCODINGS)}")
        if self.format not in FORMATS:
            raise PackError(f"`format` must be one of {', '.join(FORMATS)}")
        if self.max_pixels < 0:
            raise PackError("`max_pixels` must be >= 0 (0 disables the limit)")


@dataclass
class PackResult:
    """What a pack produced.

    ``seconds`` is the whole call; ``startup_seconds`` its part before encoding began (finding
    the sources, planning, starting workers), so ``images_per_second`` is the packing rate.
    """

    out: str
    count: int
    skipped: list[dict[str, str]]
    seconds: float
    shards: int = 1
    sources: int = 0
    startup_seconds: float = 0.0

    @property
    def packing_seconds(self) -> float:
        return max(0.0, self.seconds - self.startup_seconds)

    @property
    def images_per_second(self) -> float:
        return self.sources / self.packing_seconds if self.packing_seconds > 0 else 0.0


# -- per-image work (runs in worker processes) ----------------------------------------------------

Encoded = tuple[bytes | None, int, int, str | None]


def encode_file(path: str, settings: PackSettings) -> Encoded:
    """(record bytes, height, width, None) or (None, 0, 0, reason) for one source file."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; only regular files are read
        # (a FIFO blocks, a device such as /dev/zero never ends).
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, 0, 0, "not a regular file (FIFO, device or socket)"
            # No image within --max-pixels needs more than 8 bytes a pixel (16-bit RGBA).
            limit = settings.max_pixels * 8 + (64 << 20) if settings.max_pixels else None
            if limit is not None and st.st_size > limit:
                return None, 0, 0, (f"file of {st.st_size} bytes is larger than any image "
                                    f"within --max-pixels {settings.max_pixels} can be")
            data = f.read()
    except OSError as exc:
        return None, 0, 0, f"cannot read file: {exc.strerror or exc}"
    except MemoryError:
        return None, 0, 0, "out of memory while reading the file"
    try:
        pixels = load_rgb(data, settings.size, settings.max_pixels)
        height, width = pixels.shape[:2]
        return encode(pixels, settings.encoding, settings.quality), height, width, None
    except ImageRejected as exc:
        return None, 0, 0, str(exc)
    except MemoryError:  # in an encoding worker: more than _limit_memory allows
        return None, 0, 0, "out of memory while decoding"


_worker_settings: PackSettings | None = None  # set in each encoding worker by _worker_init


def _encode_chunk(paths: list[str]) -> list[tuple[Encoded, int]]:
    """An encoding worker's task: each record with its CRC32 (so the writing process need not)."""
    out = []
    for path in paths:
        result = encode_file(path, _worker_settings)
        out.append((result, zlib.crc32(result[0]) if result[0] is not None else 0))
    return out


def _chunk_bounds(n: int, workers: int, largest: int) -> list[int]:
    """Guided scheduling: chunks of up to ``largest`` sources first (few result messages: each
    has a fixed cost in the writing process, whatever its size), shrinking to one at the end
    (so no worker idles long while another finishes a big chunk)."""
    bounds = [0]
    while bounds[-1] < n:
        left = n - bounds[-1]
        bounds.append(bounds[-1] + max(1, min(largest, left // (4 * workers))))
    return bounds


def _largest_chunk(settings: PackSettings) -> int:
    """Sources per result message, for messages of about 16 MB at most."""
    if settings.size <= 0:
        return 4  # original sizes: a record can be any size
    record = settings.size * settings.size * 2 * (3 if settings.encoding == "raw" else 1)
    return max(1, min(128, (16 << 20) // record))


def default_workers() -> int:
    """Encoding workers when none are asked for: the CPUs this process may run on (a container's
    or ``taskset``'s CPU set), not every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


# Address space an encoding worker may add to what it has once started, per --max-pixels pixel
# and in all. Measured peaks of decode + convert + resize (file bytes included): RGBA WebP 42 B
# a pixel, 32-bit TIFF 36, 16-bit PNG 28, RGBA PNG 24, RGB PNG 14, JPEG under 8.
DECODE_BYTES_PER_PIXEL = 64
DECODE_OVERHEAD = 256 << 20  # codec libraries loaded on first use, allocator slack


def _pixel_bound(max_pixels: int) -> int:
    """The most pixels a decode may have: ``max_pixels`` or Pillow's own limit, the lower of the
    two that are set (0: none at all)."""
    from PIL import Image

    pillow = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else 0
    return min(filter(None, (max_pixels, pillow)), default=0)


def _limit_memory(max_pixels: int) -> None:
    """Bound this worker's address space, so a decoder that runs away (a decompression bomb that
    passes every pixel check) raises MemoryError, reported as the file's skip reason, instead of
    growing until the OOM killer ends it. No bound where no pixel limit is set."""
    max_pixels = _pixel_bound(max_pixels)
    if not max_pixels:
        return
    try:
        import resource

        with open("/proc/self/statm") as f:  # Linux: the address space in use now
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return
    limit = used + max_pixels * DECODE_BYTES_PER_PIXEL + DECODE_OVERHEAD
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    for given in (soft, hard):  # never raise a bound the user set
        if given != resource.RLIM_INFINITY:
            limit = min(limit, given)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _worker_init(packer_pid: int, settings: PackSettings) -> None:
    global _worker_settings
    _worker_settings = settings
    # The packer handles Ctrl-C and stops its workers; workers must not print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    resize.single_thread()
    _exit_with(packer_pid)
    _limit_memory(settings.max_pixels)  # last: torch and the watch thread are in the baseline


def _exit_with(pid: int) -> None:
    """End this worker as soon as the packing process ``pid`` is gone (e.g. ``kill -9``), instead
    of finishing its task into a broken pipe. A daemon thread waits on a pidfd (Linux), else polls.
    """
    import select
    import threading

    try:
        fd = os.pidfd_open(pid)  # opened here, so the thread only waits (no import, no lock)
    except (AttributeError, OSError):
        fd = None

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while True:
                time.sleep(0.5)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except OSError:
                    pass
        os._exit(1)

    threading.Thread(target=watch, name="shardkit-parent-watch", daemon=True).start()


# -- the plan -------------------------------------------------------------------------------------

@dataclass
class Plan:
    """Sources, shard boundaries and settings: everything that decides the output."""

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    paths: list[str]
    labels: list[int]
    bounds: list[int]  # shard k holds sources bounds[k]:bounds[k+1]
    settings: PackSettings
    sharded: bool
    discovery_skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def num_shards(self) -> int:
        return len(self.bounds) - 1

    def plan_id(self) -> str:
        h = hashlib.sha256()
        h.update(metadata.dumps({"settings": self.settings.as_meta(), "classes": self.classes,
                                 "bounds": self.bounds, "sharded": self.sharded}))
        for path, label in zip(self.paths, self.labels):
            h.update(os.fsencode(self.relpath(path)) + b"\0" + str(label).encode() + b"\n")
        return h.hexdigest()

    def relpath(self, path: str) -> str:
        """``path`` relative to the root; a plain prefix cut when that is what relpath gives
        (``os.path.relpath`` costs tens of microseconds, per image, in the writing process)."""
        prefix = self.root.rstrip(os.sep) + os.sep
        if path.startswith(prefix):
            rest = path[len(prefix):]
            if rest and os.path.normpath(rest) == rest:
                return rest
        return os.path.relpath(path, self.root)

    def shard_file(self, k: int) -> str:
        return f"shard-{k:05d}{SUFFIXES[self.settings.format]}"

    def common_meta(self) -> dict[str, Any]:
        return {"format": metadata.FORMAT_TAG, "format_version": metadata.FORMAT_VERSION,
                "shardkit_version": __version__, "classes": self.classes,
                "class_to_idx": self.class_to_idx, "settings": self.settings.as_meta(),
                "source_root": os.path.abspath(self.root)}


def shard_bounds(n: int, num_shards: int | None, per_shard: int | None) -> list[int]:
    if num_shards is not None:
        if num_shards < 1:
            raise PackError("`num_shards` must be >= 1")
        num_shards = min(num_shards, max(n, 1))
        return [round(k * n / num_shards) for k in range(num_shards + 1)]
    per_shard = max(1, per_shard or n or 1)
    return list(range(0, n, per_shard)) + [n] if n else [0, 0]


def estimate_record_bytes(paths: Sequence[str], settings: PackSettings) -> int:
    """Mean record size over up to SIZE_SAMPLE evenly spaced sources (deterministic)."""
    if not paths:
        return 1
    step = max(1, len(paths) // SIZE_SAMPLE)
    sizes = [len(r[0]) for r in (encode_file(p, settings) for p in paths[::step][:SIZE_SAMPLE])
             if r[0] is not None]
    if not sizes:
        return settings.size * settings.size * 4 if settings.size else 1 << 20
    return max(1, int(sum(sizes) / len(sizes)))


def make_plan(src: str, settings: PackSettings, *, allow_empty: bool = False,
              file_list: str | None = None, shard_size: int | None = None,
              num_shards: int | None = None, strict: bool = False) -> Plan:
    found: Discovery = read_file_list(file_list, src) if file_list else discover(src, allow_empty)
    if strict and found.skipped:  # a folder that cannot be listed hides images: as bad as one
        first = found.skipped[0]
        raise PackError(f"{first['path']}: {first['reason']} (`strict=True`: no output written)")
    paths = [p for p, _ in found.samples]
    labels = [t for _, t in found.samples]
    sharded = shard_size is not None or num_shards is not None
    per_shard = None
    if shard_size is not None:
        if shard_size <= 0:
            raise PackError("`shard_size` must be positive")
        per_shard = max(1, shard_size // estimate_record_bytes(paths, settings))
    bounds = shard_bounds(len(paths), num_shards, per_shard) if sharded else [0, len(paths)]
    return Plan(found.root, found.classes, found.class_to_idx, paths, labels, bounds, settings,
                sharded, found.skipped)


# -- writing one shard ----------------------------------------------------------------------------

class ShardBuilder:
    """Feeds encoded records into a format writer and builds the shard's index arrays."""

    def __init__(self, plan: Plan, k: int, path: str, strict: bool) -> None:
        self.plan, self.k, self.path, self.strict = plan, k, path, strict
        self.writer = open_writer(path, plan.settings.format)
        self.labels: list[int] = []
        self.heights: list[int] = []
        self.widths: list[int] = []
        self.crcs: list[int] = []
        self.paths: list[bytes] = []
        self.skipped: list[dict[str, str]] = []

    def add(self, source: int, result: Encoded, crc: int | None = None) -> None:
        """Append one source's record (or record why it was skipped); ``crc`` if already known."""
        data, height, width, reason = result
        path = self.plan.paths[source]
        if data is None:
            if self.strict:
                raise PackError(f"{path}: {reason} (`strict=True`: no output written)")
            self.skipped.append({"path": path, "reason": reason or "unknown error"})
            return
        self.writer.append(data)
        self.labels.append(self.plan.labels[source])
        self.heights.append(height)
        self.widths.append(width)
        self.crcs.append(zlib.crc32(data) if crc is None else crc)
        self.paths.append(self.plan.relpath(path).encode("utf-8", "surrogateescape"))

    def finish(self, kind: str, extra_skipped: Iterable[dict[str, str]] = ()) -> dict[str, Any]:
        """Write arrays and metadata; return the manifest entry for this shard."""
        n = len(self.labels)
        path_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(p) for p in self.paths], out=path_offsets[1:])
        arrays = {
            "labels": np.asarray(self.labels, dtype="<i8"),
            "heights": np.asarray(self.heights, dtype="<i4"),
            "widths": np.asarray(self.widths, dtype="<i4"),
            "crc32": np.asarray(self.crcs, dtype="<u4"),
            "path_offsets": path_offsets,
            "path_blob": np.frombuffer(b"".join(self.paths), dtype=np.uint8),
        }
        skipped = list(extra_skipped) + self.skipped
        meta = self.plan.common_meta() | {
            "kind": kind, "count": n, "skipped": skipped,
            "shard": {"index": self.k, "count": n,
                      "sources": [self.plan.bounds[self.k], self.plan.bounds[self.k + 1]]},
            "arrays": metadata.describe_arrays(arrays),
        }
        self.writer.finish(arrays, metadata.dumps(metadata.seal(meta)))
        entry = {"file": os.path.basename(self.path), "format": self.plan.settings.format,
                 "count": n, "bytes": os.path.getsize(self.path), "skipped": skipped}
        if kind == "shard":  # the manifest's checksum (a single-file store has no manifest)
            entry["sha256"] = sha256_file(self.path)
        return entry

    def abort(self) -> None:
        self.writer.abort()


# -- engines --------------------------------------------------------------------------------------

def _start_method() -> str:
    """How the first encoding workers start: ``fork`` on Linux when this process runs no other
    Python thread (workers then inherit the imported decoder and resize kernel at no cost; torch
    takes about 2 s to import), else ``spawn``: a fresh interpreter running only shardkit's
    worker (:func:`_launch`), since a fork could copy a lock another thread holds."""
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


# A worker started as a fresh interpreter runs this, never the user's script: multiprocessing's
# spawn and forkserver would re-run an unguarded ``__main__`` (a second ``pack()`` call, say).
_SPAWNED = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; "
            "sys.path.insert(0, sys.argv[1]); from shardkit.packing.packer import _spawned_worker; "
            "_spawned_worker(int(sys.argv[2]), int(sys.argv[3]))")


def _launch(method: str, settings: PackSettings) -> tuple[Any, Any]:
    """Start one encoding worker: (process, connection to it)."""
    import multiprocessing as mp

    if method == "fork":
        ctx = mp.get_context("fork")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(theirs, os.getpid(), settings),
                           daemon=True, name="shardkit-pack-worker")
        proc.start()
        theirs.close()
        return proc, mine
    import socket
    import subprocess
    from multiprocessing.connection import Connection

    mine, theirs = socket.socketpair()
    try:
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        proc = subprocess.Popen([sys.executable, "-c", _SPAWNED, package_parent,
                                 str(theirs.fileno()), str(os.getpid())],
                                stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()])
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    conn = Connection(mine.detach())
    from PIL import Image

    try:  # with Pillow's limit as set in this process, as a forked worker would have it
        conn.send((settings, Image.MAX_IMAGE_PIXELS))
    except OSError:  # it died already: found out when it is given work
        pass
    return proc, conn


def _spawned_worker(fd: int, packer_pid: int) -> None:
    """A fresh interpreter's worker: its settings come first on the connection ``fd``."""
    from multiprocessing.connection import Connection

    from PIL import Image

    conn = Connection(fd)
    try:
        settings, Image.MAX_IMAGE_PIXELS = conn.recv()
    except (EOFError, OSError):
        return
    _worker_main(conn, packer_pid, settings)


def _reap(proc: Any, timeout: float) -> int | None:
    """Wait up to ``timeout`` s for a worker to end; its exit code (-N: killed by signal N)."""
    import subprocess

    if isinstance(proc, subprocess.Popen):
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
    proc.join(timeout)
    return proc.exitcode


def _death(code: int | None) -> str:
    """How a worker ended, from its exit code, for a skip reason."""
    if code is not None and code < 0:
        try:
            return f"killed by signal {-code}: {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}" if code is not None else "lost"


def _worker_main(conn, packer_pid: int, settings: PackSettings) -> None:
    """An encoding process: ("ready") once started; then (task, paths) in, ("ok", task, results)
    out, one task at a time, until None."""
    _worker_init(packer_pid, settings)
    try:
        conn.send(("ready", None, None))
    except OSError:
        return
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        key, paths = task
        try:
            reply = ("ok", key, _encode_chunk(paths))
        except Exception as exc:  # noqa: BLE001 - reported by the packer, which stops
            reply = ("error", key, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return


@dataclass(eq=False)
class _Worker:
    proc: Any
    conn: Any
    held: list[tuple[int, int, int]] = field(default_factory=list)  # tasks sent, oldest first
    ready: bool = False


START_FAILURES = 3  # workers dying before they are ready, before the pack gives up


class _WorkerStream:
    """(record, crc32) in source order from a set of encoding processes, started at construction
    (before any output file is opened, so forked workers inherit no store handle).

    Not ``multiprocessing.Pool``: its worker-handler thread also waits on the result pipe and
    spins for as long as a result message is being read (big messages: most of the time), and a
    worker killed mid-task makes it wait forever. Here the packing thread reads each worker's pipe
    itself. A task is ``(chunk, first, count)``: sources ``first:first+count`` of a chunk. A worker
    works on its tasks in order, so one that dies (the OOM killer, a crashing decoder, ``kill
    -9``) died on its oldest: that chunk is run again one source per task, its other tasks are
    handed out again, and a fresh interpreter replaces it. A worker that dies on a one-source task
    names the source that killed it, which is skipped with the reason.
    """

    def __init__(self, paths: list[str], settings: PackSettings, workers: int) -> None:
        from collections import deque

        bounds = _chunk_bounds(len(paths), workers, _largest_chunk(settings))
        self._settings = settings
        self._chunks = [paths[a:b] for a, b in zip(bounds, bounds[1:])]
        self._tasks = deque((k, 0, len(chunk)) for k, chunk in enumerate(self._chunks))
        self._workers: list[_Worker] = []
        self._done: dict[int, list[tuple[Encoded, int]]] = {}
        self._parts: dict[int, list[Any]] = {}  # chunks run one source per task: results so far
        self._start_failures = 0
        self._want = 0         # next chunk to yield
        self._current: list[tuple[Encoded, int]] = []
        self._pos = 0
        self._left = len(paths)
        try:
            self._start(workers, _start_method())
            # Up when every worker is ready: the packer's start-up time ends here.
            while any(w.held and not w.ready for w in self._workers):
                self._receive(block=True)
        except BaseException:
            self._kill()
            raise

    def _start(self, n: int, method: str) -> None:
        """Start ``n`` workers and give them work; a Ctrl-C meanwhile is raised once they are up.

        Ctrl-C must not cut a start in half, so SIGINT is deferred (workers started meanwhile
        inherit that and ignore SIGINT once up)."""
        with _sigint_deferred() as resume_sigint:
            if method == "fork":
                resize.prepare()  # imported once here, inherited by every worker
            for _ in range(n):
                self._workers.append(_Worker(*_launch(method, self._settings)))
        resume_sigint()
        self._fill()

    def _fill(self) -> None:
        """Give each worker up to two tasks: one to work on, one queued behind it."""
        for w in list(self._workers):
            while len(w.held) < 2 and self._tasks:
                k, first, count = task = self._tasks[0]
                try:
                    w.conn.send((task, self._chunks[k][first:first + count]))
                except OSError:  # it died while idle
                    self._replace(w)
                    return  # _replace fills again
                w.held.append(self._tasks.popleft())

    def _receive(self, block: bool) -> None:
        """Take in every message that is ready (waiting for one if ``block``)."""
        from multiprocessing.connection import wait

        busy = {w.conn: w for w in self._workers if w.held}
        for conn in wait(list(busy), None if block else 0):
            w = busy[conn]
            if w not in self._workers:  # replaced meanwhile (found dead while given work)
                continue
            try:
                kind, key, payload = conn.recv()
            except (EOFError, OSError):
                self._replace(w)
                continue
            if kind == "ready":
                w.ready = True
                continue
            if kind != "ok":
                raise PackError(f"an encoding worker failed: {payload}; no output written")
            w.held.remove(key)
            self._store(key, payload)
            self._fill()

    def _store(self, task: tuple[int, int, int], results: list[tuple[Encoded, int]]) -> None:
        k, first, count = task
        if count == len(self._chunks[k]):
            self._done[k] = results
            return
        part = self._parts[k]
        part[first:first + count] = results
        if all(r is not None for r in part):
            self._done[k] = self._parts.pop(k)

    def _replace(self, w: _Worker) -> None:
        """``w`` died: settle the task it died on, hand its others out again, start a new one."""
        code = _reap(w.proc, 30)  # its pipe is closed: it is exiting
        if code is None:
            w.proc.kill()
            code = _reap(w.proc, 30)
        w.conn.close()
        self._workers.remove(w)
        held, w.held = w.held, []
        if not w.ready:  # never started: its tasks were not run
            self._start_failures += 1
            if self._start_failures >= START_FAILURES:
                raise PackError(f"{self._start_failures} encoding workers died as they started "
                                f"(the last {_death(code)}); no output written")
            self._tasks.extendleft(reversed(held))
        elif held:
            (k, first, count), rest = held[0], held[1:]
            self._tasks.extendleft(reversed(rest))
            if count == 1:
                reason = f"the decoder crashed (encoding worker {_death(code)})"
                self._store(held[0], [((None, 0, 0, reason), 0)])
            else:  # one source per task, to learn which one it was
                self._parts.setdefault(k, [None] * len(self._chunks[k]))
                self._tasks.extendleft((k, i, 1) for i in reversed(range(first, first + count)))
        # Never forked now: this process has the output open and maybe other threads running.
        self._start(1, "spawn")

    def __iter__(self) -> "_WorkerStream":
        return self

    def __next__(self) -> tuple[Encoded, int]:
        if self._pos == len(self._current):
            if self._want == len(self._chunks):
                raise StopIteration
            self._receive(block=False)  # take what is ready: a worker may be waiting to send
            while self._want not in self._done:
                self._receive(block=True)
            self._current, self._pos = self._done.pop(self._want), 0
            self._want += 1
        item = self._current[self._pos]
        self._pos += 1
        self._left -= 1
        return item

    def close(self) -> None:
        """Stop the workers: let them exit when every result is in, kill them otherwise."""
        if self._left == 0:
            for w in self._workers:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
            for w in self._workers:
                _reap(w.proc, 5)
        self._kill()

    def _kill(self) -> None:
        for w in self._workers:
            if _reap(w.proc, 0) is None:
                w.proc.kill()
        for w in self._workers:
            _reap(w.proc, 5)
            w.conn.close()
        self._workers = []


def _encoded_stream(paths: list[str], settings: PackSettings, workers: int):
    """(record, crc32) in source order, from this process (workers <= 1) or worker processes;
    has close()."""
    if workers <= 1 or len(paths) < 2:
        with _sigint_deferred() as resume_sigint:
            resize.prepare()
        resume_sigint()
        return ((r, None) for r in (encode_file(p, settings) for p in paths))
    return _WorkerStream(paths, settings, workers)


@contextmanager
def _sigint_deferred() -> Iterator[Callable[[], None]]:
    """Run a step that Ctrl-C must not cut in half, without losing the Ctrl-C.

    Two such steps: starting worker processes (one interrupted while importing prints a
    traceback and leaves workers half made) and importing torch (a KeyboardInterrupt inside its
    C++ code aborts the whole process). So SIGINT is blocked in this thread meanwhile (processes
    started now inherit that and ignore SIGINT once up) and a Ctrl-C is only recorded. The
    returned function restores both and raises the recorded KeyboardInterrupt: call it where the
    workers are cleaned up.
    """
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    try:  # started now, so that starting it later does not unblock SIGINT (it blocks/unblocks)
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    except (ImportError, OSError):
        pass
    got: list[int] = []
    old_handler = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    old_mask = mask(signal.SIG_BLOCK, {signal.SIGINT})
    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:
            restored = True
            signal.signal(signal.SIGINT, old_handler)
            mask(signal.SIG_SETMASK, old_mask)  # a pending Ctrl-C is raised here
            if got:
                raise KeyboardInterrupt

    try:
        yield restore
    except BaseException:
        restore()
        raise


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return _NoProgress()
    from tqdm import tqdm

    class Bar(tqdm):
        # tqdm's monitor thread outlives the bar: the next pack in this process could not fork.
        # Per class, so the user's own bars keep theirs.
        monitor_interval = 0

    return Bar(total=total, unit="img", desc=desc, file=sys.stderr, dynamic_ncols=True,
               smoothing=0.1)


def run_local(plan: Plan, shards: list[int], dest: dict[int, str], *, workers: int,
              strict: bool, progress: bool, on_shard_done,
              on_start: Callable[[], None] = lambda: None) -> None:
    """Encode the given shards with a local process pool, writing each through a builder.

    ``on_start`` is called once the encoders are up, as encoding begins.
    """
    paths = [plan.paths[i] for k in shards for i in range(plan.bounds[k], plan.bounds[k + 1])]
    stream = _encoded_stream(paths, plan.settings, workers)
    on_start()
    bar = _progress(len(paths), progress, "pack")
    try:
        for k in shards:
            builder = ShardBuilder(plan, k, dest[k], strict)
            try:
                for i in range(plan.bounds[k], plan.bounds[k + 1]):
                    builder.add(i, *next(stream))
                    bar.update(1)
                extra = plan.discovery_skipped if not plan.sharded else ()
                entry = builder.finish("shard" if plan.sharded else "single", extra)
            except BaseException:
                builder.abort()
                _remove(dest[k])
                raise
            on_shard_done(k, entry)
    finally:
        bar.close()
        stream.close()


def pack_shard(plan: Plan, k: int, dest: str, strict: bool = False,
               upload: Any = None) -> dict[str, Any]:
    """Pack one shard in this process (the unit of work for Dask and multi-node packing).

    With ``upload`` (a :class:`shardkit.remote.Uploader`) the shard is uploaded from here and
    its local file deleted (see :func:`_upload_shard`).
    """
    if upload is not None:  # a staging folder on this worker's own disk
        os.makedirs(os.path.dirname(dest), exist_ok=True)
    _remove_shard_files([dest])  # left by an attempt that was killed (e.g. a lost Dask worker)
    builder = ShardBuilder(plan, k, dest, strict=strict)
    try:
        for i in range(plan.bounds[k], plan.bounds[k + 1]):
            builder.add(i, encode_file(plan.paths[i], plan.settings))
        entry = builder.finish("shard")
    except BaseException:
        builder.abort()
        _remove(dest)
        raise
    return entry if upload is None else _upload_shard(upload, dest, entry)


def _upload_shard(uploader: Any, path: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Upload a finished shard file and delete it (staging then holds only shards in progress).

    Its labels go into the returned entry: the manifest is merged without the file.
    """
    from ..formats import open_reader

    reader = open_reader(path, entry["format"])
    try:
        labels = np.array(reader.array("labels", "<i8", (entry["count"],))).tolist()
    finally:
        reader.close()
    uploader.put_shard(path, entry["file"], entry["sha256"], entry["bytes"])
    _remove_shard_files([path])
    return entry | {"labels": labels}


# -- partial outputs, progress entries, merge ----------------------------------------------------

def partial_path(out: str) -> str:
    head, tail = os.path.split(os.path.abspath(out))
    return os.path.join(head, f".{tail}.partial")


def staging_path(url: str) -> str:
    """The local partial folder of a pack to ``url``: under the cache folder, one per URL, so
    ``resume`` finds it (``$SHARDKIT_CACHE_DIR/pack-staging/<hash of url>``)."""
    from ..remote import default_cache_dir

    key = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(os.path.abspath(default_cache_dir()), "pack-staging", key)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        for p in (path, path + ".spool"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def _write_json_atomic(path: str, obj: dict[str, Any]) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"  # unique: several nodes may write plan.json at once
    with open(tmp, "wb") as f:
        f.write(metadata.dumps(obj))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _entry_path(partial: str, k: int) -> str:
    return os.path.join(partial, f"shard-{k:05d}.done.json")


def _remove_shard_files(shards: Iterable[str]) -> None:
    """Shard files and the side files their killed writers may leave (e.g. an HDF5 spool)."""
    by_folder: dict[str, set[str]] = {}
    for shard in shards:
        _remove(shard)
        folder, name = os.path.split(shard)
        by_folder.setdefault(folder or ".", set()).add(name)
    for folder, names in by_folder.items():
        try:
            present = os.listdir(folder)
        except OSError:
            continue
        for other in present:
            if other.endswith(".spool") and other.split(".spool")[0].rsplit(".", 1)[0] in names:
                _remove(os.path.join(folder, other))


def _completed_shards(partial: str, plan: Plan, plan_id: str, shards: Iterable[int],
                      uploader: Any = None) -> dict[int, dict[str, Any]]:
    """Shards of an interrupted run whose file still matches the checksum recorded when done
    (with ``uploader``: whose upload is recorded, with that checksum, in the remote store)."""
    done: dict[int, dict[str, Any]] = {}
    for k in shards:
        try:
            with open(_entry_path(partial, k), "rb") as f:
                entry = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if not isinstance(entry, dict) or entry.get("plan_id") != plan_id:
            continue
        if uploader is not None:
            if entry.get("file") == plan.shard_file(k) and "labels" in entry and \
                    uploader.uploaded(entry["file"], entry.get("sha256"), entry.get("bytes")):
                done[k] = entry
            continue
        shard = os.path.join(partial, plan.shard_file(k))
        if entry.get("file") == plan.shard_file(k) and os.path.exists(shard) \
                and os.path.getsize(shard) == entry.get("bytes") \
                and sha256_file(shard) == entry.get("sha256"):
            done[k] = entry
    return done


def _prepare_partial(partial: str, plan: Plan, plan_id: str, resume: bool,
                     shards: Sequence[int], uploader: Any = None) -> dict[int, dict]:
    """Create or reuse the partial folder; returns which of ``shards`` are already complete.

    Files of the other ``shards`` (half-written by a killed run) are removed. Shards outside
    ``shards`` are never touched: with ``--num-nodes`` other nodes write them concurrently.
    """
    plan_file = os.path.join(partial, PLAN_NAME)
    if resume:
        if os.path.lexists(partial) and not os.path.isdir(partial):
            _remove(partial)
        os.makedirs(partial, exist_ok=True)  # never remove a folder another node may be using
        try:
            with open(plan_file, "rb") as f:
                old = json.loads(f.read())
        except (OSError, ValueError):
            old = {}
        if not isinstance(old, dict) or old.get("plan_id") not in (None, plan_id):
            raise PackError(f"cannot resume: {partial} was started with different sources, "
                            "settings or shard sizes; rerun without --resume (or delete it) "
                            "to start over")
        done = _completed_shards(partial, plan, plan_id, shards, uploader)
    else:
        _remove(partial)
        os.makedirs(partial, exist_ok=True)
        done = {}
    redo = [k for k in shards if k not in done]
    for k in redo:
        _remove(_entry_path(partial, k))
    _remove_shard_files(os.path.join(partial, plan.shard_file(k)) for k in redo)
    _write_json_atomic(plan_file, {"plan_id": plan_id, "num_shards": plan.num_shards,
                                   "count_sources": len(plan.paths),
                                   "discovery_skipped": plan.discovery_skipped})
    return done


def finalize_sharded(partial: str, plan: Plan | None = None,
                     publish: Callable[[str], None] | None = None) -> tuple[dict[str, Any], int]:
    """Merge per-shard entries into ``manifest.json`` (+ ``labels.npy``), written last.

    Entries of uploaded shards carry their labels (the files are gone). ``publish(partial)``
    runs once the manifest is written and before the entries are removed, so a pack killed
    while it uploads the manifest resumes without packing again.
    """
    from ..formats import open_reader

    try:
        with open(os.path.join(partial, PLAN_NAME), "rb") as f:
            plan_info = json.loads(f.read())
    except (OSError, ValueError):
        raise PackError(f"{partial}: no pack in progress to merge") from None
    plan_id, num_shards = plan_info["plan_id"], plan_info["num_shards"]
    entries, missing = [], []
    for k in range(num_shards):
        try:
            with open(_entry_path(partial, k), "rb") as f:
                entry = json.loads(f.read())
        except (OSError, ValueError):
            missing.append(k)
            continue
        if entry.get("plan_id") != plan_id:
            missing.append(k)
        entries.append(entry)
    if missing:
        raise PackError(f"{len(missing)} of {num_shards} shards are not finished yet "
                        f"(first: {missing[0]}); run the remaining nodes, or pack with --resume")
    labels, start, skipped, shard_list, common = [], 0, [], [], None
    for k, entry in enumerate(entries):
        path = os.path.join(partial, entry["file"])
        if "labels" in entry and plan is not None:  # uploaded to a remote OUT: no file here
            labels.append(np.asarray(entry["labels"], dtype="<i8"))
            common = common or plan.common_meta()
        else:
            if not os.path.isfile(path) or os.path.getsize(path) != entry["bytes"]:
                raise PackError(f"shard {k} ({path}) is missing or changed since it was packed; "
                                "repack it (rerun its node, or pack with --resume)")
            reader = open_reader(path, entry["format"])
            try:
                meta = metadata.parse_shard_meta(reader.meta_json(), path)
                labels.append(np.array(reader.array("labels", "<i8", (meta["count"],))))
            finally:
                reader.close()
            common = common or {key: meta[key] for key in (
                "format", "format_version", "shardkit_version", "classes", "class_to_idx",
                "settings", "source_root")}
        skipped.extend(entry["skipped"])
        shard_list.append({key: entry[key] for key in ("file", "format", "count", "bytes",
                                                       "sha256")} | {"start": start})
        start += entry["count"]
    all_labels = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    labels_path = os.path.join(partial, "labels.npy")
    np.save(labels_path, all_labels.astype("<i8"), allow_pickle=False)
    if common is None:
        raise PackError("cannot merge a store with no shards")
    skipped = (plan.discovery_skipped if plan is not None
               else plan_info.get("discovery_skipped", [])) + skipped
    manifest = common | {"kind": "sharded", "count": start, "skipped": skipped,
                         "shards": shard_list,
                         "labels": {"file": "labels.npy", "sha256": sha256_file(labels_path)}}
    manifest = metadata.seal(manifest)
    _write_json_atomic(os.path.join(partial, metadata.MANIFEST_NAME), manifest)
    if publish is not None:
        publish(partial)
    for k in range(num_shards):
        _remove(_entry_path(partial, k))
    for name in os.listdir(partial):  # side files of killed writers
        if name.endswith((".spool", ".tmp")):
            _remove(os.path.join(partial, name))
    _remove(os.path.join(partial, PLAN_NAME))
    swap.fsync_dir(partial)
    return manifest, start


def install(partial: str, out: str, overwrite: bool) -> None:
    """Move a finished store from its partial name to OUT, never disturbing readers of OUT.

    A new OUT, or a file replacing a file: one rename. A folder store replacing a folder store:
    new shard files under unused names, then ``manifest.json`` replaced by rename, old files
    deleted once no reader holds them (:mod:`shardkit.swap`). Replacing a file by a folder or the
    reverse cannot be one rename: OUT is moved aside first (missing for a moment, never mixed),
    and a folder store moved aside is deleted once no reader holds it.
    """
    if os.path.lexists(out) and not overwrite:
        raise PackError(f"{out} already exists (use `overwrite=True` to replace it)")
    if not os.path.lexists(out):
        if os.path.isdir(partial):
            os.rename(partial, out)
            swap.collect_garbage(out)  # side files a killed writer may have left
        else:
            os.replace(partial, out)
    elif os.path.isdir(partial) and swap.is_folder_store(out):
        swap.install_folder(partial, out)
    elif os.path.isdir(partial) or (os.path.isdir(out) and not os.path.islink(out)):
        swap.swap_aside(partial, out)
    else:
        os.replace(partial, out)  # atomic; processes that opened the old file keep reading it
    swap.fsync_dir(os.path.dirname(os.path.abspath(out)))
    swap.collect_aside(out)


def _install_finished(partial: str, out: str, overwrite: bool) -> None:
    """:func:`install` a finalized folder store; on a disk error it stays there for ``merge``."""
    try:
        install(partial, out, overwrite)
    except OSError as exc:
        raise PackError(f"cannot install {out}: {exc.strerror or exc}; the finished store is "
                        f"kept in {partial} (`shardkit merge {out}` installs it)") from None


# -- the public entry point -----------------------------------------------------------------------

def _check_options(src: str, out: str, file_list: str | None, sharded: bool, resume: bool,
                   engine: str, scheduler: str | None, num_nodes: int, node_rank: int) -> None:
    """Refuse options that cannot work together, before any work is done."""
    for path, what in ((src, "the source folder"), (file_list, "`file_list`")):
        if path is not None and is_url(path):
            raise PackError(f"{path}: {what} must be a local path (only OUT may be a URL)")
    if engine not in ("local", "dask"):
        raise PackError(f"`engine` must be 'local' or 'dask', not {engine!r}")
    if scheduler is not None and engine != "dask":
        raise PackError("`scheduler` needs `engine='dask'`")
    if not 0 <= node_rank < num_nodes:
        raise PackError("`node_rank` must be in 0..`num_nodes`-1")
    if not sharded:
        for name, given in (("engine='dask'", engine == "dask"), ("resume=True", resume),
                            ("num_nodes", num_nodes > 1)):
            if given:
                raise PackError(f"`{name}` needs a sharded OUT: give `shard_size` or "
                                "`num_shards`")
    if is_url(out):
        if not sharded:
            raise PackError(f"{out}: a remote OUT is a folder store: give `shard_size` or "
                            "`num_shards`")
        if num_nodes > 1:
            raise PackError(f"{out}: `num_nodes` needs a local OUT that every node shares; "
                            "pack to a URL from one machine, or with `engine='dask'`")
        return
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise PackError(f"cannot write {out}: folder {folder} does not exist")


def pack(src: str | os.PathLike, out: str | os.PathLike, *, format: str | None = None,
         size: int = 256, quality: int = 90, encoding: str = "jpeg", workers: int | None = None,
         strict: bool = False, overwrite: bool = False, max_pixels: int = PILLOW_PIXEL_LIMIT,
         allow_empty: bool = False, file_list: str | None = None,
         shard_size: int | None = None, num_shards: int | None = None, resume: bool = False,
         engine: str = "local", scheduler: str | None = None, num_nodes: int = 1,
         node_rank: int = 0, progress: bool = True,
         storage_options: dict[str, Any] | None = None) -> PackResult:
    """Pack an ImageFolder-layout folder (or a file list) into an LMDB or HDF5 store.

    Without ``shard_size``/``num_shards`` OUT is one file; with them, a folder of shard files and
    a ``manifest.json``. Unusable images are skipped and listed in the metadata (or, with
    ``strict``, abort the run with no output). See the README for every option.

    A URL OUT (``s3://bucket/prefix``, any fsspec URL) must be sharded: shards are built in a
    local staging folder (:func:`staging_path`) and uploaded as each finishes, then deleted
    there; ``labels.npy`` and ``manifest.json`` go up last (see :mod:`shardkit.remote`).
    ``storage_options`` configure its fsspec filesystem.
    """
    t0 = time.perf_counter()
    src, out = os.fspath(src), os.fspath(out).rstrip("/") or "/"
    if shard_size is not None and num_shards is not None:
        raise PackError("give `shard_size` or `num_shards`, not both")
    _check_options(src, out, file_list, shard_size is not None or num_shards is not None,
                   resume, engine, scheduler, num_nodes, node_rank)
    settings = PackSettings(size, quality, encoding, format or format_for_path(out), max_pixels)
    settings.validate()
    remote = is_url(out)
    if not remote and os.path.lexists(out) and not overwrite:
        raise PackError(f"{out} already exists (use `overwrite=True` to replace it)")
    if not remote and (os.path.abspath(out) == os.path.abspath(src) or
                       os.path.abspath(out).startswith(os.path.abspath(src) + os.sep)):
        raise PackError("OUT must not be inside SRC")
    if remote:  # its filesystem, endpoint and emptiness; the old manifest goes once packing starts
        from ..remote import check_target

        check_target(out, storage_options, overwrite)
    workers = default_workers() if workers is None else workers
    started: list[float] = []  # when encoding began (the rest is start-up)

    def on_start() -> None:
        started.append(time.perf_counter())

    def result(count: int, skipped: list[dict[str, str]], sources: int) -> PackResult:
        now = time.perf_counter()
        return PackResult(out, count, skipped, now - t0, plan.num_shards, sources,
                          (started[0] if started else now) - t0)

    plan = make_plan(src, settings, allow_empty=allow_empty, file_list=file_list,
                     shard_size=shard_size, num_shards=num_shards, strict=strict)
    partial = staging_path(out) if remote else partial_path(out)
    if not plan.sharded:
        entry = _pack_single(plan, out, partial, workers, strict, overwrite, progress, on_start)
        return result(entry["count"], entry["skipped"], len(plan.paths))
    plan_id = plan.plan_id()
    ours = [k for k in range(plan.num_shards) if k % num_nodes == node_rank]
    uploader = None
    if remote:
        from ..remote import Uploader

        uploader = Uploader(out, storage_options, resume=resume, overwrite=overwrite)

    def on_done(k: int, entry: dict[str, Any]) -> None:
        if uploader is not None and "labels" not in entry:  # not uploaded by a Dask worker
            entry = _upload_shard(uploader, dest[k], entry)
        _write_json_atomic(_entry_path(partial, k), entry | {"plan_id": plan_id})

    kept = f"uploaded shards kept in {out}" if remote else f"finished shards kept in {partial}"
    try:
        done = _prepare_partial(partial, plan, plan_id, resume or num_nodes > 1, ours, uploader)
        mine = [k for k in ours if k not in done]
        dest = {k: os.path.join(partial, plan.shard_file(k)) for k in mine}
        if engine == "dask":
            from .dask_engine import run_dask

            run_dask(plan, mine, dest, scheduler=scheduler, workers=workers,
                     progress=progress, on_shard_done=on_done, strict=strict,
                     on_start=on_start, upload=uploader)
        else:
            run_local(plan, mine, dest, workers=workers, strict=strict, progress=progress,
                      on_shard_done=on_done, on_start=on_start)
        if num_nodes > 1:
            # Each node packs its share; `shardkit merge OUT` finishes once every node is done.
            return result(sum(entry["count"] for entry in _entries(partial, mine)), [],
                          sum(plan.bounds[k + 1] - plan.bounds[k] for k in mine))
        manifest, count = finalize_sharded(partial, plan,
                                           uploader.finish if uploader is not None else None)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {kept} (rerun with `resume=True` to continue)") \
            from None
    except OSError as exc:
        raise PackError(f"cannot write {out}: {exc.strerror or exc}; {kept} (rerun with "
                        "`resume=True`)") from None
    if remote:
        _remove(partial)
    else:
        _install_finished(partial, out, overwrite)
    return result(count, manifest["skipped"], len(plan.paths))


def _entries(partial: str, shards: Iterable[int]) -> list[dict[str, Any]]:
    entries = []
    for k in shards:
        with open(_entry_path(partial, k), "rb") as f:
            entries.append(json.loads(f.read()))
    return entries


def merge(out: str | os.PathLike, overwrite: bool = False) -> PackResult:
    """Finish a multi-node pack: check every shard is done, write the manifest, install OUT.

    Also installs a finished store left in the partial folder by an install that failed.
    """
    t0 = time.perf_counter()
    out = os.fspath(out).rstrip("/") or "/"
    if is_url(out):
        raise PackError(f"{out}: `merge` finishes a multi-node pack into a local folder (a pack "
                        "to a URL uploads its manifest itself)")
    partial = partial_path(out)
    if not os.path.isdir(partial):
        raise PackError(f"no pack in progress for {out} (expected {partial})")
    try:
        if os.path.exists(os.path.join(partial, PLAN_NAME)):
            manifest, count = finalize_sharded(partial)
        else:  # finalized by a run whose install failed
            with open(os.path.join(partial, metadata.MANIFEST_NAME), "rb") as f:
                manifest = metadata.parse_manifest(f.read(), partial)
            count = manifest["count"]
    except FileNotFoundError:
        raise PackError(f"{partial}: no pack in progress to merge") from None
    except OSError as exc:
        raise PackError(f"cannot write {out}: {exc.strerror or exc}; the shards are kept in "
                        f"{partial} (merge again once that is fixed)") from None
    _install_finished(partial, out, overwrite)
    return PackResult(out, count, manifest["skipped"], time.perf_counter() - t0,
                      len(manifest["shards"]), count + len(manifest["skipped"]))


def _pack_single(plan: Plan, out: str, partial: str, workers: int, strict: bool,
                 overwrite: bool, progress: bool, on_start: Callable[[], None]
                 ) -> dict[str, Any]:
    """Pack the single-file store OUT; returns its entry (count, skipped)."""
    _remove_shard_files([partial])  # with a killed run's side files (HDF5 spool)
    entries: dict[int, dict[str, Any]] = {}
    try:
        run_local(plan, [0], {0: partial}, workers=workers, strict=strict, progress=progress,
                  on_shard_done=entries.__setitem__, on_start=on_start)
        install(partial, out, overwrite)
    except KeyboardInterrupt:
        _remove(partial)
        raise Interrupted("interrupted; no output written") from None
    except ShardkitError:
        _remove(partial)
        raise
    except OSError as exc:
        _remove(partial)
        raise PackError(f"cannot write {out}: {exc.strerror or exc}; no output written") from None
    except BaseException:
        _remove(partial)
        raise
    return entries[0]
