"""Encoding workers: a worker that dies costs only the file it died on, every worker's memory is
bounded by ``max_pixels``, the default count follows the CPU affinity, and a script is never
re-run by the packer (no ``__main__`` guard needed).

Packs run as real subprocesses under tests/helpers/programs/blocking_pack.py, which reports what
the encoding processes do (``SHARDKIT_TEST_EVENTS``) and can freeze one on a chosen file: the
test acts on those events (e.g. ``kill -9`` of the worker frozen on that file), never on elapsed
time.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit.packing.install import partial_path
from shardkit.packing.workers import DECODE_BYTES_PER_PIXEL, DECODE_OVERHEAD
from shardkit.read.store import Store

from helpers import (image_tree, jpeg_bytes, noise, one_line_error, program_cmd, program_env,
                     run_program, write_bytes)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

HANG = 300  # s: only so that a broken pack cannot hang the suite; nothing waits this long


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """40 small JPEGs in 2 classes: with 2 workers the first chunks hold 5 sources each."""
    root = str(tmp_path_factory.mktemp("workers") / "src")
    image_tree(root, classes=2, per_class=20, seed=11)
    return root


VICTIM = os.path.join("c0", "img001.jpg")  # source 1 of 40: inside the first chunk of 5


def records(path: str) -> dict[str, tuple[bytes, int]]:
    """Source path -> (record bytes, label) of every record of a store."""
    ds = shardkit.ShardDataset(path, output="bytes")
    try:
        return {ds.source_path(i): (bytes(ds[i][0]), int(ds[i][1])) for i in range(len(ds))}
    finally:
        ds.close()


class Pack:
    """``shardkit pack`` under the program ``cli`` (``helpers.programs.blocking_pack``), and the
    events its encoders report."""

    def __init__(self, tmp_path, args: list[str], block: str | None = None,
                 preexec=None, cli: str = "blocking_pack", **env: str) -> None:
        self.events_file = str(tmp_path / "events")
        env = program_env(dict(SHARDKIT_TEST_EVENTS=self.events_file, **env))
        if block:
            env["SHARDKIT_TEST_BLOCK"] = block
        self.proc = subprocess.Popen([*program_cmd(cli), "pack", *args],
                                     stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=preexec)

    def events(self, kind: str) -> list[tuple[int, str]]:
        try:
            with open(self.events_file) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        return [(int(w[1]), " ".join(w[2:])) for w in (line.split() for line in lines)
                if w and w[0] == kind]

    def next_block(self, seen: set[int]) -> int | None:
        """The pid of the next encoder that freezes, or None once the pack has exited."""
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            fresh = [pid for pid, _ in self.events("block") if pid not in seen]
            if fresh:
                return fresh[0]
            if self.proc.poll() is not None:
                return None
            time.sleep(0.02)
        self.proc.kill()
        raise AssertionError("the pack neither froze nor finished")

    def finish(self) -> str:
        try:
            return self.proc.communicate(timeout=HANG)[1]
        finally:
            self.proc.kill()


def kill_each_frozen_worker(pack: Pack) -> list[int]:
    """``kill -9`` every encoder that freezes on the blocked file, until the pack exits."""
    killed: list[int] = []
    while (pid := pack.next_block(set(killed))) is not None:
        assert pid != pack.proc.pid, "the file was encoded in the packing process"
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    return killed


def test_a_worker_killed_on_a_file_costs_only_that_file(src, tmp_path):
    ref, out = str(tmp_path / "ref.lmdb"), str(tmp_path / "out.lmdb")
    shardkit.pack(src, ref, size=32, workers=2, progress=False)
    pack = Pack(tmp_path, [src, out, "--size", "32", "--workers", "2", "-q"], block=VICTIM)
    killed = kill_each_frozen_worker(pack)
    err = pack.finish()
    assert pack.proc.returncode == 0, err
    # Killed twice: on the chunk of 5 holding the file, then on the file alone (isolation).
    assert len(killed) == 2
    store = Store(out)
    reason = "the decoder crashed (encoding worker killed by signal 9: SIGKILL)"
    assert store.skipped == [{"path": os.path.join(src, VICTIM), "reason": reason}]
    expected = records(ref)
    del expected[VICTIM]
    assert records(out) == expected  # every other file, byte for byte, labels too
    assert sorted(os.listdir(tmp_path)) == ["events", "out.lmdb", "ref.lmdb"]


def test_strict_stops_on_the_file_a_worker_died_on(src, tmp_path):
    out = str(tmp_path / "out.lmdb")
    pack = Pack(tmp_path, [src, out, "--size", "32", "--workers", "2", "--strict", "-q"],
                block=VICTIM)
    killed = kill_each_frozen_worker(pack)
    err = pack.finish()
    assert pack.proc.returncode == 1 and one_line_error(err), err
    assert len(killed) == 2
    assert os.path.join(src, VICTIM) in err and "the decoder crashed" in err
    assert not os.path.lexists(out) and not os.path.lexists(partial_path(out))


def test_workers_dying_as_they_start_fail_the_pack_with_one_line(src, tmp_path):
    out = str(tmp_path / "out.lmdb")
    pack = Pack(tmp_path, [src, out, "--workers", "2", "-q"], SHARDKIT_TEST_WORKER_EXIT="3")
    err = pack.finish()
    assert pack.proc.returncode == 1 and one_line_error(err), err
    assert "encoding workers died as they started (the last exited with status 3)" in err
    assert pack.events("encode") == []  # no file was blamed or tried
    assert not os.path.lexists(out) and not os.path.lexists(partial_path(out))


def _limits(pid: int) -> tuple[int | None, int]:
    """(soft RLIMIT_AS or None when unlimited, VmSize) of a process, in bytes."""
    with open(f"/proc/{pid}/limits") as f:
        soft = next(line for line in f if line.startswith("Max address space")).split()[3]
    with open(f"/proc/{pid}/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    return (None if soft == "unlimited" else int(soft)), vm


@pytest.mark.parametrize("max_pixels", [1_000_000, 0])
def test_each_worker_bounds_its_address_space_by_max_pixels(src, tmp_path, max_pixels):
    """0 (no --max-pixels) leaves Pillow's own limit, which then sets the bound."""
    out = str(tmp_path / "out.lmdb")
    pack = Pack(tmp_path, [src, out, "--workers", "2", "--max-pixels", str(max_pixels), "-q"],
                block=VICTIM)
    try:
        pid = pack.next_block(set())
        assert pid is not None and pid != pack.proc.pid
        limit, vm = _limits(pid)
        own_limit, _ = _limits(pack.proc.pid)
    finally:
        pack.proc.kill()
        pack.finish()
    assert own_limit is None  # the packing process (the user's) is never limited
    pixels = max_pixels or 2 * Image.MAX_IMAGE_PIXELS
    headroom = pixels * DECODE_BYTES_PER_PIXEL + DECODE_OVERHEAD
    # Set once the worker was up: its address space then, plus the headroom.
    assert limit is not None and headroom < limit <= vm + headroom


def test_no_pixel_limit_at_all_means_no_memory_bound(src, tmp_path):
    """--max-pixels 0 in a process whose Pillow limit is off too: nothing to derive a bound from.
    The packer runs a thread, so its workers are fresh interpreters: they get that Pillow
    setting as forked ones would."""
    pack = Pack(tmp_path, [src, str(tmp_path / "out.lmdb"), "--workers", "2",
                           "--max-pixels", "0", "-q"], block=VICTIM, cli="unlimited_pillow_pack")
    try:
        pid = pack.next_block(set())
        assert pid is not None and pid != pack.proc.pid
        limit, _ = _limits(pid)
    finally:
        pack.proc.kill()
        pack.finish()
    assert limit is None


def _ico_holding_a_large_png(side: int) -> bytes:
    """An icon whose directory says 16x16 but whose image is a ``side`` x ``side`` RGBA PNG (below
    Pillow's bomb limit, so only memory can stop it); built without holding the pixels."""
    z = zlib.compressobj(9)
    row = b"\0" * (1 + 4 * side)
    idat = b"".join(z.compress(row * 64) for _ in range(side // 64)) + \
        z.compress(row * (side % 64)) + z.flush()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 6, 0, 0, 0))
           + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return (struct.pack("<HHH", 0, 1, 1)
            + struct.pack("<BBBBHHII", 16, 16, 0, 0, 1, 32, len(png), 6 + 16) + png)


def _pack_peak(src: str, out: str, max_pixels: int) -> tuple[list[dict], int]:
    proc = run_program("pack_peak", src, out, str(max_pixels), capture_output=True, text=True,
                       timeout=HANG)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return report["skipped"], report["peak"]


def test_a_decoder_running_away_in_a_worker_is_stopped_by_the_memory_bound(tmp_path):
    side, max_pixels = 13000, 1_000_000  # 676 MB of pixels; the bound leaves a worker 320 MB
    src = tmp_path / "src"
    rng = np.random.default_rng(2)
    for i in range(6):
        write_bytes(str(src / "a" / f"{i}.jpg"), jpeg_bytes(noise(rng, 40, 40)))
    ref = str(tmp_path / "ref.lmdb")
    skipped, baseline = _pack_peak(str(src), ref, max_pixels)
    assert skipped == []
    write_bytes(str(src / "a" / "icon.png"), _ico_holding_a_large_png(side))
    out = str(tmp_path / "out.lmdb")
    [skipped], peak = _pack_peak(str(src), out, max_pixels)
    assert skipped["path"].endswith("icon.png")
    # Stopped while decoding, not decoded in full and then refused for its size.
    assert "--max-pixels" not in skipped["reason"], skipped
    bound = max_pixels * DECODE_BYTES_PER_PIXEL + DECODE_OVERHEAD
    assert peak - baseline < bound + (64 << 20) < 4 * side * side, (peak, baseline)
    assert records(out) == records(ref)


def test_the_hungriest_image_within_max_pixels_still_fits_the_bound(tmp_path):
    """The bound must not refuse a good image: a 32-bit grey TIFF (31 bytes a pixel at peak,
    with its file) of exactly --max-pixels pixels packs in a worker."""
    side = 3000
    src = tmp_path / "src"
    rng = np.random.default_rng(4)
    arr = rng.integers(0, 1 << 20, (side, side), dtype=np.int32)
    os.makedirs(src / "a")
    Image.fromarray(arr, "I").save(src / "a" / "big.tif")
    write_bytes(str(src / "a" / "small.jpg"), jpeg_bytes(noise(rng, 40, 40)))
    result = shardkit.pack(str(src), str(tmp_path / "o.lmdb"), size=64, workers=2,
                           max_pixels=side * side, progress=False)
    assert result.skipped == [] and result.count == 2


def test_default_workers_are_the_cpus_this_process_may_use(src, tmp_path):
    """Under an affinity of one CPU (``taskset -c N``) the default is one encoder: the packing
    process itself, whatever os.cpu_count() says."""
    if os.cpu_count() < 2:
        pytest.skip("needs a machine with 2 CPUs or more to tell the two apart")
    cpu = min(os.sched_getaffinity(0))
    pack = Pack(tmp_path, [src, str(tmp_path / "out.lmdb"), "--size", "32", "-q"],
                preexec=lambda: os.sched_setaffinity(0, {cpu}))
    err = pack.finish()
    assert pack.proc.returncode == 0, err
    encoders = {pid for pid, _ in pack.events("encode")}
    assert encoders == {pack.proc.pid}


SCRIPT = textwrap.dedent('''
    # No `if __name__ == "__main__":` guard, as in the README's example.
    import os, sys, threading
    with open(sys.argv[3], "a") as f:
        f.write(f"{os.getpid()}\\n")
    if sys.argv[4] == "thread":  # a thread of the user's: the packer cannot fork
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    import shardkit
    for name in ("a.lmdb", "b.lmdb"):
        result = shardkit.pack(sys.argv[1], os.path.join(sys.argv[2], name), size=32, workers=2)
        print(result.count)
''')


@pytest.mark.parametrize("threads", ["none", "thread"])
def test_a_script_without_main_guard_packs_twice_and_runs_once(src, tmp_path, threads):
    script, starts = tmp_path / "script.py", tmp_path / "starts"
    script.write_text(SCRIPT)
    ref = str(tmp_path / "ref.lmdb")
    shardkit.pack(src, ref, size=32, workers=1, progress=False)
    proc = subprocess.run([sys.executable, str(script), src, str(tmp_path), str(starts), threads],
                          capture_output=True, text=True, timeout=HANG)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["40", "40"]
    assert len(starts.read_text().split()) == 1  # the script body ran once: never re-imported
    assert "pack: 100%" in proc.stderr  # with the progress bar (its thread started the trouble)
    expected = records(ref)
    assert records(str(tmp_path / "a.lmdb")) == expected == records(str(tmp_path / "b.lmdb"))


def test_importing_shardkit_and_its_pack_imports_no_heavy_library():
    """``import shardkit`` and ``shardkit.pack`` load neither torch (about 2 s to import, 1 s
    more at exit) nor Dask nor pyarrow: each is imported where a pack or a source needs it."""
    code = ("import sys, shardkit, shardkit.packing; before = set(sys.modules); "
            "shardkit.pack, shardkit.PackResult; "
            "heavy = ('torch', 'h5py', 'dask', 'distributed', 'pyarrow'); "
            "print(*[m in before for m in heavy], *[m in sys.modules for m in heavy[:1] + heavy[2:]])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG, env=program_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"] * 9


def test_a_worker_imports_torch_only_on_its_first_resize_and_stays_bounded(tmp_path):
    """A fresh encoding worker is ready without torch (a second to import, 0.5 GB of address
    space); an image already at the size is encoded without it; the first resize imports it,
    and the address-space bound is set again above what the import added."""
    small, large = tmp_path / "small.jpg", tmp_path / "large.jpg"
    write_bytes(str(small), jpeg_bytes(noise(np.random.default_rng(1), 60, 40)))
    write_bytes(str(large), jpeg_bytes(noise(np.random.default_rng(2), 400, 300)))
    code = textwrap.dedent(f"""
        import os, resource, sys
        from shardkit.packing import workers
        from shardkit.packing.settings import PackSettings
        workers.worker_init(os.getpid(), PackSettings(size=64, max_pixels=10_000_000))
        bound = resource.getrlimit(resource.RLIMIT_AS)[0]
        out = workers.encode_file({str(small)!r}, workers._worker_settings)
        print("small", out.width, out.height, out.reason, "torch" in sys.modules)
        out = workers.encode_file({str(large)!r}, workers._worker_settings)
        after = resource.getrlimit(resource.RLIMIT_AS)[0]
        print("large", out.width, out.height, out.reason, "torch" in sys.modules,
              after != resource.RLIM_INFINITY, after > bound)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=HANG, env=program_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["small 40 60 None False",
                                          "large 64 85 None True True True"]
