"""The machine a benchmark ran on, and per-process CPU time and memory from /proc."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from ..packing.workers import default_workers
from .pack import pil_description


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
        "cpu_model": model, "cores": default_workers(), "cpu_count": os.cpu_count(),
        "memory_bytes": memory, "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "versions": {
            "python": platform.python_version(), "shardkit": shardkit.__version__,
            "torch": _version("torch"), "torchvision": _version("torchvision"),
            "numpy": _version("numpy"), "pil": pil_description(),
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


def worker_pids(loader: Any) -> list[int]:
    it = getattr(loader, "_iterator", None)
    return [w.pid for w in getattr(it, "_workers", []) or [] if w.pid is not None]


def memory_report(before: dict[int, dict], after: dict[int, dict]) -> dict[str, Any]:
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


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)
