"""Shared fixtures: generated source folders and stores packed from them, made once per session.

The plain functions behind them live in the ``helpers`` package (tests/helpers/), so other test
modules (and scripts) can call them directly.
"""

from __future__ import annotations

import functools
import pathlib
import re
import signal

import pytest
from helpers import QuirkyFolder, image_tree, make_quirky_folder

from shardkit.codec import ENCODINGS
from shardkit.formats import FORMATS
from shardkit.formats import SUFFIXES as SUFFIX


@pytest.fixture(scope="session")
def quirky(tmp_path_factory) -> QuirkyFolder:
    """The quirky ImageFolder tree (see ``helpers.make_quirky_folder``); treat as read-only."""
    return make_quirky_folder(str(tmp_path_factory.mktemp("quirky") / "src"))


@pytest.fixture(scope="session")
def pack_quirky(quirky, tmp_path_factory):
    """``pack_quirky(fmt, encoding="jpeg", size=256)`` -> path of the quirky folder packed once."""
    import shardkit

    cache: dict[tuple, str] = {}
    base = tmp_path_factory.mktemp("quirky-stores")

    def get(fmt: str, encoding: str = "jpeg", size: int = 256) -> str:
        key = (fmt, encoding, size)
        if key not in cache:
            out = str(base / f"quirky-{encoding}-{size}{SUFFIX[fmt]}")
            shardkit.pack(quirky.root, out, format=fmt, encoding=encoding, size=size, workers=1,
                          allow_empty=True, progress=False)
            cache[key] = out
        return cache[key]

    return get


@pytest.fixture(scope="session", params=[(f, e) for e in ENCODINGS for f in FORMATS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def quirky_store(request, pack_quirky) -> str:
    """The quirky folder packed at size 256, for every format x encoding."""
    fmt, encoding = request.param
    return pack_quirky(fmt, encoding)


@pytest.fixture(scope="session")
def photo_src(tmp_path_factory) -> tuple[str, list[tuple[str, int]]]:
    """(root, [(relpath, label)]) of 64 distinct small photo-like JPEGs in 4 classes."""
    root = str(tmp_path_factory.mktemp("photos") / "src")
    return root, image_tree(root, classes=4, per_class=16, seed=1)


@pytest.fixture(scope="session")
def pack_photos(photo_src, tmp_path_factory):
    """``pack_photos(fmt, encoding="jpeg")`` -> the photo folder packed once per combination."""
    import shardkit

    cache: dict[tuple, str] = {}
    base = tmp_path_factory.mktemp("photo-stores")

    def get(fmt: str, encoding: str = "jpeg") -> str:
        if (fmt, encoding) not in cache:
            out = str(base / f"photos-{encoding}{SUFFIX[fmt]}")
            shardkit.pack(photo_src[0], out, format=fmt, encoding=encoding, size=256,
                          workers=1, progress=False)
            cache[fmt, encoding] = out
        return cache[fmt, encoding]

    return get


@pytest.fixture(scope="session", params=FORMATS)
def photo_store(request, pack_photos) -> str:
    """The photo folder packed as JPEG records, in each format."""
    return pack_photos(request.param)


def _side_python(env_var: str, venv: str, script: str) -> str:
    """The interpreter of a side environment that CI builds (``scripts/<script>``): skipped where
    it is missing, except under CI (env ``CI`` set), where a missing one is a failure."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    python = os.environ.get(env_var) or os.path.join(root, venv, "bin", "python")
    if not os.path.exists(python):
        message = f"no {venv} environment at {python} (run scripts/{script})"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI builds it")
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def tv_python() -> str:
    """torch 2.14.1 + torchvision 0.29.1 with shardkit installed (``.venv-tv``)."""
    return _side_python("SHARDKIT_TV_PYTHON", ".venv-tv", "torchvision_venv.sh")


@pytest.fixture(scope="session")
def simd_python() -> str:
    """pillow-simd with shardkit installed (``.venv-simd``)."""
    return _side_python("SHARDKIT_SIMD_PYTHON", ".venv-simd", "pillow_simd_venv.sh")


@pytest.fixture(autouse=True)
def sigint_not_ignored():
    """Each test starts with Ctrl-C handled. A library run in the test process that leaves
    SIGINT ignored (seen in the full suite, not located: not shardkit's packers, which ignore it
    only in their worker processes) would make every pack a later test starts inherit the
    ignored SIGINT, so the Ctrl-C tests hung until their timeout instead of testing the packer."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


# What in a test module's source starts a thread that lives as long as the process: an S3 server
# read through s3fs (fsspec's IO loop, "fsspecIO": fsspec cannot stop it) or a Dask client in this
# process (distributed's offload pool, "Dask-Offload"). A single test that does so is marked
# ``leaves_threads`` instead.
_PROCESS_THREADS = re.compile(r'helpers\.s3server|engine="dask"|dask_cluster|distributed\.Client')


@functools.lru_cache
def _module_leaves_threads(path: pathlib.Path) -> bool:
    return "/tests/remote/" in path.as_posix() or bool(_PROCESS_THREADS.search(path.read_text()))


def pytest_configure(config: pytest.Config) -> None:
    """No tqdm monitor thread in the test process: it outlives its bars (the libraries' bars too:
    Hugging Face datasets', webdataset's), and the packs of every later test would spawn their
    workers. shardkit's own bars never start one (tests/test_progress.py)."""
    import tqdm

    tqdm.tqdm.monitor_interval = 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that leave a thread running in the test process run last, in their order. The
    packer forks its encoding workers only in a process with no other Python thread (else it
    spawns them, each importing torch again): without this, every in-process pack after the
    first such test (most of the suite) tested the spawn path only, at about 2 s of CPU a
    worker."""
    items.sort(key=lambda item: item.get_closest_marker("leaves_threads") is not None
               or _module_leaves_threads(item.path))
