"""The ``shardkit`` command, run as a real subprocess: help, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import (flip_byte_in_file, jpeg_bytes, noise, one_line_error, rewrite_metadata,
                     run_cli, write_bytes)

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5"}


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory) -> str:
    """3 good images in 2 classes, plus one unusable file."""
    src = tmp_path_factory.mktemp("cli") / "src"
    rng = np.random.default_rng(5)
    for rel, (h, w) in {"cat/1.jpg": (40, 50), "cat/2.png": (30, 20), "dog/3.jpg": (300, 400)}.items():
        write_bytes(str(src / rel), jpeg_bytes(noise(rng, h, w)))
    write_bytes(str(src / "dog" / "broken.jpg"), b"\xff\xd8\xff\xe0 not really")
    return str(src)


def _pack(src: str, out: str) -> None:
    """Pack in-process (faster than the CLI; the CLI's own pack is tested separately)."""
    from shardkit.packing.api import pack

    pack(src, out, workers=1, progress=False)


# -- help, usage, exit codes ----------------------------------------------------------------------

@pytest.mark.parametrize("command", [[], ["pack"], ["info"], ["verify"], ["merge"], ["bench"]],
                         ids=lambda c: c[0] if c else "top")
def test_help_exits_zero(command):
    proc = run_cli(*command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout.lower()
    assert "Traceback" not in proc.stderr


def test_console_script_and_version():
    exe = shutil.which("shardkit", path=os.path.dirname(sys.executable))
    assert exe, "the shardkit console script is not installed next to this python"
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("shardkit ")
    proc = subprocess.run([exe, "pack", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--max-pixels" in proc.stdout


@pytest.mark.parametrize("args", [[], ["pack"], ["pack", "a"], ["frobnicate"],
                                  ["pack", "a", "b", "--size", "big"],
                                  ["pack", "a", "b", "--format", "zip"],
                                  ["pack", "a", "b", "--no-such-option"], ["info"]],
                         ids=lambda a: " ".join(a) or "none")
def test_usage_errors_exit_2(args):
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert "usage" in proc.stderr.lower() and "Traceback" not in proc.stderr


def test_program_ends_without_the_interpreter_teardown():
    """How the program ends once its command is done (``shardkit.cli_exit.end``, after
    ``main``): with the command's status, its atexit hooks run and its buffered output written,
    but without the interpreter's teardown (0.5-1 s once a pack has imported torch): an object
    left in a module is never finalized."""
    script = ("import atexit, sys\n"
              "from shardkit.cli_exit import end\n"
              "class Left:\n"
              "    def __del__(self, write=sys.stderr.write): write('finalized')\n"
              "left = Left()\n"
              "atexit.register(print, 'hook')\n"
              "print('buffered', end=' ')\n"  # stdout is a pipe: held in the buffer
              "end(3)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "buffered hook\n", "")


# -- pack -----------------------------------------------------------------------------------------

def test_pack_reports_skipped_and_writes_store(tiny_src, tmp_path):
    out = str(tmp_path / "s.lmdb")
    proc = run_cli("pack", tiny_src, out, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "packed 3 images" in proc.stderr
    assert "skipped 1 " in proc.stderr and "broken.jpg" in proc.stderr
    meta = json.loads(run_cli("info", out, "--json").stdout)
    assert meta["count"] == 3 and meta["skipped"] == 1


def test_pack_quirky_with_and_without_allow_empty(quirky, tmp_path):
    out = str(tmp_path / "q.h5")
    proc = run_cli("pack", quirky.root, out, "-q")
    assert proc.returncode == 1
    assert one_line_error(proc.stderr) and "delta" in proc.stderr and "--allow-empty" in proc.stderr
    assert os.listdir(tmp_path) == []
    proc = run_cli("pack", quirky.root, out, "--allow-empty", "-q", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert f"skipped {len(quirky.skipped)} unusable files" in proc.stderr
    for rel in quirky.skipped:
        assert os.path.basename(rel) in proc.stderr
    info = json.loads(run_cli("info", out, "--json").stdout)
    assert info["classes"] == quirky.classes and info["count"] == len(quirky.expect)


def test_pack_missing_src(tmp_path):
    proc = run_cli("pack", str(tmp_path / "nope"), str(tmp_path / "o.lmdb"), "-q")
    assert proc.returncode == 1
    assert one_line_error(proc.stderr) and "not found" in proc.stderr
    assert os.listdir(tmp_path) == []


def test_pack_existing_out(tiny_src, tmp_path):
    out = tmp_path / "o.lmdb"
    out.write_bytes(b"keep me")
    proc = run_cli("pack", tiny_src, str(out), "-q")
    assert proc.returncode == 1
    assert one_line_error(proc.stderr) and "--overwrite" in proc.stderr
    assert out.read_bytes() == b"keep me"
    proc = run_cli("pack", tiny_src, str(out), "-q", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert run_cli("verify", str(out), "-q").returncode == 0


def test_pack_strict(tiny_src, tmp_path):
    out = str(tmp_path / "o.h5")
    proc = run_cli("pack", tiny_src, out, "--strict", "-q", "--workers", "2")
    assert proc.returncode == 1
    assert one_line_error(proc.stderr) and "broken.jpg" in proc.stderr
    assert os.listdir(tmp_path) == []


def test_pack_options_reach_the_store(tiny_src, tmp_path):
    out = str(tmp_path / "o.store")
    proc = run_cli("pack", tiny_src, out, "--format", "hdf5", "--size", "32", "--quality", "70",
                   "--encoding", "raw", "--max-pixels", "50000", "-q")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(run_cli("info", out, "--json").stdout)
    assert (info["format"], info["size"], info["quality"], info["encoding"]) == \
        ("hdf5", 32, 70, "raw")
    assert info["count"] == 2  # 400x300 = 120000 pixels is over --max-pixels
    assert sorted(os.path.basename(s["path"]) for s in info["skipped_files"]) == \
        ["3.jpg", "broken.jpg"]


# -- info -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_info_text_and_json(tiny_src, tmp_path, fmt):
    out = str(tmp_path / f"o{SUFFIX[fmt]}")
    _pack(tiny_src, out)
    proc = run_cli("info", out, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["count"] == 3
    assert info["classes"] == ["cat", "dog"] and info["num_classes"] == 2
    assert info["encoding"] == "jpeg" and info["size"] == 256 and info["format"] == fmt
    assert info["bytes_on_disk"] == os.path.getsize(out)
    assert info["skipped"] == 1
    assert info["skipped_files"][0]["path"].endswith("broken.jpg")
    assert info["skipped_files"][0]["reason"]
    proc = run_cli("info", out)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for needle in ("records:    3", "cat, dog", "jpeg", "size 256", str(os.path.getsize(out)),
                   "skipped:    1", fmt):
        assert needle in text, needle


# -- verify ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_verify_good_and_flipped_byte(tiny_src, tmp_path, fmt):
    out = str(tmp_path / f"o{SUFFIX[fmt]}")
    _pack(tiny_src, out)
    proc = run_cli("verify", out, "-q")
    assert proc.returncode == 0, proc.stderr
    assert "3 records" in proc.stdout
    from shardkit import ShardDataset

    ds = ShardDataset(out, output="bytes")
    record = ds[2][0]  # the 300x400 -> 256x341 JPEG: a long record
    ds.close()
    flip_byte_in_file(out, record, len(record) // 2)
    proc = run_cli("verify", out, "-q")
    assert proc.returncode == 1
    assert "record 2" in proc.stderr and "Traceback" not in proc.stderr


# -- not a store, unknown version -----------------------------------------------------------------

def _random_file(path):
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8).tobytes())


def _foreign_lmdb(path):
    import lmdb

    env = lmdb.open(str(path), subdir=False, lock=False, map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"hello", b"world")
    env.close()


def _foreign_hdf5(path):
    import h5py

    with h5py.File(path, "w") as f:
        f["data"] = np.arange(10, dtype=np.uint8)


NOT_STORES = {
    "missing": (lambda p: None, "not found"),
    "random-bytes": (_random_file, "not a shardkit store"),
    "empty-file": (lambda p: p.write_bytes(b""), "not a shardkit store"),
    "folder-without-manifest": (lambda p: p.mkdir(), "manifest.json"),
    "foreign-lmdb": (_foreign_lmdb, "metadata"),
    "foreign-hdf5": (_foreign_hdf5, "metadata"),
}


@pytest.mark.parametrize("command", ["info", "verify"])
@pytest.mark.parametrize("kind", list(NOT_STORES))
def test_not_a_store(tmp_path, kind, command):
    make, needle = NOT_STORES[kind]
    path = tmp_path / "thing"
    make(path)
    proc = run_cli(command, str(path))
    assert proc.returncode == 1
    assert one_line_error(proc.stderr), proc.stderr
    assert needle in proc.stderr


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_unknown_format_version(tiny_src, tmp_path, fmt):
    out = str(tmp_path / f"o{SUFFIX[fmt]}")
    _pack(tiny_src, out)

    def bump(meta: dict) -> None:
        meta["format_version"] = 99

    rewrite_metadata(out, bump)
    for command in ("info", "verify"):
        proc = run_cli(command, out)
        assert proc.returncode == 1
        assert one_line_error(proc.stderr), proc.stderr
        assert "version 99" in proc.stderr and "not supported" in proc.stderr


def test_errors_do_not_print_tracebacks_for_damaged_metadata(tiny_src, tmp_path):
    out = str(tmp_path / "o.lmdb")
    _pack(tiny_src, out)

    def damage(meta: dict) -> None:
        meta["count"] = "many"

    rewrite_metadata(out, damage)
    proc = run_cli("info", out)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
