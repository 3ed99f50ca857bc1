"""Encoding processes: what runs in each worker (:func:`encode_file` per source), and how one is
started (:func:`launch`: forked, or a fresh interpreter running only :func:`spawned_worker`).

Each worker ignores Ctrl-C (the packer stops it), bounds its own memory (:func:`limit_memory`)
and exits with the packing process. :mod:`.stream` drives them from the packing process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import zlib
from typing import Any, Iterator, Sequence

from ..fileutil import NotRegularFile, open_regular
from ..urls import is_url
from . import resize
from .dedup_run import with_digests
from .encoding import Encoded, encode_data
from .settings import PackSettings


def encode_file(path: Any, settings: PackSettings) -> Encoded:
    """One source file read, decoded, resized and encoded (or rejected, with the reason);
    ``path`` may also be a container member (a :class:`shardkit.packing.sources.Item`) or an
    image at a URL (:mod:`shardkit.packing.sources.url_folder`)."""
    if not isinstance(path, str):
        from .sources.encode import encode_item

        return encode_item(path, settings)
    return _encoded(read_source(path, settings), settings)


def encode_many(paths: Sequence[Any], settings: PackSettings) -> Iterator[Encoded]:
    """:func:`encode_file` of each source, in order; images at URLs are read a few ahead on
    threads (``url_folder.read_ahead``), so the core decodes while the next are on the wire.
    With ``settings.dedup`` every record comes with its hash (:func:`.dedup_run.with_digests`:
    near mode hashes a few records at once, so a record comes once its batch is hashed)."""
    if settings.dedup is not None:
        return with_digests(_encode_many(paths, settings), settings)
    return _encode_many(paths, settings)


def _encode_many(paths: Sequence[Any], settings: PackSettings) -> Iterator[Encoded]:
    if not (paths and isinstance(paths[0], str) and is_url(paths[0])):
        return (encode_file(p, settings) for p in paths)
    from .sources.url_folder import read_ahead

    return (_encoded(data, settings)
            for data in read_ahead(paths, lambda p: read_source(p, settings)))


def _encoded(data: bytes | Encoded, settings: PackSettings) -> Encoded:
    return data if isinstance(data, Encoded) else encode_data(data, settings)


def read_source(path: str, settings: PackSettings) -> bytes | Encoded:
    """The bytes of the source file ``path`` (a local path or a URL), or its rejection."""
    # No image within --max-pixels needs more than 8 bytes a pixel (16-bit RGBA).
    limit = settings.max_pixels * 8 + (64 << 20) if settings.max_pixels else None
    if is_url(path):
        from .sources import MemberError
        from .sources.url_folder import read_url

        try:
            return read_url(path, limit)
        except MemberError as exc:
            return Encoded.rejected(str(exc))
    try:
        # Only regular files are read: a FIFO blocks, a device such as /dev/zero never ends.
        fd, st = open_regular(path)
        with open(fd, "rb") as f:
            if limit is not None and st.st_size > limit:
                return Encoded.rejected(f"file of {st.st_size} bytes is larger than any image "
                                        f"within --max-pixels {settings.max_pixels} can be")
            return f.read()
    except NotRegularFile:
        return Encoded.rejected("not a regular file (FIFO, device or socket)")
    except OSError as exc:
        return Encoded.rejected(f"cannot read file: {exc.strerror or exc}")
    except MemoryError:
        return Encoded.rejected("out of memory while reading the file")


_worker_settings: PackSettings | None = None  # set in each encoding worker by worker_init


def encode_chunk(paths: list[str]) -> list[tuple[Encoded, int]]:
    """An encoding worker's task: each record with its CRC32 (so the writing process need not)."""
    out = []
    for result in encode_many(paths, _worker_settings):
        out.append((result, zlib.crc32(result.data) if result.data is not None else 0))
    return out


def default_workers() -> int:
    """Encoding workers when none are asked for: the CPUs this process may run on (a container's
    or ``taskset``'s CPU set), not every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


# Address space an encoding worker may add to what it has once started, per --max-pixels pixel
# and in all. Measured peaks of decode + convert + resize (file bytes included), from
# benchmarks/decode_memory.py (results/decode_memory.txt): lossless RGBA WebP 35.7 B a pixel,
# 32-bit TIFF 31.3, 16-bit PNG 27.7, RGBA PNG 24.0, RGB PNG 12.2, JPEG 1.3.
DECODE_BYTES_PER_PIXEL = 64
DECODE_OVERHEAD = 256 << 20  # codec libraries loaded on first use, allocator slack


def _pixel_bound(max_pixels: int) -> int:
    """The most pixels a decode may have: ``max_pixels`` or Pillow's own limit, the lower of the
    two that are set (0: none at all)."""
    from PIL import Image

    pillow = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else 0
    return min(filter(None, (max_pixels, pillow)), default=0)


def limit_memory(max_pixels: int) -> None:
    """Bound this worker's address space, so a decoder that runs away (a decompression bomb that
    passes every pixel check) raises MemoryError, reported as the file's skip reason, instead of
    growing until the OOM killer ends it. No bound where no pixel limit is set."""
    global _user_soft_limit
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
    if _user_soft_limit is None:
        _user_soft_limit = soft
    for given in (_user_soft_limit, hard):  # never raise a bound the user set
        if given != resource.RLIM_INFINITY:
            limit = min(limit, given)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


_user_soft_limit: int | None = None  # RLIMIT_AS's soft bound before limit_memory first set one


def _import_unbounded(import_torch: Any) -> Any:
    """torch imported on a worker's first resize: it maps hundreds of MB of address space (more
    for CUDA builds), which is not decode memory, so the bound is lifted back to the user's for
    the import and set again above what the import added."""
    import resource

    if _user_soft_limit is None or _worker_settings is None:
        return import_torch()
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (_user_soft_limit, hard))
    try:
        return import_torch()
    finally:
        limit_memory(_worker_settings.max_pixels)


def worker_init(packer_pid: int, settings: PackSettings) -> None:
    global _worker_settings
    _worker_settings = settings
    # The packer handles Ctrl-C and stops its workers; workers must not print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # torch (the resize kernel, ~1.5 s to import, 0.5 GB of address space) is imported on the
    # first resize, not here: a worker is ready in a fraction of a second, and one that resizes
    # nothing (sources already at --size, or none sent to it) never imports it.
    resize.single_thread()
    resize.import_hook = _import_unbounded
    _exit_with(packer_pid)
    limit_memory(settings.max_pixels)  # last: the watch thread is in the baseline


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



def start_method() -> str:
    """How the first encoding workers start: ``fork`` on Linux when this process runs no other
    Python thread (workers then inherit the imported decoder and resize kernel at no cost; torch
    takes about 2 s to import), else ``spawn``: a fresh interpreter running only shardkit's
    worker (:func:`launch`), since a fork could copy a lock another thread holds."""
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


# A worker started as a fresh interpreter runs this, never the user's script: multiprocessing's
# spawn and forkserver would re-run an unguarded ``__main__`` (a second ``pack()`` call, say).
_SPAWNED = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; "
            "sys.path.insert(0, sys.argv[1]); from shardkit.packing.workers import spawned_worker; "
            "spawned_worker(int(sys.argv[2]), int(sys.argv[3]))")


def launch(method: str, settings: PackSettings) -> tuple[Any, Any]:
    """Start one encoding worker: (process, connection to it)."""
    import multiprocessing as mp

    if method == "fork":
        ctx = mp.get_context("fork")
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=worker_main, args=(theirs, os.getpid(), settings),
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


def spawned_worker(fd: int, packer_pid: int) -> None:
    """A fresh interpreter's worker: its settings come first on the connection ``fd``."""
    from multiprocessing.connection import Connection

    from PIL import Image

    conn = Connection(fd)
    try:
        settings, Image.MAX_IMAGE_PIXELS = conn.recv()
    except (EOFError, OSError):
        return
    worker_main(conn, packer_pid, settings)


def worker_main(conn, packer_pid: int, settings: PackSettings) -> None:
    """An encoding process: ("ready") once started; then (task, paths) in, ("ok", task, results)
    out, one task at a time, until None."""
    worker_init(packer_pid, settings)
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
        from .sources import TransferFailed

        try:
            reply = ("ok", key, encode_chunk(paths))
        except TransferFailed as exc:  # a source at a URL: the packer raises it as it is
            reply = ("unreadable", key, str(exc))
        except Exception as exc:  # noqa: BLE001 - reported by the packer, which stops
            reply = ("error", key, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return
