"""benchmarks/gpu_node.py: the GPU-node script runs end to end on the CPU (``--dry-run``): it
writes and packs its images, trains the tiny model from each loader (the thread engine, the
process engine, ImageFolder) and writes the table and the JSON it is read from. No GPU needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dry_run_trains_from_every_loader_and_writes_the_table(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_node.py"),
                           "--dry-run", "--out-dir", str(out), "--work-dir",
                           str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "gpu_node.json").read_text())
    rows = report["results"]
    assert [(r["system"], r["setting"]) for r in rows] == [
        ("threads", "num_threads=2"), ("processes", "num_workers=2"),
        ("imagefolder", "num_workers=2")]
    for r in rows:
        assert r["images_per_s"] > 0 and r["note"] == "", r
        assert 0 <= r["data_wait"] <= 1, r
        assert r["peak_pss_mb"] > 0 and r["cpu_cores"] >= 0, r
        assert r["gpu_util"] is None, r  # no GPU: no reading, shown as "–"
    table = (out / "gpu_node.md").read_text()
    assert table.startswith("`python benchmarks/gpu_node.py --dry-run")
    assert table.count("\n| shardkit ") == 2 and "| torchvision ImageFolder" in table
    assert "\n| shardkit thread engine | num_threads=2 | " in table
