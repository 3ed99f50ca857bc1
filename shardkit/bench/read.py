"""The timed DataLoader loop: a fingerprinted warm-up epoch, then timed epochs (the median counts),
the share of wall time spent waiting for data, CPU per image and worker memory around them."""

from __future__ import annotations

import gc
import os
import statistics
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .machine import cpu_seconds, memory_of, memory_report, worker_pids
from .systems import BATCH, CROP


# -- fingerprints: which pixels did a system deliver -------------------------------------------

class Fingerprint:
    """An order-independent digest of (image, label) pairs: sorted per-image CRC32s."""

    def __init__(self) -> None:
        self.crcs: list[int] = []
        self.labels: list[int] = []
        self.kinds: set[str] = set()  # dtype and shape of the images, e.g. "torch.uint8 3x224x224"

    def add_batch(self, images: Any, labels: Any) -> None:
        import torch

        self.kinds.add(f"{images.dtype} {'x'.join(map(str, images.shape[1:]))}")
        if isinstance(images, torch.Tensor):
            hwc = images.permute(0, 2, 3, 1).numpy()  # the uint8 HxWxC memory, usually a view
        else:
            hwc = np.asarray(images)
        for img, label in zip(hwc, np.asarray(labels).tolist()):
            self.add_image(img, label)

    def add_image(self, hwc: np.ndarray, label: int) -> None:
        crc = zlib.crc32(np.ascontiguousarray(hwc))
        self.crcs.append(zlib.crc32(int(label).to_bytes(8, "little", signed=True), crc))
        self.labels.append(int(label))

    def digest(self) -> str:
        return f"{zlib.crc32(np.sort(np.asarray(self.crcs, dtype=np.uint64)).tobytes()):08x}"

    def labels_digest(self) -> str:
        return f"{zlib.crc32(np.sort(np.asarray(self.labels, dtype=np.int64)).tobytes()):08x}"


def make_step(step_ms: float, cpu: bool) -> Callable[[Any], None] | None:
    """The simulated training step: a sleep (a GPU step leaves the CPU idle) or busy compute."""
    if step_ms <= 0:
        return None
    seconds = step_ms / 1000.0
    if not cpu:
        return lambda images: time.sleep(seconds)
    import torch

    a = torch.randn(192, 192)

    def busy(images: Any) -> None:
        end = time.perf_counter() + seconds
        x = a
        while time.perf_counter() < end:
            x = torch.tanh(x @ a)
    return busy


@dataclass
class EpochStats:
    seconds: float
    images: int
    wait_seconds: float


def run_epoch(loader: Any, step: Callable | None, fingerprint: Fingerprint | None) -> EpochStats:
    """Iterate ``loader`` once; time it and the share spent waiting for batches."""
    t0 = time.perf_counter()
    wait = 0.0
    n = 0
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            images, labels = next(it)
        except StopIteration:
            break
        wait += time.perf_counter() - t
        n += len(labels)
        if fingerprint is not None:
            fingerprint.add_batch(images, labels)
        if step is not None:
            step(images)
    return EpochStats(time.perf_counter() - t0, n, wait)


@dataclass
class Run:
    """One system at one setting: the figures that go into the table and the JSON."""

    system: str
    mode: str  # "workers" or "threads"
    num_workers: int
    threads: int
    prefetch_factor: int | None
    epochs_s: list[float]
    images: int
    images_per_s: float
    mb_per_s: float
    out_mb_per_s: float
    data_wait_share: float | None
    warmup_s: float
    cpu_us_per_image: float | None = None  # main process + workers, over the timed epochs
    digest: str | None = None
    labels_digest: str | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    implementation: str | None = None  # what the system ran (torchvision's or shardkit's recipe)
    images_timed: int = 0  # over all timed epochs
    outputs: list[str] | None = None  # the warm-up's image kinds (Fingerprint.kinds)

    @property
    def setting(self) -> str:
        if self.mode == "threads":
            return f"threads={self.threads}"
        return f"workers={self.num_workers}"


def _collect_memory(loader: Any, main: bool) -> dict[int, dict]:
    pids = worker_pids(loader)
    if main or not pids:
        pids = [os.getpid()]
    return {pid: memory_of(pid) for pid in pids}


def measure(system: str, loader: Any, *, mode: str, num_workers: int, threads: int,
            prefetch: int | None, epochs: int, step: Callable | None, bytes_per_image: float,
            check: bool, min_seconds: float = 0.0, seed: int = 0) -> Run:
    """Warm-up epoch (fingerprinted), then at least ``epochs`` timed ones; memory around them.

    The warm-up starts from ``torch.manual_seed(seed)`` (this process's RNG restored after), so
    systems drawing random crops in this process (``num_workers=0``) draw the same ones; worker
    processes are seeded from the loader's generator.
    """
    import torch

    fingerprint = Fingerprint() if check else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        warm = run_epoch(loader, step, fingerprint)
    before = _collect_memory(loader, mode == "threads" or num_workers == 0)
    pids = [os.getpid(), *worker_pids(loader)]
    cpu0 = [cpu_seconds(pid) for pid in pids]
    stats = repeat(lambda: run_epoch(loader, step, None), epochs, lambda st: st.seconds,
                   min_seconds)
    cpu1 = [cpu_seconds(pid) for pid in pids]
    after = _collect_memory(loader, mode == "threads" or num_workers == 0)
    cpu = (sum(b - a for a, b in zip(cpu0, cpu1)) if None not in cpu0 + cpu1 else None)
    times = [s.seconds for s in stats]
    med = statistics.median(times)
    images = stats[0].images
    rate = images / med if med > 0 else 0.0
    wait = (statistics.median([s.wait_seconds / s.seconds for s in stats])
            if step is not None else None)
    total = sum(s.images for s in stats)
    cpu_per_image = cpu / total * 1e6 if cpu is not None and total and step is None else None
    return Run(system, mode, num_workers, threads, prefetch, times, images, rate,
               rate * bytes_per_image / 1e6, rate * 3 * CROP * CROP / 1e6, wait, warm.seconds,
               cpu_per_image, fingerprint.digest() if fingerprint else None,
               fingerprint.labels_digest() if fingerprint else None,
               memory_report(before, after), images_timed=total,
               outputs=sorted(fingerprint.kinds) if fingerprint else None)


def make_loader(dataset: Any, num_workers: int, prefetch: int, collate: Callable | None,
                init: Callable | None, seed: int) -> Any:
    import torch
    from torch.utils.data import DataLoader

    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=prefetch, worker_init_fn=init)
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=num_workers,
                      collate_fn=collate, generator=torch.Generator().manual_seed(seed),
                      **kwargs)


def shutdown(loader: Any) -> None:
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    del loader
    gc.collect()


def repeat(fn: Callable[[], Any], epochs: int, seconds: Callable[[Any], float],
           min_seconds: float, cap: int = 50) -> list:
    """At least ``epochs`` calls, and more (up to ``cap``) until they took ``min_seconds``:
    a median over 0.1 s epochs is at the mercy of one scheduler hiccup."""
    results = [fn() for _ in range(max(1, epochs))]
    while len(results) < cap and sum(map(seconds, results)) < min_seconds:
        results.append(fn())
    return results
