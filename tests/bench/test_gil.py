"""shardkit.bench.gil: the GIL probe and the CPU split tell a thread that holds the GIL from one
that releases it (sleeping, or inside a numpy call that releases it).

Orderings with wide margins only: the probe runs a fixed number of wakes, each case's thread is
running (an event says so) before the probe starts, and nothing asserts how fast anything is.
"""

from __future__ import annotations

import threading
import time
import types

import numpy as np
import pytest

from shardkit.bench import gil

ARRAY = np.random.default_rng(0).random(200_000)
RELEASING = types.SimpleNamespace(sort=np.sort)  # the GIL-releasing call CpuSplit wraps


def _python(stop: threading.Event, running: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        running.set()
        for i in range(2000):
            total += i


def _sleeping(stop: threading.Event, running: threading.Event) -> None:
    while not stop.is_set():
        running.set()
        time.sleep(0.002)


def _numpy(stop: threading.Event, running: threading.Event) -> None:
    while not stop.is_set():
        running.set()
        RELEASING.sort(ARRAY)  # numpy releases the GIL while it sorts floats


@pytest.fixture(scope="module")
def readings():
    calibration = gil.calibrate(wakes=200)
    out = {}
    for name, body in (("python", _python), ("sleep", _sleeping), ("numpy", _numpy)):
        stop, running = threading.Event(), threading.Event()
        split = gil.CpuSplit([(RELEASING, "sort")]).start()
        thread = threading.Thread(target=body, args=(stop, running))
        thread.start()
        assert running.wait(30)
        probe = gil.GilProbe(calibration, wakes=60 if name == "python" else 300).start()
        split.ignore.add(probe.ident)
        assert probe.wait_done(120)
        split.sample_threads()
        reading = probe.stop()
        stop.set()
        thread.join()
        split.stop()
        out[name] = (reading, split)
    return out


def test_probe_finds_the_gil_held_by_python_and_free_otherwise(readings):
    busy = readings["python"][0].held_share
    assert busy > 0.6, readings["python"][0]
    for quiet in ("sleep", "numpy"):
        assert readings[quiet][0].held_share < busy / 2, (quiet, readings[quiet][0])
        assert readings[quiet][0].wakes == 300


def test_cpu_split_counts_python_as_holding_and_the_wrapped_call_as_released(readings):
    python, numpy_ = readings["python"][1], readings["numpy"][1]
    assert python.released_seconds() == 0.0
    assert python.held_seconds() > 0.5 * python.cpu_seconds() > 0
    assert numpy_.released_seconds() > 0.5 * numpy_.cpu_seconds() > 0
    assert numpy_.held_share() < python.held_share() / 2
    assert RELEASING.sort is np.sort  # the wrapper is gone after stop()


def test_calibration_runs_beside_gil_free_load_and_leaves_no_thread():
    before = set(threading.enumerate())
    calibration = gil.calibrate(wakes=100, load_threads=2)
    assert set(threading.enumerate()) == before  # the load threads are joined
    assert calibration.load_threads == 2
    assert calibration.threshold_us >= calibration.median_us + gil.MARGIN_US
    assert 0.0 <= calibration.false_share <= 0.1
