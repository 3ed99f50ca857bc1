"""This project's acceptance targets, judged from what ``shardkit bench`` wrote.

The library reports numbers (``throughput.json``, ``memory.json``); whether they meet the targets
the project set itself is this script's business, not a user's. ``benchmarks/throughput.py``
prints these lines after the benchmark; on an existing report:

    python benchmarks/targets.py benchmarks/results/throughput.json
    python benchmarks/targets.py benchmarks/results/memory.json
    python benchmarks/targets.py benchmarks/results/remote_latency_link.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Target:
    """A ratio of the report's summary that must reach ``minimum``."""

    key: str                       # the summary entry holding {"ratio": ...}
    minimum: float
    rule: str                      # how the target is stated
    text: Callable[[dict[str, Any]], str]  # the measured figure, from the summary entry


def _best(s: dict[str, Any]) -> str:
    b = s["best"]
    return (f"ShardDataset lmdb-jpeg best ({b['system']} {b['setting']}) = {s['ratio']:.2f} x "
            "cores x single-core ceiling (decode + crop copy)")


def _side_by_side(what: str) -> Callable[[dict[str, Any]], str]:
    return lambda s: (f"recipe at decode = {s['ratio']:.2f} x {what} ({s['setting']}: "
                      f"{s['images_per_s']:.0f} against {s['other_images_per_s']:.0f} images/s)")


#: The read-path targets: meaningless under ``--step-ms`` (every loader is capped by the step).
THROUGHPUT = (
    Target("lmdb_jpeg_vs_ceiling", 0.85, ">= 0.85", _best),
    Target("lmdb_jpeg_vs_baseline", 8.0, ">= 8",
           lambda s: f"lmdb-jpeg best = {s['ratio']:.1f} x the ImageFolder baseline's best"),
    *(Target(f"hdf5_vs_lmdb_{enc}", 0.9, "within 10 %",
             lambda s, enc=enc: f"hdf5-{enc} best = {s['ratio']:.2f} x lmdb-{enc} best")
      for enc in ("jpeg", "raw")),
    Target("raw_vs_jpeg", 3.0, ">= 3", lambda s: f"raw best = {s['ratio']:.1f} x jpeg best"),
    Target("recipe_decode_vs_random_crop", 0.75, ">= 0.75",
           _side_by_side("the plain random crop")),
    Target("recipe_decode_vs_transform", 1.5, ">= 1.5",
           _side_by_side("the recipe as a per-sample transform")),
)
#: Per interpreter's pack figures (``summary["pack"]``, one entry each).
PACK = (
    Target("pack_vs_ceiling", 0.8, ">= 0.8",
           lambda s: f"{s['pil']} {s['pil_version']}: shardkit pack = {s['ratio']:.2f} x cores "
                     "x one-process per-image rate"),
    Target("path_vs_naive", 2.0, ">= 2",
           lambda s: f"{s['pil']} {s['pil_version']}: per core, shardkit path = "
                     f"{s['ratio']:.2f} x the naive PIL loop"),
)
MEMORY_MB = 5.0  # worker Private_Dirty growth over a full pass of a 1M-record store
REMOTE_RTT = 1.5  # cold epoch at +100 ms RTT / at +0 ms, default read-ahead (at most)
REMOTE_LINK = 0.9  # shard bytes / epoch seconds / link rate, shaped link at +0 ms (at least)


def line(text: str, rule: str, ok: bool) -> str:
    return f"target: {text} ({rule}: {'met' if ok else 'NOT met'})"


def judge_throughput(report: dict[str, Any]) -> list[str]:
    """One line per target the report has figures for."""
    summary = report["summary"]
    out = []
    if not summary.get("data_wait"):
        for t in THROUGHPUT:
            s = summary.get(t.key)
            if s:
                out.append(line(t.text(s), t.rule, s["ratio"] >= t.minimum))
    for figures in summary.get("pack", []):
        for t in PACK:
            s = figures | {"ratio": figures[t.key]}
            out.append(line(t.text(s), t.rule, s["ratio"] >= t.minimum))
    return out


def judge_memory(report: dict[str, Any]) -> list[str]:
    growth = [r["max_private_dirty_growth_mb"] for r in report["results"]
              if r["max_private_dirty_growth_mb"] is not None]
    if not growth:
        return []
    worst = max(growth)
    return [line(f"worker Private_Dirty growth over a full pass: at most +{worst:.2f} MB",
                 f"< {MEMORY_MB:g} MB", worst < MEMORY_MB)]


def judge_remote(report: dict[str, Any]) -> list[str]:
    """``benchmarks/remote_latency.py``'s report: the rows of this tree (not a ``--baseline``)."""
    rows = {r["row"]: r for r in report["remote_latency"]["rows"] if r["code"] == "this tree"}
    out = []
    near, far = rows.get("RTT +0 ms, read-ahead default"), rows.get("RTT +100 ms, read-ahead "
                                                                      "default")
    if near and far:
        ratio = far["seconds"] / near["seconds"]
        out.append(line(f"cold epoch at +100 ms RTT = {ratio:.2f} x at +0 ms (default read-ahead)",
                        f"<= {REMOTE_RTT:g}", ratio <= REMOTE_RTT))
    for r in rows.values():
        if r["rate"] and r["rtt"] == 0:
            out.append(line(f"shaped link {r['rate'] / 1e6:g} MB/s, +0 ms: shard bytes / epoch "
                            f"seconds = {r['link_share']:.2f} of the link rate",
                            f">= {REMOTE_LINK:g}", r["link_share"] >= REMOTE_LINK))
    return out


def judge(report: dict[str, Any]) -> list[str]:
    """The target lines for a ``throughput.json``, ``memory.json`` or ``remote_latency`` report."""
    if "remote_latency" in report:
        return judge_remote(report)
    return judge_memory(report) if "results" in report else judge_throughput(report)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print("\n".join(judge(json.load(f))))
