"""The throughput benchmark (``shardkit bench`` / benchmarks/throughput.py) and the pooled batch
buffers of the read path it measures.

Correctness only, never timings: every system must deliver the same pixels and labels (the
ImageFolder baseline resizes the originals itself, so it must match the raw store closely), the
JSON must hold every figure the issue asks for, and a pooled batch buffer must never be
overwritten while anything can still read it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardkit import ShardDataset, batchpool, benchmark, collate, packbench, worker_init_fn
from shardkit.packer import pack
from shardkit.sample import make_sample

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS = ["imagefolder", "lmdb-jpeg", "hdf5-jpeg", "lmdb-raw", "hdf5-raw", "lmdb-jpeg/threads"]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> str:
    """40 photo-like JPEGs in 4 classes (in-process: no pool start-up)."""
    root = str(tmp_path_factory.mktemp("bench") / "sample")
    make_sample(root, 40, 4, seed=3, workers=1)
    return root


@pytest.fixture(scope="module")
def bench_run(sample, tmp_path_factory):
    """One tiny benchmark run over every system, num_workers 0 and 2, one timed epoch."""
    out = str(tmp_path_factory.mktemp("bench-out"))
    work = str(tmp_path_factory.mktemp("bench-work"))
    argv = [sample, "--systems", ",".join(SYSTEMS), "--workers-list", "0,2",
            "--threads-list", "2", "--epochs", "1", "--min-seconds", "0", "--pack-workers", "0",
            "--pack-sample", "4", "--simd-python", sys.executable,
            "--out-dir", out, "--work-dir", work, "--recommend"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = benchmark.main(argv)
    return rc, out, work, printed.getvalue()


def test_bench_writes_table_json_and_plot(bench_run):
    rc, out, _, printed = bench_run
    assert rc == 0
    with open(os.path.join(out, "throughput.json")) as f:
        report = json.load(f)
    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["cpu_model"]
    versions = machine["versions"]
    for name in ("python", "torch", "numpy", "simplejpeg", "lmdb", "h5py"):
        assert versions[name], name
    assert versions["pil"]["name"] in ("Pillow", "pillow-simd")
    assert isinstance(versions["pil"]["simd"], bool)
    assert report["settings"]["batch_size"] == 64 and report["settings"]["crop"] == 224
    assert report["input"]["images"] == 40
    assert sorted(p["system"] for p in report["pack"]["stores"]) == \
        ["hdf5-jpeg", "hdf5-raw", "lmdb-jpeg", "lmdb-raw"]
    # Pack-speed figures: this interpreter (reusing the timed lmdb-jpeg pack) and the one given
    # as --simd-python (here the same interpreter again, run as a child process).
    figures = report["pack"]["figures"]
    assert len(figures) == 2
    for f in figures:
        assert f["pil"]["name"] in ("Pillow", "pillow-simd")
        assert f["pack"]["images"] == 40 and f["pack"]["images_per_s"] > 0
        assert set(f["one_process"]) == {"shardkit_path", "naive_pil"}
        for rate in f["one_process"].values():
            assert rate["images"] == 4 and rate["images_per_s"] > 0
    assert set(report["ceilings"]) == {"jpeg", "raw"}
    for c in report["ceilings"].values():
        assert c["images"] == 40 and c["single_core_images_per_s"] > 0
        assert c["images_per_s"] == pytest.approx(c["single_core_images_per_s"] * c["cores"])

    runs = report["runs"]
    expected = {(s, "workers=0") for s in SYSTEMS[:-1]} | {(s, "workers=2") for s in SYSTEMS[:-1]}
    expected.add(("lmdb-jpeg/threads", "threads=2"))
    assert {(r["system"], r["setting"]) for r in runs} == expected
    for r in runs:
        assert r["images"] == 40 and r["images_per_s"] > 0 and r["mb_per_s"] > 0
        assert len(r["epochs_s"]) == 1
        procs = r["memory"]["processes"]
        # Worker runs report each worker; in-process runs report the main process.
        assert len(procs) == (r["num_workers"] or 1)
        for p in procs:
            assert p["private_dirty_mb"] is not None and p["private_dirty_mb"] >= 0
            assert "private_dirty_growth_mb" in p and p["uss_mb"] is not None
        assert r["data_wait_share"] is None  # no --step-ms
    summary = report["summary"]
    for key in ("lmdb_jpeg_vs_ceiling", "lmdb_jpeg_vs_baseline", "hdf5_vs_lmdb_jpeg",
                "hdf5_vs_lmdb_raw", "raw_vs_jpeg"):
        assert summary[key]["ratio"] > 0, key
    assert len(summary["pack"]) == 2
    for s in summary["pack"]:
        assert s["pack_vs_ceiling"] > 0 and s["path_vs_naive"] > 0
        assert s["pack_vs_ceiling"] == pytest.approx(
            s["pack_images_per_s"] / (s["one_process_images_per_s"] * s["cores"]))

    with open(os.path.join(out, "throughput.txt")) as f:
        table = f.read()
    for system in SYSTEMS:
        assert system in table
    assert "decode ceiling jpeg" in table and "same output: yes" in table
    assert table.count("target: shardkit pack = ") == 2 and "x the naive PIL loop" in table
    with open(os.path.join(out, "throughput.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "loader = DataLoader(dataset, batch_size=64" in printed


def test_every_system_and_setting_delivers_the_same_pixels(bench_run):
    """Digests of every image each run delivered: equal within an encoding (every store, every
    num_workers, threads, the tight decode loop) and the labels equal everywhere."""
    _, out, _, _ = bench_run
    with open(os.path.join(out, "throughput.json")) as f:
        report = json.load(f)
    assert report["checks"]["ok"], report["checks"]["problems"]
    by_encoding: dict[str, set[str]] = {}
    labels = set()
    for r in report["runs"]:
        enc = "baseline" if r["system"] == "imagefolder" else r["system"].split("/")[0][5:]
        by_encoding.setdefault(enc, set()).add(r["digest"])
        labels.add(r["labels_digest"])
    for enc in ("jpeg", "raw"):
        by_encoding[enc].add(report["ceilings"][enc]["digest"])
        labels.add(report["ceilings"][enc]["labels_digest"])
    assert all(len(d) == 1 for d in by_encoding.values()), by_encoding
    assert len(labels) == 1
    assert by_encoding["jpeg"] != by_encoding["raw"]  # the check does look at pixels


def test_consistency_check_flags_a_differing_system():
    def run(system: str, digest: str, labels: str = "l") -> benchmark.Run:
        return benchmark.Run(system, "workers", 0, 0, None, [1.0], 1, 1.0, 1.0, 1.0, None, 1.0,
                             None, digest, labels)

    ok = benchmark.consistency([run("lmdb-jpeg", "a"), run("hdf5-jpeg", "a")], {})
    assert ok["ok"]
    bad = benchmark.consistency([run("lmdb-jpeg", "a"), run("hdf5-jpeg", "b")], {})
    assert not bad["ok"] and "jpeg" in bad["problems"][0]
    bad_labels = benchmark.consistency([run("lmdb-raw", "a", "x"), run("imagefolder", "c", "y")],
                                       {})
    assert not bad_labels["ok"]


def test_baseline_crops_match_the_raw_store(sample, bench_run):
    """The ImageFolder baseline (PIL bilinear from the original) and the raw store (bicubic at
    pack time) give nearly the same centre crops, image for image; a one-image shift does not."""
    _, _, work, _ = bench_run
    base = benchmark.PilImageFolder(sample)
    raw = ShardDataset(os.path.join(work, "lmdb-raw.lmdb"), crop=224)
    shard = raw.store.shard(0)
    close, shifted = [], []
    for i in range(len(raw)):
        if min(int(shard.heights[i]), int(shard.widths[i])) < 256:
            continue  # the store never upscales; torchvision's Resize does
        b, label = base[i]
        r, stored_label = raw[i]
        assert label == stored_label and b.shape == r.shape == (3, 224, 224)
        assert b.dtype == r.dtype == torch.uint8
        close.append((b.float() - r.float()).abs().mean().item())
        shifted.append((base[(i + 1) % len(raw)][0].float() - r.float()).abs().mean().item())
    assert len(close) >= 20
    assert max(close) < 2.0
    assert min(shifted) > 10.0


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_pooled_batches_are_never_overwritten_while_in_use(bench_run, context):
    """Worker batches live in reusable shared buffers: whatever the consumer keeps (batches,
    views, bare storages, numpy arrays) must keep its pixels while the workers go on."""
    _, _, work, _ = bench_run
    path = os.path.join(work, "lmdb-jpeg.lmdb")
    # 20 batches of 2: each worker makes 10, more than it keeps buffers for.
    ref = [(x.clone(), y.clone()) for x, y in
           DataLoader(ShardDataset(path, crop=224), batch_size=2, collate_fn=collate)]
    assert len(ref) > 2 * batchpool.MAX_SLOTS[True]
    loader = DataLoader(ShardDataset(path, crop=224), batch_size=2, num_workers=2,
                        collate_fn=collate, worker_init_fn=worker_init_fn,
                        persistent_workers=True, multiprocessing_context=context)
    for _ in range(2):
        held = list(loader)  # all at once: more batches than buffers
        assert len(held) == len(ref)
        for (x, y), (rx, ry) in zip(held, ref):
            assert torch.equal(x, rx) and torch.equal(y, ry)
        del held
        storages, arrays = [], []
        for x, y in loader:  # drop the batch, keep only its storage / a numpy view / a slice
            storages.append((x.untyped_storage(), x.shape, x.stride(), x.storage_offset()))
            arrays.append((x.numpy(), x[:2]))
        for (st, shape, stride, offset), (a, part), (rx, _) in zip(storages, arrays, ref):
            rebuilt = torch.tensor([], dtype=torch.uint8).set_(st, offset, shape, stride)
            assert torch.equal(rebuilt, rx)
            assert np.array_equal(a, rx.numpy()) and torch.equal(part, rx[:2])
        streamed = [(x.clone(), y.clone()) for x, y in loader]  # buffers reused at once
        assert all(torch.equal(x, rx) for (x, _), (rx, _) in zip(streamed, ref))


def test_threads_give_the_same_batches(bench_run):
    _, _, work, _ = bench_run
    path = os.path.join(work, "hdf5-jpeg.h5")
    ref = [(x.clone(), y) for x, y in
           DataLoader(ShardDataset(path, crop=224), batch_size=16, collate_fn=collate)]
    for threads in (2, 3):
        got = list(DataLoader(ShardDataset(path, crop=224, threads=threads), batch_size=16,
                              collate_fn=collate))  # kept: in-process buffers must not be reused
        assert len(got) == len(ref)
        for (x, y), (rx, ry) in zip(got, ref):
            assert torch.equal(x, rx) and torch.equal(y, ry)


def test_memory_mode_reports_worker_growth(tmp_path):
    out = str(tmp_path / "out")
    rc = benchmark.main(["--memory-records", "3000", "--systems", "lmdb-jpeg",
                         "--workers-list", "2", "--out-dir", out])
    assert rc == 0
    with open(os.path.join(out, "memory.json")) as f:
        report = json.load(f)
    (result,) = report["results"]
    assert result["format"] == "lmdb" and result["records"] == 3000
    assert result["images_read"] == 3000
    assert len(result["memory"]["processes"]) == 2
    assert result["max_private_dirty_growth_mb"] is not None


def test_cli_and_script_entry_points(sample, tmp_path):
    """``shardkit bench`` and ``python benchmarks/throughput.py`` run the same benchmark."""
    env = dict(os.environ, PYTHONPATH=REPO)
    for cmd in ([sys.executable, "-m", "shardkit.cli", "bench"],
                [sys.executable, os.path.join(REPO, "benchmarks", "throughput.py")]):
        out = str(tmp_path / os.path.basename(cmd[-1]))
        proc = subprocess.run(cmd + [sample, "--systems", "lmdb-raw", "--workers-list", "0",
                                     "--epochs", "1", "--min-seconds", "0", "--pack-workers", "0",
                                     "--pack-sample", "0",
                                     "--out-dir", out],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "lmdb-raw" in proc.stdout and os.path.exists(os.path.join(out, "throughput.json"))
    bad = subprocess.run([sys.executable, "-m", "shardkit.cli", "bench"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "--sample" in bad.stderr


def test_pack_one_process_figures_use_real_sources(sample):
    figures = packbench.one_process_rates(sample, 3)
    for name in ("shardkit_path", "naive_pil"):
        assert figures[name]["images"] == 3 and figures[name]["images_per_s"] > 0


def test_sample_looks_like_photos(sample):
    """Sizes in the issue's range and JPEGs that are not flat colour."""
    from PIL import Image

    sizes = []
    for root, _, files in os.walk(sample):
        for name in files:
            with Image.open(os.path.join(root, name)) as im:
                sizes.append(im.size)
                pixels = np.asarray(im.convert("L"), dtype=np.float32)
            assert pixels.std() > 10  # structure, not a flat colour
    assert len(sizes) == 40
    assert all(200 <= min(s) and max(s) <= 2600 for s in sizes)
    assert 400 <= np.mean([max(s) for s in sizes]) <= 650


def test_pack_then_bench_on_an_existing_store_folder(sample, tmp_path):
    """--reuse skips packing when the stores are already there."""
    work = tmp_path / "work"
    work.mkdir()
    pack(sample, str(work / "lmdb-jpeg.lmdb"), workers=0, progress=False)
    out = str(tmp_path / "out")
    rc = benchmark.main([sample, "--systems", "lmdb-jpeg", "--workers-list", "0", "--epochs", "1",
                         "--min-seconds", "0.5", "--no-pack-figures", "--work-dir", str(work),
                         "--reuse", "--out-dir", out])
    assert rc == 0
    with open(os.path.join(out, "throughput.json")) as f:
        report = json.load(f)
    assert report["pack"]["stores"] == []
    (run,) = report["runs"]
    assert run["images"] == 40
    # --min-seconds: more timed epochs than --epochs until they add up to half a second
    assert len(run["epochs_s"]) > 1 or run["epochs_s"][0] >= 0.5
    assert sum(run["epochs_s"]) >= 0.5 or len(run["epochs_s"]) == 50


def test_step_reports_data_wait_and_skips_throughput_targets(sample, tmp_path):
    """--step-ms: every run reports its share of time waiting for data; the throughput targets,
    capped by the step, are not judged."""
    out = str(tmp_path / "out")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = benchmark.main([sample, "--systems", "lmdb-raw,lmdb-raw/threads", "--workers-list",
                             "0,2", "--threads-list", "2", "--epochs", "1", "--min-seconds", "0",
                             "--pack-workers", "0", "--pack-sample", "0", "--step-ms", "5",
                             "--out-dir", out])
    assert rc == 0
    with open(os.path.join(out, "throughput.json")) as f:
        report = json.load(f)
    for r in report["runs"]:
        assert 0.0 <= r["data_wait_share"] < 1.0
        # 40 images in batches of 64: one batch and one 5 ms step per epoch at least
        assert r["epochs_s"][0] >= 0.005
    assert set(report["summary"]["data_wait"]) == {"lmdb-raw", "lmdb-raw/threads"}
    table = printed.getvalue()
    assert "throughput targets not checked" in table and "data wait at each" in table
