"""Throughput benchmark: ImageFolder+PIL against ShardDataset, through a real DataLoader.

``shardkit bench`` and ``benchmarks/throughput.py`` run :func:`main`. It packs an image folder
(or a generated photo-like sample) into LMDB and HDF5 stores with ``jpeg`` and ``raw`` records,
then reads every system through ``torch.utils.data.DataLoader``, each producing the same thing:
uint8 3x224x224 centre crops in batches of 64.

Systems (``--systems``):

- ``imagefolder``: what users run today, ImageFolder + PIL (open, RGB, resize shorter side to 256,
  centre crop 224, to tensor); torchvision's own classes when torchvision is installed.
- ``<format>-<encoding>`` (``lmdb-jpeg``, ``hdf5-jpeg``, ``lmdb-raw``, ``hdf5-raw``): ShardDataset
  with ``crop=224``, ``shardkit.collate`` and ``worker_init_fn``, swept over ``num_workers``.
- ``<format>-<encoding>/threads``: ShardDataset with ``threads=N`` and ``num_workers=0``,
  swept over N.
- the training recipe, ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``, over
  ``--recipe-workers`` (default 2) on the LMDB jpeg store: ``recipe-imagefolder`` (ImageFolder,
  PIL, the recipe as pytorch/examples runs it), ``recipe-transform`` (ShardDataset with the recipe
  as a per-sample v2 transform on uint8 tensors), ``recipe-decode`` (``crop_mode="random_resized",
  flip=0.5``); torchvision's transforms when it is importable, else shardkit.augment's, which give
  the same pixels. Beside them ``random-crop`` (``crop_mode="random"``, the plain fast path) and
  ``random-crop/default-collate`` (the same without ``collate_fn``).

and the decode ceiling: one process decoding the same stored bytes to the same crops in a tight
loop (no Dataset, no DataLoader), times the number of cores.

Each setting runs a warm-up epoch (which also fingerprints every image it delivers, so that the
systems can be checked to deliver the same pixels) and then ``--epochs`` timed epochs; the median
is reported. ``--step-ms`` adds a simulated training step after each batch and reports the share
of wall time spent waiting for data. Worker memory (Private_Dirty, USS, PSS) is read after the
warm-up and after the last epoch. ``--memory-records N`` instead measures worker memory over a
full pass of an N-record store of tiny records.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from . import packbench

BATCH = 64
SIZE = 256
CROP = 224
ENCODINGS = ("jpeg", "raw")
FORMATS = ("lmdb", "hdf5")
STORE_SYSTEMS = tuple(f"{f}-{e}" for e in ENCODINGS for f in FORMATS)
RECIPE_STORE = "lmdb-jpeg"
RECIPE_SYSTEMS = ("recipe-imagefolder", "recipe-transform", "recipe-decode", "random-crop",
                  "random-crop/default-collate")
DEFAULT_SYSTEMS = ("imagefolder", "lmdb-jpeg", "hdf5-jpeg", "lmdb-raw", "hdf5-raw",
                   "lmdb-jpeg/threads", *RECIPE_SYSTEMS)
# Random crops are compared within these groups, at one setting: under one seed, the same samples
# go to the same workers and draw the same boxes and flips.
PIXEL_GROUPS = {"recipe-transform": "recipe", "recipe-decode": "recipe",
                "recipe-imagefolder": "recipe-imagefolder", "random-crop": "random-crop",
                "random-crop/default-collate": "random-crop"}
TIE = 0.03  # --recommend: settings within 3 % of the best count as equally fast


# -- machine ----------------------------------------------------------------------------------

def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception:  # noqa: BLE001 - absent or broken: report as missing
        return None
    return str(getattr(mod, "__version__", "?"))


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, load and the versions of everything that matters for speed."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import psutil

        memory = psutil.virtual_memory().total
    except ImportError:
        memory = None
    import shardkit

    return {
        "cpu_model": model, "cores": cores(), "cpu_count": os.cpu_count(),
        "memory_bytes": memory, "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": {
            "python": platform.python_version(), "shardkit": shardkit.__version__,
            "torch": _version("torch"), "torchvision": _version("torchvision"),
            "numpy": _version("numpy"), "pil": packbench.pil_description(),
            "simplejpeg": _version("simplejpeg"), "lmdb": _version("lmdb"),
            "h5py": _version("h5py"), "psutil": _version("psutil"),
            "matplotlib": _version("matplotlib"),
        },
    }


# -- worker memory ------------------------------------------------------------------------------

def memory_of(pid: int) -> dict[str, float | None]:
    """Private_Dirty (from /proc/PID/smaps_rollup), USS and PSS of one process, in MB."""
    out: dict[str, float | None] = {"private_dirty_mb": None, "uss_mb": None, "pss_mb": None,
                                    "rss_mb": None}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Private_Dirty", "Pss", "Rss"):
                    name = {"Private_Dirty": "private_dirty_mb", "Pss": "pss_mb",
                            "Rss": "rss_mb"}[key]
                    out[name] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    try:
        import psutil

        full = psutil.Process(pid).memory_full_info()
        out["uss_mb"] = full.uss / 2**20
        out["pss_mb"] = getattr(full, "pss", None) and full.pss / 2**20 or out["pss_mb"]
    except Exception:  # noqa: BLE001 - psutil missing, or the process is gone
        pass
    return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (all its threads), from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _worker_pids(loader: Any) -> list[int]:
    it = getattr(loader, "_iterator", None)
    return [w.pid for w in getattr(it, "_workers", []) or [] if w.pid is not None]


def _memory_report(before: dict[int, dict], after: dict[int, dict]) -> dict[str, Any]:
    workers = []
    for pid, end in after.items():
        start = before.get(pid, {})
        row = {"pid": pid, **end}
        for key in ("private_dirty_mb", "uss_mb", "pss_mb"):
            if end.get(key) is not None and start.get(key) is not None:
                row[key.replace("_mb", "_growth_mb")] = end[key] - start[key]
        workers.append(row)
    total: dict[str, float] = {}
    for key in ("private_dirty_mb", "uss_mb", "pss_mb", "private_dirty_growth_mb",
                "uss_growth_mb", "pss_growth_mb"):
        values = [w[key] for w in workers if w.get(key) is not None]
        if values:
            total[key] = sum(values)
    return {"processes": workers, "total": total}


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
            crc = zlib.crc32(np.ascontiguousarray(img))
            self.crcs.append(zlib.crc32(int(label).to_bytes(8, "little", signed=True), crc))
            self.labels.append(int(label))

    def add_image(self, hwc: np.ndarray, label: int) -> None:
        crc = zlib.crc32(np.ascontiguousarray(hwc))
        self.crcs.append(zlib.crc32(int(label).to_bytes(8, "little", signed=True), crc))
        self.labels.append(int(label))

    def digest(self) -> str:
        return f"{zlib.crc32(np.sort(np.asarray(self.crcs, dtype=np.uint64)).tobytes()):08x}"

    def labels_digest(self) -> str:
        return f"{zlib.crc32(np.sort(np.asarray(self.labels, dtype=np.int64)).tobytes()):08x}"


# -- the baseline: what users run today -----------------------------------------------------------

def _pil_center_crop(img: Any, crop: int) -> Any:
    """torchvision's ``CenterCrop`` on a PIL image: zero padding first when it is smaller."""
    w, h = img.size
    if w < crop or h < crop:
        from PIL import Image

        canvas = Image.new("RGB", (max(w, crop), max(h, crop)))  # zeros, as torchvision pads
        canvas.paste(img, ((crop - w) // 2 if w < crop else 0, (crop - h) // 2 if h < crop else 0))
        img, (w, h) = canvas, canvas.size
    top, left = int(round((h - crop) / 2.0)), int(round((w - crop) / 2.0))
    return img.crop((left, top, left + crop, top + crop))


class PilImageFolder:
    """torchvision's ``ImageFolder`` + ``Resize(size)``, ``CenterCrop(crop)``, ``PILToTensor()``,
    written with PIL and numpy for machines without torchvision (same pixels, same order);
    ``transform`` replaces the resize and crop (it gets the RGB PIL image)."""

    def __init__(self, root: str, size: int = SIZE, crop: int = CROP,
                 transform: Callable | None = None) -> None:
        from ..packing.discovery import discover

        found = discover(root)
        self.samples = found.samples
        self.classes, self.class_to_idx = found.classes, found.class_to_idx
        self.size, self.crop, self.transform = size, crop, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        path, target = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        if self.transform is not None:
            return self.transform(img), target
        w, h = img.size
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = self.size, int(self.size * long / short)
        new = (new_short, new_long) if w <= h else (new_long, new_short)
        if new != (w, h):
            img = img.resize(new, Image.Resampling.BILINEAR)
        img = _pil_center_crop(img, self.crop)
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1), target


def baseline_dataset(root: str, size: int = SIZE, crop: int = CROP) -> tuple[Any, str]:
    """The ImageFolder baseline: torchvision's classes when importable, else :class:`PilImageFolder`."""
    try:
        from torchvision import datasets, transforms
    except Exception:  # noqa: BLE001 - not installed (or broken next to this torch)
        return PilImageFolder(root, size, crop), "PIL+numpy ImageFolder (torchvision not installed)"
    transform = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(crop),
                                    transforms.PILToTensor()])
    return datasets.ImageFolder(root, transform=transform), "torchvision ImageFolder"


# -- the training recipe: RandomResizedCrop(224) + RandomHorizontalFlip() -----------------------

def torchvision_version() -> str | None:
    """torchvision's version when it imports (with its v2 transforms), else None."""
    try:
        import torchvision
        from torchvision.transforms import v2  # noqa: F401
    except Exception:  # noqa: BLE001 - not installed (or broken next to this torch)
        return None
    return torchvision.__version__


class PilRecipe:
    """``RandomResizedCrop(crop)``, ``RandomHorizontalFlip()``, ``PILToTensor()`` on a PIL image as
    torchvision's v1 transforms do it (pytorch/examples' recipe), for machines without
    torchvision: box and flip from :class:`shardkit.augment.Recipe` (torchvision's RNG calls),
    then torchvision's PIL path: crop, Pillow bilinear resize, transpose."""

    def __init__(self, crop: int = CROP) -> None:
        from ..augment import Recipe

        self.crop = crop
        self.recipe = Recipe(crop, "random_resized", flip=0.5, dct_scale=False)

    def __call__(self, img: Any) -> Any:
        import torch
        from PIL import Image

        top, left, h, w, flip, _ = self.recipe.draw(img.height, img.width)
        img = img.crop((left, top, left + w, top + h))
        img = img.resize((self.crop, self.crop), Image.Resampling.BILINEAR)
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)


class TensorRecipe:
    """``v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip()])`` on
    a uint8 CxHxW tensor, for machines without torchvision: shardkit.augment's box, flip and
    resize, the pixels of torchvision v2 (tests/test_torchvision_parity.py, tests/test_bench.py)."""

    def __init__(self, crop: int = CROP) -> None:
        from ..augment import Recipe

        self.crop = crop
        self.recipe = Recipe(crop, "random_resized", flip=0.5, dct_scale=False)

    def __call__(self, img: Any) -> Any:
        import torch

        from .. import augment

        top, left, h, w, flip, _ = self.recipe.draw(img.shape[1], img.shape[2])
        box = img.permute(1, 2, 0).numpy()[top:top + h, left:left + w]
        out = np.empty((self.crop, self.crop, 3), np.uint8)
        if box.shape[:2] == out.shape[:2]:  # torchvision returns such a crop as it is
            np.copyto(out, box)
        else:
            augment.resize_into(out, box)
        if flip:
            augment.mirror(out)
        return torch.from_numpy(out).permute(2, 0, 1)


def recipe_baseline(root: str, torchvision: bool) -> tuple[Any, str]:
    """ImageFolder with the recipe as pytorch/examples runs it (v1 transforms on PIL images)."""
    if not torchvision:
        return (PilImageFolder(root, transform=PilRecipe()),
                "PIL ImageFolder + shardkit's RandomResizedCrop(224)+RandomHorizontalFlip() "
                "on PIL images, Pillow bilinear (torchvision v1's pixels; torchvision not "
                "installed)")
    from torchvision import datasets, transforms

    transform = transforms.Compose([transforms.RandomResizedCrop(CROP),
                                    transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    return (datasets.ImageFolder(root, transform=transform),
            f"torchvision {torchvision_version()} ImageFolder + RandomResizedCrop(224), "
            "RandomHorizontalFlip(), PILToTensor() (v1 on PIL images)")


def recipe_transform(torchvision: bool) -> tuple[Callable, str]:
    """The recipe as a per-sample transform on ShardDataset's uint8 tensors."""
    if not torchvision:
        return (TensorRecipe(), "shardkit.augment's RandomResizedCrop(224)+RandomHorizontalFlip()"
                " on uint8 tensors (torchvision v2's pixels; torchvision not installed)")
    from torchvision.transforms import v2

    return (v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()]),
            f"torchvision {torchvision_version()} v2.Compose([RandomResizedCrop(224, "
            "antialias=True), RandomHorizontalFlip()])")


# -- stores --------------------------------------------------------------------------------------

@dataclass
class PackFigure:
    system: str
    seconds: float  # packing, from the first image encoded; start-up excluded
    startup_s: float
    images: int
    images_per_s: float
    bytes: int


def store_of(system: str) -> str | None:
    """The store a system reads (``lmdb-jpeg``, ...), None for the image-folder systems."""
    if system in ("imagefolder", "recipe-imagefolder"):
        return None
    return RECIPE_STORE if system in RECIPE_SYSTEMS else system.split("/")[0]


def store_path(work: str, system: str) -> str:
    fmt, enc = store_of(system).split("-")
    return os.path.join(work, f"{fmt}-{enc}" + (".lmdb" if fmt == "lmdb" else ".h5"))


def pack_stores(src: str, work: str, systems: Iterable[str], workers: int,
                reuse: bool = False) -> list[PackFigure]:
    """Pack ``src`` once per (format, encoding) the systems need; returns pack timings."""
    from ..packing.packer import pack

    figures = []
    for name in STORE_SYSTEMS:
        if not any(store_of(s) == name for s in systems):
            continue
        fmt, enc = name.split("-")
        out = store_path(work, name)
        if reuse and os.path.exists(out):
            _log(f"reusing {out} (not packed, not timed)")
            continue
        result = pack(src, out, format=fmt, encoding=enc, size=SIZE, workers=workers,
                      overwrite=True, progress=False)
        figures.append(PackFigure(name, result.packing_seconds, result.startup_seconds,
                                  result.count, result.images_per_second, _disk_bytes(out)))
        _log(f"packed {name}: {result.count} images in {result.packing_seconds:.1f} s after "
             f"{result.startup_seconds:.1f} s start-up ({result.images_per_second:.0f} images/s)")
    return figures


def pack_speed(src: str, work: str, args: argparse.Namespace,
               workers: int) -> list[dict[str, Any]]:
    """Pack-speed figures with this interpreter's PIL and, with ``--simd-python``, with that
    interpreter's."""
    _log("pack speed: one-process paths (shardkit, naive PIL), pack, shardkit path again")
    figures = [packbench.pack_figures(src, work, args.pack_sample, workers)]
    if args.simd_python:
        _log(f"pack speed under {args.simd_python}")
        try:
            figures.append(packbench.pack_figures_in(args.simd_python, src, args.pack_sample,
                                                     workers))
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
            _log(f"no pack figures from {args.simd_python}: {exc}")
    return figures


def _disk_bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


# -- the timed loop ------------------------------------------------------------------------------

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
    pids = _worker_pids(loader)
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
    pids = [os.getpid(), *_worker_pids(loader)]
    cpu0 = [cpu_seconds(pid) for pid in pids]
    stats = _repeat(lambda: run_epoch(loader, step, None), epochs, lambda st: st.seconds,
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
               _memory_report(before, after), images_timed=total,
               outputs=sorted(fingerprint.kinds) if fingerprint else None)


def _loader(dataset: Any, num_workers: int, prefetch: int, collate: Callable | None,
            init: Callable | None, seed: int) -> Any:
    import torch
    from torch.utils.data import DataLoader

    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=prefetch, worker_init_fn=init)
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=num_workers,
                      collate_fn=collate, generator=torch.Generator().manual_seed(seed),
                      **kwargs)


def _shutdown(loader: Any) -> None:
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    del loader
    gc.collect()


# -- decode ceiling ------------------------------------------------------------------------------

def _repeat(fn: Callable[[], Any], epochs: int, seconds: Callable[[Any], float],
            min_seconds: float, cap: int = 50) -> list:
    """At least ``epochs`` calls, and more (up to ``cap``) until they took ``min_seconds``:
    a median over 0.1 s epochs is at the mercy of one scheduler hiccup."""
    results = [fn() for _ in range(max(1, epochs))]
    while len(results) < cap and sum(map(seconds, results)) < min_seconds:
        results.append(fn())
    return results


def decode_ceiling(path: str, fast: bool, epochs: int, check: bool,
                   min_seconds: float = 0.0) -> dict[str, Any]:
    """One process, tight loop: the store's own bytes to centre crops, no Dataset/DataLoader.

    Crops go to successive places of one batch-sized array, as any loader's must (one reused
    crop-sized buffer would stay in cache and flatter the loop). Also timed: decoding alone.
    """
    from .. import codec
    from ..store import Store

    store = Store(path)
    records, shapes, labels = [], [], []
    for k in range(len(store.shards)):
        shard = store.shard(k)
        with shard.reader.records() as get:
            for i in range(shard.entry.count):
                records.append(bytes(get(i)))
                shapes.append((int(shard.heights[i]), int(shard.widths[i])))
                labels.append(int(shard.labels[i]))
    store.close()
    batch = np.zeros((BATCH, CROP, CROP, 3), np.uint8)
    encoding = store.encoding
    fingerprint = Fingerprint() if check else None

    def one_pass(fp: Fingerprint | None) -> float:
        t0 = time.perf_counter()
        for i, (data, (h, w), label) in enumerate(zip(records, shapes, labels)):
            out = batch[i % BATCH]
            codec.decode_crop_into(out, data, encoding, h, w, None, fast)
            if fp is not None:
                fp.add_image(out, label)
        return time.perf_counter() - t0

    def decode_only() -> float:
        t0 = time.perf_counter()
        for data, (h, w) in zip(records, shapes):
            codec.decode(data, encoding, h, w, fast, codec.scratch(h * w * 3))
        return time.perf_counter() - t0

    one_pass(fingerprint)
    cpu0 = time.process_time()
    times = _repeat(lambda: one_pass(None), epochs, float, min_seconds)
    cpu = time.process_time() - cpu0
    rate = len(records) / statistics.median(times)
    parallel = _parallel_rate(one_pass, len(records), len(times)) if cores() > 1 else None
    decode_times = _repeat(decode_only, epochs, float, min_seconds / 2)
    return {"encoding": encoding, "store": os.path.basename(path), "images": len(records),
            "epochs_s": times, "single_core_images_per_s": rate,
            "cpu_us_per_image": cpu / (len(records) * len(times)) * 1e6,
            "cores": cores(), "images_per_s": rate * cores(),
            "parallel_images_per_s": parallel,
            "decode_only_single_core_images_per_s": len(records) / statistics.median(decode_times),
            "mean_record_bytes": sum(map(len, records)) / max(1, len(records)),
            "digest": fingerprint.digest() if fingerprint else None,
            "labels_digest": fingerprint.labels_digest() if fingerprint else None}


def _parallel_loop(one_pass: Callable, count: int, epochs: int, start: Any, queue: Any) -> None:
    one_pass(None)
    start.wait()
    t0 = time.perf_counter()
    for _ in range(max(1, epochs)):
        one_pass(None)
    queue.put(count * max(1, epochs) / (time.perf_counter() - t0))


def _parallel_rate(one_pass: Callable, count: int, epochs: int) -> float | None:
    """The same tight loop in one forked process per core at once: what the cores really give
    together (shared caches, memory bandwidth, a busy machine). Reported beside cores x one."""
    if not hasattr(os, "fork"):
        return None
    ctx = multiprocessing.get_context("fork")
    start, queue = ctx.Barrier(cores()), ctx.Queue()
    procs = [ctx.Process(target=_parallel_loop, args=(one_pass, count, epochs, start, queue))
             for _ in range(cores())]
    for proc in procs:
        proc.start()
    try:
        return sum(queue.get(timeout=600) for _ in procs)
    finally:
        for proc in procs:
            proc.join()


# -- orchestration -------------------------------------------------------------------------------

def _log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _parse_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0: {text!r}")
    return values


def _parse_systems(text: str) -> list[str]:
    systems = [s.strip() for s in text.split(",") if s.strip()]
    known = {"imagefolder", *STORE_SYSTEMS, *(f"{s}/threads" for s in STORE_SYSTEMS),
             *RECIPE_SYSTEMS}
    bad = [s for s in systems if s not in known]
    if bad or not systems:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(bad) or '(none)'}; choose from {', '.join(sorted(known))}")
    return systems


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardkit bench",
        description="DataLoader throughput: ImageFolder+PIL against ShardDataset stores "
                    "(LMDB/HDF5 x jpeg/raw), with the decode ceiling and pack speed, and the "
                    "training recipe (RandomResizedCrop + flip) three ways.")
    p.add_argument("input", nargs="?", help="image folder (ImageFolder layout)")
    p.add_argument("--sample", type=int, metavar="N",
                   help="generate N photo-like images instead of giving a folder")
    p.add_argument("--classes", type=int, default=10, help="classes of a --sample [10]")
    p.add_argument("--systems", type=_parse_systems, default=list(DEFAULT_SYSTEMS),
                   help="comma-separated systems [%(default)s]".replace("%(default)s",
                                                                       ",".join(DEFAULT_SYSTEMS)))
    p.add_argument("--workers-list", type=_parse_list, default=None,
                   help="num_workers values to sweep [0,1,...,2x cores]")
    p.add_argument("--threads-list", type=_parse_list, default=None,
                   help="threads values for the /threads systems [1,...,2x cores]")
    p.add_argument("--recipe-workers", type=_parse_list, default=[2],
                   help="num_workers values for the training-recipe and random-crop systems [2]")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs after the warm-up [3]")
    p.add_argument("--min-seconds", type=float, default=2.0,
                   help="run more timed epochs (up to 50) until they add up to this [2.0]")
    p.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor [2]")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="simulated training step after each batch, in ms (a sleep)")
    p.add_argument("--step-cpu", action="store_true",
                   help="make the --step-ms step busy CPU compute instead of a sleep")
    p.add_argument("--exact-decode", action="store_true",
                   help="exact JPEG decode (default: libjpeg-turbo fast DCT/upsampling, the "
                        "fast_decode=True setting, in ShardDataset and the ceiling alike)")
    p.add_argument("--pack-workers", type=int, default=None,
                   help="processes for packing the stores (default: all cores)")
    p.add_argument("--pack-sample", type=int, default=0,
                   help="sources timed for the one-process pack figures (0: all) [0]")
    p.add_argument("--no-pack-figures", action="store_true",
                   help="skip the pack-speed figures (one-process and naive-loop timing)")
    p.add_argument("--simd-python", metavar="PYTHON",
                   help="also measure pack speed under this interpreter (a pillow-simd "
                        "environment, e.g. .venv-simd/bin/python from scripts/pillow_simd_venv.sh)")
    p.add_argument("--no-check", action="store_true",
                   help="skip fingerprinting the warm-up epoch (same-pixels check)")
    p.add_argument("--recommend", action="store_true",
                   help="print the fastest DataLoader settings with the fewest workers as code")
    p.add_argument("--out-dir", default="bench-results",
                   help="where the JSON, table and plot go [bench-results]")
    p.add_argument("--work-dir", help="where the sample and stores go (default: a temporary "
                   "folder, removed afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--reuse", action="store_true",
                   help="reuse stores already in --work-dir (their packing is not timed again)")
    p.add_argument("--memory-records", type=int, metavar="N",
                   help="instead: pack N tiny records and measure worker memory over a pass")
    p.add_argument("--seed", type=int, default=0)
    return p


def _command(args: argparse.Namespace) -> str:
    prog = "python benchmarks/throughput.py" if args.targets else "shardkit bench"
    return f"{prog} {shlex.join(args.argv)}"


def main(argv: Sequence[str] | None = None, targets: bool = False) -> int:
    """Run the benchmark; returns the exit status (non-zero if systems disagree on pixels).

    ``targets`` also judges this project's acceptance targets ("target: ... met"), as
    benchmarks/throughput.py does; ``shardkit bench`` reports the measurements only.
    """
    parser = build_parser()
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser.parse_args(argv)
    args.argv, args.targets = argv, targets
    if args.memory_records is not None:
        from ..errors import ShardkitError

        try:
            return memory_main(args)
        except ShardkitError as exc:
            print(f"shardkit bench: error: {exc}", file=sys.stderr)
            return 1
    if (args.input is None) == (args.sample is None):
        parser.error("give an image folder or --sample N (one of them)")
    if args.epochs < 1:
        parser.error("--epochs must be >= 1")
    if args.sample is not None and args.sample < 1:
        parser.error("--sample must be >= 1")
    work = args.work_dir or tempfile.mkdtemp(prefix="shardkit-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        return _bench(args, work)
    finally:
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        elif args.keep or args.work_dir:
            _log(f"stores kept in {work}")


def _bench(args: argparse.Namespace, work: str) -> int:
    from ..errors import ShardkitError

    n_cores = cores()
    workers_list = args.workers_list or list(range(0, 2 * n_cores + 1))
    threads_list = args.threads_list or list(range(1, 2 * n_cores + 1))
    fast = not args.exact_decode
    report: dict[str, Any] = {
        "command": _command(args), "argv": args.argv,
        "machine": machine_info(),
        "settings": {"batch_size": BATCH, "resize": SIZE, "crop": CROP, "epochs": args.epochs,
                     "min_seconds": args.min_seconds,
                     "workers_list": workers_list, "threads_list": threads_list,
                     "recipe_workers": args.recipe_workers,
                     "prefetch_factor": args.prefetch, "step_ms": args.step_ms,
                     "step_cpu": args.step_cpu, "fast_decode": fast, "shuffle": True,
                     "persistent_workers": True, "systems": args.systems},
    }
    t_start = time.perf_counter()
    src = args.input
    if args.sample is not None:
        from .sample import make_sample

        src = os.path.join(work, "sample")
        if not os.path.isdir(src):
            t0 = time.perf_counter()
            make_sample(src, args.sample, max(1, min(args.classes, args.sample)), args.seed)
            _log(f"made {args.sample} sample images in {time.perf_counter() - t0:.1f} s")
    if not os.path.isdir(src):
        print(f"shardkit bench: error: not a folder: {src}", file=sys.stderr)
        return 1
    pack_workers = n_cores if args.pack_workers is None else args.pack_workers
    try:
        report["input"] = _describe_source(src)
        packs = pack_stores(src, work, args.systems, pack_workers, args.reuse)
    except ShardkitError as exc:
        print(f"shardkit bench: error: {exc}", file=sys.stderr)
        return 1
    report["pack"] = {"stores": [asdict(p) for p in packs], "workers": pack_workers}
    if not args.no_pack_figures:
        report["pack"]["figures"] = pack_speed(src, work, args, pack_workers)
    ceilings: dict[str, dict] = {}
    for enc in ENCODINGS:
        store = next((store_path(work, s) for s in args.systems
                      if (store_of(s) or "").endswith(enc)), None)
        if store:
            ceilings[enc] = decode_ceiling(store, fast, args.epochs, not args.no_check,
                                           args.min_seconds)
            _log(f"decode ceiling ({enc}): {ceilings[enc]['single_core_images_per_s']:.0f} "
                 f"images/s on one core, x{n_cores} = {ceilings[enc]['images_per_s']:.0f}")
    report["ceilings"] = ceilings
    step = make_step(args.step_ms, args.step_cpu)
    runs: list[Run] = []
    for system in args.systems:
        runs += _sweep(system, src, work, workers_list, threads_list, args, step, fast,
                       report["input"]["mean_bytes"])
    report["runs"] = [asdict(r) | {"setting": r.setting} for r in runs]
    report["checks"] = consistency(runs, ceilings)
    report["summary"] = summarize(runs, ceilings, report["pack"], args.systems, args.step_ms)
    report["elapsed_s"] = time.perf_counter() - t_start
    report["machine"]["load_average_end"] = (list(os.getloadavg())
                                             if hasattr(os, "getloadavg") else None)
    table = format_table(runs, ceilings, report, args.targets)
    print(table)
    if args.recommend:
        print(recommend(runs, args, work))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "throughput.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(args.out_dir, "throughput.txt"), "w") as f:
        f.write(table + "\n")
    note = plot(runs, ceilings, os.path.join(args.out_dir, "throughput.png"), args.step_ms,
                args.step_cpu)
    _log(f"wrote {args.out_dir}/throughput.json, throughput.txt" + (f"; {note}" if note else
                                                                    ", throughput.png"))
    return 0 if report["checks"]["ok"] else 1


def _describe_source(src: str) -> dict[str, Any]:
    from PIL import Image

    from ..packing.discovery import discover

    found = discover(src)
    sizes = [os.path.getsize(p) for p, _ in found.samples]
    dims = []
    for p, _ in found.samples[:: max(1, len(found.samples) // 200)]:
        with Image.open(p) as im:
            dims.append(im.size)
    return {"path": src, "images": len(found.samples), "classes": len(found.classes),
            "mean_bytes": sum(sizes) / max(1, len(sizes)),
            "mean_width": float(np.mean([d[0] for d in dims])) if dims else None,
            "mean_height": float(np.mean([d[1] for d in dims])) if dims else None}


def _sweep(system: str, src: str, work: str, workers_list: list[int], threads_list: list[int],
           args: argparse.Namespace, step: Callable | None, fast: bool,
           source_bytes: float) -> list[Run]:
    from ..dataset import ShardDataset, collate, worker_init_fn

    runs = []
    check = not args.no_check
    label: str | None = None
    if system in ("imagefolder", "recipe-imagefolder"):
        if system == "imagefolder":
            dataset, label = baseline_dataset(src)
            settings = [("workers", w, 0) for w in workers_list]
        else:
            dataset, label = recipe_baseline(src, torchvision_version() is not None)
            settings = [("workers", w, 0) for w in args.recipe_workers]
        make = lambda mode, w, t: _loader(dataset, w, args.prefetch, None, None, args.seed)  # noqa: E731
        bytes_per_image = source_bytes
    elif system in RECIPE_SYSTEMS:
        path = store_path(work, system)
        settings = [("workers", w, 0) for w in args.recipe_workers]
        collate_fn = None if system == "random-crop/default-collate" else collate
        kwargs: dict[str, Any]
        if system == "recipe-transform":
            transform, name = recipe_transform(torchvision_version() is not None)
            kwargs = {"transform": transform}
            label = f"ShardDataset(transform=...), shardkit.collate; transform: {name}"
        else:
            kwargs = ({"crop": CROP, "crop_mode": "random_resized", "flip": 0.5}
                      if system == "recipe-decode" else {"crop": CROP, "crop_mode": "random"})
            label = (f"ShardDataset({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}), "
                     + ("shardkit.collate" if collate_fn else
                        "no collate_fn (the default collate)"))

        def make(mode: str, w: int, t: int) -> Any:
            ds = ShardDataset(path, fast_decode=fast, **kwargs)
            return _loader(ds, w, args.prefetch, collate_fn, worker_init_fn, args.seed)
        bytes_per_image = _disk_bytes(path) / max(1, len(ShardDataset(path)))
    else:
        path = store_path(work, system)
        threaded = system.endswith("/threads")
        settings = ([("threads", 0, t) for t in threads_list] if threaded
                    else [("workers", w, 0) for w in workers_list])
        store_bytes = _disk_bytes(path)

        def make(mode: str, w: int, t: int) -> Any:
            ds = ShardDataset(path, crop=CROP, threads=t, fast_decode=fast)
            return _loader(ds, w, args.prefetch, collate, worker_init_fn, args.seed)
        bytes_per_image = store_bytes / max(1, len(ShardDataset(path)))
    if label:
        _log(f"{system}: {label}")
    for mode, w, t in settings:
        loader = make(mode, w, t)
        try:
            run = measure(system, loader, mode=mode, num_workers=w, threads=t,
                          prefetch=args.prefetch if w > 0 else None, epochs=args.epochs,
                          min_seconds=args.min_seconds,
                          step=step, bytes_per_image=bytes_per_image, check=check,
                          seed=args.seed)
        finally:
            _shutdown(loader)
        run.implementation = label
        wait = "" if run.data_wait_share is None else f", data wait {run.data_wait_share:.0%}"
        _log(f"{system:18s} {run.setting:10s} {run.images_per_s:8.0f} images/s{wait}")
        runs.append(run)
    return runs


# -- results ---------------------------------------------------------------------------------------

def _encoding(system: str) -> str | None:
    """The encoding of the store a system reads (None: an image folder)."""
    store = store_of(system)
    return None if store is None else store.split("-")[1]


def _pixel_group(run: Run) -> str:
    """Runs that must deliver the same pixels: one encoding's centre crops, or random crops of
    one group at one setting."""
    group = PIXEL_GROUPS.get(run.system)
    if group is not None:
        return f"{group} {run.setting}"
    return _encoding(run.system) or "imagefolder"


def consistency(runs: list[Run], ceilings: dict[str, dict]) -> dict[str, Any]:
    """Same pixels per encoding (every store, setting and the ceiling), same labels everywhere."""
    problems = []
    pixel_groups: dict[str, set[str]] = {}
    labels = set()
    expected = f"torch.uint8 3x{CROP}x{CROP}"
    for run in runs:
        if run.outputs is not None and run.outputs != [expected]:
            problems.append(f"{run.system} {run.setting} delivered {', '.join(run.outputs)}, "
                            f"not {expected}")
        if run.digest is None:
            continue
        labels.add(run.labels_digest)
        key = _pixel_group(run)
        pixel_groups.setdefault(key, set()).add(run.digest)
    for enc, c in ceilings.items():
        if c.get("digest"):
            pixel_groups.setdefault(enc, set()).add(c["digest"])
            labels.add(c["labels_digest"])
    for key, digests in pixel_groups.items():
        if len(digests) > 1:
            problems.append(f"{key}: systems/settings delivered different pixels "
                            f"({', '.join(sorted(digests))})")
    if len(labels) > 1:
        problems.append(f"systems delivered different labels ({', '.join(sorted(labels))})")
    return {"ok": not problems, "problems": problems,
            "pixel_digests": {k: sorted(v) for k, v in pixel_groups.items()},
            "checked": bool(pixel_groups)}


def _best(runs: list[Run], system: str) -> Run | None:
    mine = [r for r in runs if r.system == system]
    return max(mine, key=lambda r: r.images_per_s) if mine else None


def _best_of(runs: list[Run], systems: Iterable[str]) -> Run | None:
    found = [b for b in (_best(runs, s) for s in systems) if b is not None]
    return max(found, key=lambda r: r.images_per_s) if found else None


def summarize(runs: list[Run], ceilings: dict[str, dict], pack: dict[str, Any],
              systems: Sequence[str], step_ms: float) -> dict[str, Any]:
    """The issue's targets, as measured ratios."""
    out: dict[str, Any] = {}
    base = _best(runs, "imagefolder")
    lmdb_jpeg = _best_of(runs, ("lmdb-jpeg", "lmdb-jpeg/threads"))
    ceiling = ceilings.get("jpeg", {}).get("images_per_s")

    def best_entry(run: Run | None) -> dict[str, Any] | None:
        return None if run is None else {"system": run.system, "setting": run.setting,
                                         "images_per_s": run.images_per_s}

    out["best"] = {s: best_entry(_best(runs, s)) for s in systems}
    if lmdb_jpeg and ceiling:
        out["lmdb_jpeg_vs_ceiling"] = {"ratio": lmdb_jpeg.images_per_s / ceiling,
                                       "target": 0.85, "best": best_entry(lmdb_jpeg)}
        # The ceiling above counts decoding plus the crop copy any loader makes; this one
        # decoding alone (no copy, one reused buffer), a bound no loader reaches.
        c = ceilings["jpeg"]
        decode_only = c["decode_only_single_core_images_per_s"] * c["cores"]
        out["lmdb_jpeg_vs_decode_only_ceiling"] = {"ratio": lmdb_jpeg.images_per_s / decode_only,
                                                   "ceiling_images_per_s": decode_only}
        parallel = ceilings["jpeg"].get("parallel_images_per_s")
        if parallel:
            out["lmdb_jpeg_vs_parallel_ceiling"] = {"ratio": lmdb_jpeg.images_per_s / parallel}
        # Load-independent: CPU per image of the settings that can keep every core busy, against
        # the tight loop's. On idle cores, throughput / (cores x ceiling) would read about this.
        n = ceilings["jpeg"]["cores"]
        busy = [r for r in runs if r.system in ("lmdb-jpeg", "lmdb-jpeg/threads")
                and r.cpu_us_per_image and max(r.num_workers, r.threads) >= n]
        if busy and ceilings["jpeg"].get("cpu_us_per_image"):
            cheapest = min(busy, key=lambda r: r.cpu_us_per_image)
            out["lmdb_jpeg_cpu_efficiency"] = {
                "ratio": ceilings["jpeg"]["cpu_us_per_image"] / cheapest.cpu_us_per_image,
                "cpu_us_per_image": cheapest.cpu_us_per_image,
                "ceiling_cpu_us_per_image": ceilings["jpeg"]["cpu_us_per_image"],
                "best": best_entry(cheapest)}
        proc = _best(runs, "lmdb-jpeg")
        if proc:
            out["lmdb_jpeg_workers_vs_ceiling"] = {"ratio": proc.images_per_s / ceiling,
                                                   "best": best_entry(proc)}
    if lmdb_jpeg and base:
        out["lmdb_jpeg_vs_baseline"] = {"ratio": lmdb_jpeg.images_per_s / base.images_per_s,
                                        "target": 8.0}
    for enc in ENCODINGS:
        lm, h5 = _best_of(runs, (f"lmdb-{enc}", f"lmdb-{enc}/threads")), \
            _best_of(runs, (f"hdf5-{enc}", f"hdf5-{enc}/threads"))
        if lm and h5:
            out[f"hdf5_vs_lmdb_{enc}"] = {"ratio": h5.images_per_s / lm.images_per_s,
                                          "target": 0.9}
    raw, jpeg = _best_of(runs, ("lmdb-raw", "lmdb-raw/threads")), lmdb_jpeg
    if raw and jpeg:
        out["raw_vs_jpeg"] = {"ratio": raw.images_per_s / jpeg.images_per_s, "target": 3.0}

    def at(system: str, setting: str) -> Run | None:
        return next((r for r in runs if r.system == system and r.setting == setting), None)

    # Side by side at one setting: the recipe at decode's best, the random crop's best.
    decode = _best(runs, "recipe-decode")
    for key, other, target in (("recipe_decode_vs_random_crop", "random-crop", 0.75),
                               ("recipe_decode_vs_transform", "recipe-transform", 1.5),
                               ("recipe_decode_vs_imagefolder", "recipe-imagefolder", None)):
        them = decode and at(other, decode.setting)
        if them:
            out[key] = {"ratio": decode.images_per_s / them.images_per_s, "target": target,
                        "setting": decode.setting, "images_per_s": decode.images_per_s,
                        "other_images_per_s": them.images_per_s}
    plain = _best(runs, "random-crop")
    default = plain and at("random-crop/default-collate", plain.setting)
    if default:
        out["default_collate_vs_collate"] = {
            "ratio": default.images_per_s / plain.images_per_s, "setting": plain.setting,
            "images_per_s": default.images_per_s, "other_images_per_s": plain.images_per_s}
    if step_ms > 0:
        out["data_wait"] = {s: (lambda b: None if b is None else
                                {"setting": b.setting, "share": b.data_wait_share})(_best(runs, s))
                            for s in systems}
        least = {}
        for system in systems:
            mine = [r for r in runs if r.system == system and r.data_wait_share is not None]
            if mine:
                r = min(mine, key=lambda r: r.data_wait_share)
                least[system] = {"setting": r.setting, "share": r.data_wait_share}
        out["least_wait"] = least
    out["pack"] = [packbench.summarize(f, pack.get("cores", cores()))
                   for f in pack.get("figures", [])]
    return out


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(runs: list[Run], ceilings: dict[str, dict], report: dict[str, Any],
                 targets: bool = False) -> str:
    """The stdout table: one row per system and setting, then the ceilings, the ratios, and with
    ``targets`` this project's acceptance targets (benchmarks/throughput.py judges them)."""
    m = report["machine"]
    n = m["cores"]
    pil = m["versions"]["pil"]
    inp = report["input"]
    lines = [f"command: {report['command']}",
             f"machine: {m['cpu_model']}, {n} cores; python {m['versions']['python']}, torch "
             f"{m['versions']['torch']}, {pil['name']} {pil['version']}, simplejpeg "
             f"{m['versions']['simplejpeg']}; load average at start "
             f"{', '.join(f'{x:.1f}' for x in m['load_average'] or [])}",
             f"input: {inp['images']} images, {inp['classes']} classes, mean "
             f"{inp['mean_bytes'] / 1e3:.0f} KB, {inp['mean_width']:.0f}x{inp['mean_height']:.0f}"
             f" px; batch {BATCH}, uint8 3x{CROP}x{CROP} centre crops (random and "
             f"RandomResizedCrop+flip for the recipe rows); median of >= "
             f"{report['settings']['epochs']} epochs (more until "
             f"{report['settings']['min_seconds']:g} s) after a warm-up"
             + (f"; step {report['settings']['step_ms']:g} ms "
                f"({'busy CPU' if report['settings']['step_cpu'] else 'sleep'})"
                if report['settings']['step_ms'] else ""), ""]
    bases = {"": _best(runs, "imagefolder"), "recipe-": _best(runs, "recipe-imagefolder")}
    width = max([18, *(len(r.system) for r in runs)])
    header = (f"{'system':{width}s} {'setting':10s} {'images/s':>9s} {'MB/s':>7s} {'wait':>5s} "
              f"{'x ceil':>6s} {'x base':>6s} {'CPU us/img':>10s} {'PrivDirty MB':>12s} "
              f"{'(+growth)':>9s} {'USS MB':>7s} {'PSS MB':>7s}")
    lines += [header, "-" * len(header)]
    for r in runs:
        recipe = r.system.startswith("recipe-")  # resized crops: x base against the same recipe
        enc = None if recipe else _encoding(r.system)
        ceil = ceilings.get(enc, {}).get("images_per_s") if enc else None
        base = bases["recipe-" if recipe else ""]
        tot = r.memory.get("total", {})
        lines.append(
            f"{r.system:{width}s} {r.setting:10s} {r.images_per_s:9.0f} {r.mb_per_s:7.1f} "
            f"{'-' if r.data_wait_share is None else format(r.data_wait_share, '.0%'):>5s} "
            f"{'-' if not ceil else format(r.images_per_s / ceil, '.2f'):>6s} "
            f"{'-' if not base else format(r.images_per_s / base.images_per_s, '.1f'):>6s} "
            f"{'-' if r.cpu_us_per_image is None else format(r.cpu_us_per_image, '.0f'):>10s} "
            f"{_mb(tot.get('private_dirty_mb')):>12s} "
            f"{_signed(tot.get('private_dirty_growth_mb')):>9s} "
            f"{_mb(tot.get('uss_mb')):>7s} {_mb(tot.get('pss_mb')):>7s}")
    lines.append("(CPU us/img: main process and workers together, timed epochs; memory: worker "
                 "processes' totals after the run, the main process for num_workers=0 and threads)")
    described = {r.system: r.implementation for r in runs
                 if r.system in RECIPE_SYSTEMS and r.implementation}
    if described:
        lines.append(f"training recipe, RandomResizedCrop({CROP}) + RandomHorizontalFlip(0.5), "
                     f"{RECIPE_STORE} store (recipe-* rows: x base against recipe-imagefolder):")
        lines += [f"  {system}: {text}" for system, text in described.items()]
    lines.append("")
    for enc, c in ceilings.items():
        par = c.get("parallel_images_per_s")
        lines.append(f"decode ceiling {enc:4s}: {c['single_core_images_per_s']:.0f} images/s on "
                     f"one core ({c['cpu_us_per_image']:.0f} us CPU each) x {c['cores']} cores = "
                     f"{c['images_per_s']:.0f} images/s"
                     + (f"; {c['cores']} processes at once: {par:.0f}" if par else "")
                     + f" (mean record {c['mean_record_bytes'] / 1e3:.1f} KB; decoding alone, "
                       f"no crop: {c['decode_only_single_core_images_per_s']:.0f} on one core)")
    pack = report.get("pack", {})
    for p in pack.get("stores", []):
        lines.append(f"shardkit pack {p['system']:10s}: {p['images_per_s']:.0f} images/s "
                     f"({p['images']} images, {p['bytes'] / 1e6:.1f} MB; after "
                     f"{p['startup_s']:.1f} s start-up)")
    lines.append("")
    lines += _target_lines(report["summary"], targets)
    checks = report["checks"]
    if checks["checked"]:
        groups = {k.split()[0] for k in checks["pixel_digests"]}
        random = ("; at each setting, the recipe at decode the same as the per-sample transform"
                  if "recipe" in groups else "") + (
                  "; random crops the same with either collate" if "random-crop" in groups else "")
        lines.append("same output: " + (f"yes (every system and setting delivered the same "
                                        f"pixels per encoding{random}; the same labels)"
                                        if checks["ok"] else "NO: " + "; ".join(checks["problems"])))
    return "\n".join(lines)


def _target_lines(summary: dict[str, Any], targets: bool = False) -> list[str]:
    """The measured ratios; with ``targets``, each judged against this project's target."""
    def line(text: str, rule: str, ok: bool) -> str:
        if not targets:
            return text
        return f"target: {text} ({rule}: {'met' if ok else 'NOT met'})"

    lines = []
    if summary.get("data_wait"):
        # Every loader is capped at batch / step here: the throughput ratios need a run
        # without --step-ms.
        lines.append("(throughput ratios not reported: --step-ms caps every system at "
                     "batch size / step time)")
        summary = {k: v for k, v in summary.items()
                   if k in ("data_wait", "least_wait", "pack")}
    s = summary.get("lmdb_jpeg_vs_ceiling")
    if s:
        b = s["best"]
        lines.append(line(f"ShardDataset lmdb-jpeg best ({b['system']} {b['setting']}) = "
                          f"{s['ratio']:.2f} x cores x single-core ceiling (decode + crop copy)",
                          ">= 0.85", s["ratio"] >= 0.85))
        d = summary.get("lmdb_jpeg_vs_decode_only_ceiling")
        if d:
            lines.append(f"        against decoding alone ({d['ceiling_images_per_s']:.0f} "
                         f"images/s on all cores, no crop copy): {d['ratio']:.2f}")
        w = summary.get("lmdb_jpeg_workers_vs_ceiling")
        if w:
            lines.append(f"        with process workers ({w['best']['setting']}): "
                         f"{w['ratio']:.2f} x ceiling")
        p = summary.get("lmdb_jpeg_vs_parallel_ceiling")
        if p:
            lines.append(f"        best against the tight loop run in every core at once (what "
                         f"the cores gave at the time): {p['ratio']:.2f}")
        e = summary.get("lmdb_jpeg_cpu_efficiency")
        if e:
            lines.append(f"        CPU per image ({e['best']['system']} {e['best']['setting']}): "
                         f"{e['cpu_us_per_image']:.0f} us against the tight loop's "
                         f"{e['ceiling_cpu_us_per_image']:.0f} us = {e['ratio']:.2f} "
                         "(less sensitive than images/s to other load)")
    s = summary.get("lmdb_jpeg_vs_baseline")
    if s:
        lines.append(line(f"lmdb-jpeg best = {s['ratio']:.1f} x the ImageFolder baseline's best",
                          ">= 8", s["ratio"] >= 8))
    for enc in ENCODINGS:
        s = summary.get(f"hdf5_vs_lmdb_{enc}")
        if s:
            lines.append(line(f"hdf5-{enc} best = {s['ratio']:.2f} x lmdb-{enc} best",
                              "within 10 %", s["ratio"] >= 0.9))
    s = summary.get("raw_vs_jpeg")
    if s:
        lines.append(line(f"raw best = {s['ratio']:.1f} x jpeg best", ">= 3", s["ratio"] >= 3))
    for key, what in (("recipe_decode_vs_random_crop", "recipe at decode = {:.2f} x the plain "
                       "random crop"),
                      ("recipe_decode_vs_transform", "recipe at decode = {:.2f} x the recipe as a "
                       "per-sample transform"),
                      ("recipe_decode_vs_imagefolder", "recipe at decode = {:.2f} x ImageFolder "
                       "with the recipe"),
                      ("default_collate_vs_collate", "random crop without collate_fn (the "
                       "default collate) = {:.2f} x with shardkit.collate")):
        s = summary.get(key)
        if s:
            text = (what.format(s["ratio"]) + f" ({s['setting']}: {s['images_per_s']:.0f} "
                    f"against {s['other_images_per_s']:.0f} images/s)")
            lines.append(line(text, f">= {s['target']:g}", s["ratio"] >= s["target"])
                         if s.get("target") else text)
    s = summary.get("data_wait")
    if s:
        parts = [f"{k} {v['share']:.0%} ({v['setting']})" for k, v in s.items()
                 if v and v.get("share") is not None]
        lines.append("data wait at each system's fastest setting: " + ", ".join(parts))
        least = [f"{k} {v['share']:.0%} ({v['setting']})" for k, v in
                 summary.get("least_wait", {}).items()]
        if least:
            lines.append("least data wait per system: " + ", ".join(least))
    lines += packbench.lines(summary.get("pack", []), targets)
    return lines


def recommend(runs: list[Run], args: argparse.Namespace, work: str) -> str:
    """Paste-able DataLoader code: for the fastest setting with the fewest workers of the first
    store measured, and for the fastest way measured to run the training recipe."""
    parts = [_recommend_store(runs, args), _recommend_recipe(runs, args)]
    return "\n\n".join(p for p in parts if p)


def _loader_code(workers: int, threads: int, prefetch: int) -> list[str]:
    if threads:
        return [f"loader = DataLoader(dataset, batch_size={BATCH}, shuffle=True, num_workers=0,",
                "                    collate_fn=collate, pin_memory=torch.cuda.is_available())",
                "# decode threads run in the main process: if your training step needs the "
                "CPU, use worker processes instead"]
    lines = [f"loader = DataLoader(dataset, batch_size={BATCH}, shuffle=True, "
             f"num_workers={workers},"]
    if workers > 0:
        lines += [f"                    prefetch_factor={prefetch}, "
                  "persistent_workers=True, worker_init_fn=worker_init_fn,"]
    return lines + ["                    collate_fn=collate, pin_memory=torch.cuda.is_available())"]


def _recommend_store(runs: list[Run], args: argparse.Namespace) -> str:
    stores = [s.split("/")[0] for s in args.systems if store_of(s) and s not in RECIPE_SYSTEMS]
    if not stores:
        return "--recommend: no ShardDataset system was measured"
    store = stores[0]
    mine = [r for r in runs if r.system.split("/")[0] == store]
    best = max(r.images_per_s for r in mine)
    good = [r for r in mine if r.images_per_s >= (1 - TIE) * best]
    # Fewest processes first (threads run in the main process), then fewest threads.
    pick = min(good, key=lambda r: (r.num_workers, r.threads, -r.images_per_s))
    fast = "" if args.exact_decode else ", fast_decode=True"
    lines = [f"# shardkit bench --recommend: {store}, fastest within {TIE:.0%} with the fewest "
             f"workers: {pick.setting}, {pick.images_per_s:.0f} images/s "
             f"(best measured {best:.0f})",
             "import torch",
             "from torch.utils.data import DataLoader",
             "from shardkit import ShardDataset, collate, worker_init_fn",
             "",
             f"dataset = ShardDataset(\"YOUR_STORE\", crop={CROP}, crop_mode=\"random\"{fast}"
             + (f", threads={pick.threads})" if pick.mode == "threads" else ")")]
    return "\n".join(lines + _loader_code(pick.num_workers, pick.threads, args.prefetch))


def _recommend_recipe(runs: list[Run], args: argparse.Namespace) -> str | None:
    """The training recipe: at decode when that measured fastest, else what was faster."""
    measured = [b for b in (_best(runs, s) for s in ("recipe-decode", "recipe-transform",
                                                     "recipe-imagefolder")) if b]
    if not any(r.system != "recipe-imagefolder" for r in measured):
        return None
    pick = max(measured, key=lambda r: r.images_per_s)
    others = ", ".join(f"{r.system} {r.images_per_s:.0f}" for r in measured if r is not pick)
    lines = [f"# shardkit bench --recommend: training, RandomResizedCrop({CROP}) + "
             f"RandomHorizontalFlip(): fastest measured {pick.system} {pick.setting}, "
             f"{pick.images_per_s:.0f} images/s" + (f" ({others})" if others else "")]
    if pick.system == "recipe-imagefolder":
        return "\n".join(lines + ["# ImageFolder was the fastest here: keep it"])
    fast = "" if args.exact_decode else ", fast_decode=True"
    lines += ["import torch", "from torch.utils.data import DataLoader",
              "from shardkit import ShardDataset, collate, normalize, worker_init_fn"]
    if pick.system == "recipe-decode":
        lines += ["", f"dataset = ShardDataset(\"YOUR_STORE\", crop={CROP}, "
                      f"crop_mode=\"random_resized\", flip=0.5{fast})"]
    else:
        lines += ["from torchvision.transforms import v2", "",
                  f"recipe = v2.Compose([v2.RandomResizedCrop({CROP}, antialias=True), "
                  "v2.RandomHorizontalFlip()])",
                  f"dataset = ShardDataset(\"YOUR_STORE\", transform=recipe{fast})"]
    return "\n".join(lines + _loader_code(pick.num_workers, 0, args.prefetch) + [
        "# per batch, on the GPU: images = normalize(images.cuda(non_blocking=True), mean, std)"])


def plot(runs: list[Run], ceilings: dict[str, dict], path: str, step_ms: float = 0.0,
         step_cpu: bool = False) -> str | None:
    """images/s against num_workers (or threads) per system; returns a note if skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(10, 5))
    for system in dict.fromkeys(r.system for r in runs):
        mine = [r for r in runs if r.system == system]
        xs = [r.threads if r.mode == "threads" else r.num_workers for r in mine]
        label = system + (" (x = threads, num_workers=0)" if mine[0].mode == "threads" else "")
        recipe = system in RECIPE_SYSTEMS
        ax.plot(xs, [r.images_per_s for r in mine], marker="s" if recipe else "o",
                markersize=8 if recipe else 6,
                linestyle="-." if recipe else "--" if mine[0].mode == "threads" else "-",
                label=label)
    c = ceilings.get("jpeg")
    if c:
        ax.axhline(c["images_per_s"], color="grey", linestyle=":",
                   label=f"jpeg decode ceiling x {c['cores']} cores")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("num_workers (threads for /threads systems)")
    ax.set_ylabel("images/s")
    ax.set_yscale("log")
    title = (f"DataLoader throughput, batch {BATCH}, uint8 {CROP}x{CROP} centre crops\n"
             f"(recipe-*: RandomResizedCrop({CROP}) + flip; random-crop: RandomCrop({CROP}))")
    if step_ms:
        title += f"\nwith a {step_ms:g} ms {'CPU' if step_cpu else 'sleeping'} step per batch"
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside: no overlap
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


# -- worker memory over a large store ----------------------------------------------------------

def _pack_tiny(out: str, count: int, side: int, fmt: str) -> None:
    """A one-file store of ``count`` raw side x side records, via the packer's own builder."""
    from ..packing.packer import PackSettings, Plan, ShardBuilder

    classes = [f"c{i}" for i in range(10)]
    plan = Plan(root=os.path.dirname(out), classes=classes,
                class_to_idx={c: i for i, c in enumerate(classes)},
                paths=[os.path.join(os.path.dirname(out), classes[i % 10], f"{i:08d}.raw")
                       for i in range(count)],
                labels=[i % 10 for i in range(count)], bounds=[0, count],
                settings=PackSettings(size=0, encoding="raw", format=fmt), sharded=False)
    builder = ShardBuilder(plan, 0, out, strict=False)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (256, side, side, 3), dtype=np.uint8)
    records = [p.tobytes() for p in pixels]
    for i in range(count):
        builder.add(i, (records[i % 256], side, side, None))
    builder.finish("single")


def memory_main(args: argparse.Namespace) -> int:
    """Pack N tiny records (in a child process, so the parent holds no per-record objects),
    then read them all through a DataLoader and report each worker's memory growth."""
    count = args.memory_records
    workers = [w for w in (args.workers_list or [2]) if w > 0] or [2]
    formats = sorted({store_of(s).split("-")[0] for s in args.systems if store_of(s)},
                     key=FORMATS.index) or list(FORMATS)
    work = args.work_dir or tempfile.mkdtemp(prefix="shardkit-mem-")
    os.makedirs(work, exist_ok=True)
    results = []
    try:
        for fmt in formats:
            path = os.path.join(work, f"tiny-{count}" + (".lmdb" if fmt == "lmdb" else ".h5"))
            if not os.path.exists(path):
                t0 = time.perf_counter()
                ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux")
                                                  else "spawn")
                proc = ctx.Process(target=_pack_tiny, args=(path, count, 4, fmt))
                proc.start()
                proc.join()
                if proc.exitcode != 0:
                    print("shardkit bench: error: packing the tiny store failed", file=sys.stderr)
                    return 1
                _log(f"packed {count} tiny records ({fmt}) in {time.perf_counter() - t0:.1f} s")
            for w in workers:
                results.append(_memory_pass(path, fmt, count, w, args.seed))
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "memory.json"), "w") as f:
            json.dump({"command": _command(args),
                       "machine": machine_info(), "results": results}, f, indent=1)
        worst = max((r["max_private_dirty_growth_mb"] for r in results
                     if r["max_private_dirty_growth_mb"] is not None), default=None)
        if worst is not None:
            print(f"worker Private_Dirty growth over a full pass: at most +{worst:.2f} MB"
                  + (f" (target < 5 MB: {'met' if worst < 5 else 'NOT met'})"
                     if args.targets else ""))
        return 0
    finally:
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _memory_pass(path: str, fmt: str, count: int, w: int, seed: int) -> dict[str, Any]:
    """One shuffled pass with ``w`` workers; worker memory after a few batches and at the end."""
    import torch
    from torch.utils.data import DataLoader

    from ..dataset import ShardDataset, collate, worker_init_fn

    loader = DataLoader(ShardDataset(path, crop=4), batch_size=256, shuffle=True, num_workers=w,
                        persistent_workers=True, collate_fn=collate, worker_init_fn=worker_init_fn,
                        generator=torch.Generator().manual_seed(seed))
    it = iter(loader)
    n = 0
    for _ in range(min(20, len(loader) // 4)):  # past start-up: imports, store, first buffers
        n += len(next(it)[1])
    before = {pid: memory_of(pid) for pid in _worker_pids(loader)}
    t0 = time.perf_counter()
    for _, labels in it:
        n += len(labels)
    seconds = time.perf_counter() - t0
    after = {pid: memory_of(pid) for pid in _worker_pids(loader)}
    _shutdown(loader)
    mem = _memory_report(before, after)
    growth = [p["private_dirty_growth_mb"] for p in mem["processes"]
              if p.get("private_dirty_growth_mb") is not None]
    result = {"format": fmt, "num_workers": w, "records": count, "images_read": n,
              "seconds": seconds, "memory": mem,
              "max_private_dirty_growth_mb": max(growth) if growth else None}
    lines = [f"{fmt}, {count} records, num_workers={w}: one pass in {seconds:.1f} s"]
    for p in mem["processes"]:
        lines.append(f"  worker {p['pid']}: Private_Dirty {_mb(p['private_dirty_mb'])} MB "
                     f"({_signed(p.get('private_dirty_growth_mb'))}), USS {_mb(p['uss_mb'])} MB "
                     f"({_signed(p.get('uss_growth_mb'))}), PSS {_mb(p['pss_mb'])} MB")
    print("\n".join(lines), flush=True)
    return result


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


if __name__ == "__main__":
    sys.exit(main())
