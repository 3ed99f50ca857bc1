"""Packing errors a user gets as one line (no traceback), options refused before any work, and
what replacing a store or losing a worker does: each on real files, filesystems and processes."""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import all_records, image_tree, one_line_error, program_cmd, program_env, run_cli
import shardkit
from shardkit import ShardDataset
from shardkit.errors import PackError
from shardkit.packing.api import pack

from helpers.scaleout import partial_of, shard_digests


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("src") / "src")
    image_tree(root, classes=3, per_class=4, seed=2, pngs=1)
    return root


# -- OUT in a missing folder ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["lmdb", "hdf5", "folder"])
def test_out_in_a_missing_folder_creates_it(src, tmp_path, kind):
    """`shardkit pack SRC stores/train`: the missing folders are made, as `mkdir -p` would."""
    out = tmp_path / "stores" / "a" / {"lmdb": "out.lmdb", "hdf5": "out.h5", "folder": "out"}[kind]
    extra = ["--num-shards", "2"] if kind == "folder" else []
    proc = run_cli("pack", src, str(out), "--size", "16", "--workers", "1", "-q", *extra)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp_path / "stores" / "a") == [out.name]  # no partial left beside it
    assert len(ShardDataset(str(out))) == 12


def test_out_under_a_file_names_it(src, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(PackError, match=f"^cannot write .*: {tmp_path / 'f'} is not a folder"):
        pack(src, str(tmp_path / "f" / "new" / "out.lmdb"), workers=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["f"]


# -- options refused up front ---------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--engine", "dask"], "--engine dask needs a sharded OUT: give --shard-size or --num-shards"),
    (["--engine", "dask", "--scheduler", "tcp://127.0.0.1:1"], "--engine dask needs a sharded"),
    (["--scheduler", "tcp://127.0.0.1:1", "--num-shards", "2"], "--scheduler needs --engine dask"),
    (["--resume"], "--resume needs a sharded OUT"),
    (["--num-nodes", "2"], "--num-nodes needs a sharded OUT"),
    (["--engine", "dask", "--scheduler", "tcp://127.0.0.1:1", "--num-shards", "2", "--workers",
      "2"], "give --workers (local processes) or --scheduler (a running cluster's workers), "
     "not both"),
], ids=["dask", "dask-scheduler", "scheduler-local", "resume", "num-nodes", "workers-scheduler"])
def test_cli_refuses_options_before_any_work(tmp_path, args, message):
    """SRC does not exist: the refusal must come before discovery would notice."""
    proc = run_cli("pack", str(tmp_path / "no-src"), str(tmp_path / "out"), "-q", *args)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert message in proc.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs,message", [
    ({"engine": "no-such-engine"}, "`engine` must be 'local' or 'dask', not 'no-such-engine'"),
    ({"engine": "dask"}, "`engine='dask'` needs a sharded OUT: give `shard_size` or `num_shards`"),
    ({"scheduler": "tcp://127.0.0.1:1", "num_shards": 2}, "`scheduler` needs `engine='dask'`"),
    ({"resume": True}, "`resume=True` needs a sharded OUT"),
    ({"shard_size": 1 << 20, "num_shards": 2}, "give `shard_size` or `num_shards`, not both"),
    ({"engine": "dask", "scheduler": "tcp://127.0.0.1:1", "num_shards": 2, "workers": 1},
     "give `workers` (local processes) or `scheduler` (a running cluster's workers), not both"),
    ({"num_nodes": 2, "node_rank": 2, "num_shards": 2}, "`node_rank` must be in 0..`num_nodes`-1"),
    ({"size": -1}, "`size` must be >= 0 (0 keeps the original size)"),
    ({"quality": 0}, "`quality` must be between 1 and 100"),
    ({"quality": 101}, "`quality` must be between 1 and 100"),
    ({"encoding": "webp"}, "`encoding` must be one of jpeg, raw"),
    ({"format": "zip"}, "`format` must be one of lmdb, hdf5"),
    ({"max_pixels": -1}, "`max_pixels` must be >= 0 (0 disables the limit)"),
    ({"size": "big"}, "`size` must be an integer, not 'big'"),
    ({"quality": 90.5}, "`quality` must be an integer, not 90.5"),
    ({"max_pixels": True}, "`max_pixels` must be an integer, not True"),
    ({"workers": "2"}, "`workers` must be an integer, not '2'"),
    ({"num_shards": 2.0}, "`num_shards` must be an integer, not 2.0"),
    ({"shard_size": "1GiB"}, "`shard_size` must be an integer, not '1GiB'"),
    ({"num_nodes": "2", "num_shards": 2}, "`num_nodes` must be an integer, not '2'"),
], ids=["engine", "dask", "scheduler", "resume", "both-sizes", "workers-scheduler",
        "node-rank", "size", "quality-0",
        "quality-101", "encoding", "format", "max-pixels", "size-str", "quality-float",
        "max-pixels-bool", "workers-str", "num-shards-float", "shard-size-str", "num-nodes-str"])
def test_pack_refuses_options_before_any_work(tmp_path, kwargs, message):
    """Option errors are PackErrors and ValueErrors (Python's convention for a bad argument)."""
    with pytest.raises(ValueError) as info:
        pack(str(tmp_path / "no-src"), str(tmp_path / "out"), progress=False, **kwargs)
    assert isinstance(info.value, PackError) and isinstance(info.value, shardkit.OptionError)
    assert str(info.value) == message or str(info.value).startswith(message), str(info.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs,message", [
    ({"num_shards": 0}, "`num_shards` must be >= 1"),
    ({"shard_size": 0}, "`shard_size` must be positive"),
], ids=["num-shards", "shard-size"])
def test_shard_options_are_value_errors(src, tmp_path, kwargs, message):
    with pytest.raises(ValueError) as info:
        pack(src, str(tmp_path / "out"), workers=1, progress=False, **kwargs)
    assert isinstance(info.value, PackError) and str(info.value) == message
    assert os.listdir(tmp_path) == []


def test_out_inside_src_names_the_parameters(src, tmp_path):
    tree = str(tmp_path / "src")
    shutil.copytree(src, tree)
    with pytest.raises(ValueError) as info:
        pack(tree, os.path.join(tree, "c0", "out.lmdb"), workers=1, progress=False)
    assert isinstance(info.value, PackError)
    assert str(info.value) == "`out` must not be inside `src` (the source folder)"
    proc = run_cli("pack", tree, os.path.join(tree, "c0", "out.lmdb"), "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert proc.stderr.strip() == \
        "shardkit pack: error: OUT must not be inside SRC (the source folder)"


def test_store_writer_option_errors_are_value_errors(tmp_path):
    from shardkit import StoreWriter

    with pytest.raises(ValueError, match="^`kind` must be 'single' or 'shard', not 'half'$"):
        StoreWriter(str(tmp_path / "w.lmdb"), ["a"], kind="half")
    with pytest.raises(ValueError, match="^`quality` must be between 1 and 100$"):
        StoreWriter(str(tmp_path / "w.lmdb"), ["a"], quality=0)
    with StoreWriter(str(tmp_path / "w.lmdb"), ["a"], size=0) as writer:
        with pytest.raises(ValueError, match="^`image` must be an HxWx3 uint8 RGB array"):
            writer.add(np.zeros((4, 4), np.uint8), 0)
        writer.add(np.zeros((4, 4, 3), np.uint8), 0)
    assert [label for _, label in all_records(str(tmp_path / "w.lmdb"))] == [0]


@pytest.mark.parametrize("args, message", [
    (["nosuch://bucket/train", "--num-shards", "2"],
     "nosuch://bucket/train: ValueError: Protocol not known: nosuch (remote stores need fsspec "
     "and the package for this protocol)"),
    (["s3://bucket/train"],
     "s3://bucket/train: a remote OUT is a folder store: give --shard-size or --num-shards"),
    (["s3://bucket/train", "--num-shards", "2", "--num-nodes", "2"],
     "s3://bucket/train: --num-nodes needs a local OUT that every node shares; pack to a URL "
     "from one machine, or with --engine dask"),
    (["s3://bucket/train", "--num-shards", "2", "--file-list", "s3://bucket/list.csv"],
     "s3://bucket/list.csv: --file-list must be a local path (only OUT may be a URL)"),
], ids=["unknown-protocol", "single-file", "num-nodes", "file-list"])
def test_remote_out_refusals_are_one_line(src, tmp_path, args, message):
    """Not a local folder named ``s3:``, and no request sent: refused before any work."""
    cache = tmp_path.parent / f"{tmp_path.name}-cache"
    proc = run_cli("pack", src, *args, "-q", cwd=str(tmp_path),
                   env={"SHARDKIT_CACHE_DIR": str(cache), "AWS_ENDPOINT_URL": "http://0.0.0.0:9"})
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert proc.stderr.strip() == f"shardkit pack: error: {message}"
    assert os.listdir(tmp_path) == [] and not cache.exists()


def test_remote_store_without_s3fs_is_one_line(src, tmp_path):
    """s3fs missing (an import that fails, as on a core install): every command says what to
    install, in one line."""
    hide = tmp_path / "hide" / "s3fs"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('No module named s3fs')\n")
    work = tmp_path / "work"
    work.mkdir()
    path = os.pathsep.join(p for p in (str(tmp_path / "hide"), os.environ.get("PYTHONPATH"))
                           if p)
    env = {"PYTHONPATH": path, "SHARDKIT_CACHE_DIR": str(tmp_path / "cache")}
    need = ("s3://bucket/train: ImportError: Install s3fs to access S3 (remote stores need pip "
            "install 'shardkit[remote]')")
    for args in (["pack", src, "s3://bucket/train", "--num-shards", "2", "-q"],
                 ["info", "s3://bucket/train"], ["verify", "s3://bucket/train"]):
        proc = run_cli(*args, cwd=str(work), env=env)
        assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
        assert proc.stderr.strip() == f"shardkit {args[0]}: error: {need}"
    proc = run_cli("merge", "s3://bucket/train", cwd=str(work), env=env)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert "`merge` finishes a multi-node pack into a local folder" in proc.stderr
    assert os.listdir(work) == [] and not (tmp_path / "cache").exists()


def test_is_url():
    from pathlib import Path

    from shardkit.urls import is_url

    assert is_url("s3://b/k") and is_url("file:///x") and is_url(b"gs://b") and is_url("a+b.c-d://")
    assert not any(is_url(p) for p in ("s3:/b/k", "./s3://b", "C:\\data", Path("s3:") / "b",
                                       "/data/train", "://x", "1s://x"))


# -- --strict stops on discovery failures ---------------------------------------------------------

def test_strict_stops_on_a_symlink_loop(src, tmp_path):
    tree = str(tmp_path / "src")
    shutil.copytree(src, tree)
    os.symlink(".", os.path.join(tree, "c1", "loop"))  # c1/loop -> c1
    out = tmp_path / "out.lmdb"
    with pytest.raises(PackError) as info:
        pack(tree, out, strict=True, workers=1, progress=False)
    assert os.path.join(tree, "c1", "loop") in str(info.value)
    assert "symlink loop" in str(info.value) and "`strict=True`" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["src"]
    result = pack(tree, out, workers=1, progress=False)  # without strict: reported and skipped
    assert result.count == 12
    assert [s["path"] for s in result.skipped] == [os.path.join(tree, "c1", "loop")]


def _without_file_permission_override() -> None:
    """In the child (a root test run): drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
    bounding set before exec, so that root, too, is refused a folder with mode 000."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            os._exit(97)


def _run_unprivileged(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONIOENCODING="utf-8"),
                          preexec_fn=_without_file_permission_override if os.geteuid() == 0
                          else None)


def test_strict_stops_on_an_unlistable_folder(src, tmp_path):
    tree = str(tmp_path / "src")
    shutil.copytree(src, tree)
    locked = os.path.join(tree, "c2", "locked")
    os.makedirs(locked)
    shutil.copy(os.path.join(tree, "c2", "img000.jpg"), os.path.join(locked, "x.jpg"))
    os.chmod(locked, 0)
    try:
        probe = _run_unprivileged("-c", f"import os; os.listdir({locked!r})")
        if probe.returncode == 97 or "PermissionError" not in probe.stderr:
            pytest.skip("cannot run a process that a mode-000 folder refuses here "
                        f"(rc {probe.returncode}: {probe.stderr[-200:]!r})")
        out = str(tmp_path / "out.lmdb")
        proc = _run_unprivileged("-m", "shardkit.cli", "pack", tree, out, "--strict",
                                 "--workers", "1", "-q")
        assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
        assert f"{locked}: cannot list folder: Permission denied (--strict" in proc.stderr
        assert sorted(os.listdir(tmp_path)) == ["src"]
        proc = _run_unprivileged("-m", "shardkit.cli", "pack", tree, out, "--workers", "1", "-q")
        assert proc.returncode == 0, proc.stderr
        assert "skipped 1 " in proc.stderr and repr(locked) in proc.stderr
    finally:
        os.chmod(locked, 0o755)


# -- a read-only OUT folder -----------------------------------------------------------------------

def _read_only_bind(folder: str) -> tuple[bool, list[str] | None]:
    """Make ``folder`` a read-only bind mount of itself (as root: root ignores file modes, not a
    read-only mount), or find a prefix that runs a command with it mounted so in a private
    namespace (``unshare -rm``): (mounted here, prefix or None)."""
    here = subprocess.run(["mount", "--bind", folder, folder], capture_output=True)
    if here.returncode == 0:
        if subprocess.run(["mount", "-o", "remount,ro,bind", folder],
                          capture_output=True).returncode == 0:
            return True, None
        subprocess.run(["umount", folder], capture_output=True)
    q = shlex.quote(folder)
    script = f"mount --bind {q} {q} && mount -o remount,ro,bind {q} && exec \"$@\""
    prefix = ["unshare", "-rm", "sh", "-c", script, "sh"]
    if shutil.which("unshare") and subprocess.run(prefix + ["true"], capture_output=True,
                                                  timeout=60).returncode == 0:
        return False, prefix
    return False, None


def _run_read_only(folder: str, *cli_args: str) -> subprocess.CompletedProcess:
    """``shardkit CLI_ARGS`` with ``folder`` read-only (really: a write there is refused)."""
    mounted, prefix = _read_only_bind(folder)
    if not mounted and prefix is None:
        pytest.skip("cannot make a read-only bind mount here (not root, and no unshare -rm)")
    try:
        probe = subprocess.run([*(prefix or []), "touch", os.path.join(folder, "probe")],
                               capture_output=True, text=True)
        assert probe.returncode != 0 and "Read-only file system" in probe.stderr, probe
        return subprocess.run([*(prefix or []), sys.executable, "-m", "shardkit.cli", *cli_args],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONIOENCODING="utf-8"))
    finally:
        if mounted:
            subprocess.run(["umount", folder], capture_output=True)


@pytest.mark.parametrize("kind", ["lmdb", "hdf5", "folder"])
def test_pack_into_a_read_only_folder_is_one_line(src, tmp_path, kind):
    ro = tmp_path / "ro"
    ro.mkdir()
    out = ro / {"lmdb": "out.lmdb", "hdf5": "out.h5", "folder": "out"}[kind]
    extra = ["--num-shards", "2"] if kind == "folder" else []
    proc = _run_read_only(str(ro), "pack", src, str(out), "--size", "16", "--workers", "1",
                          "-q", *extra)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert proc.stderr.strip() == (f"shardkit pack: error: cannot write {out}: folder {ro} is on "
                                   "a read-only file system; no output written")
    assert os.listdir(ro) == []


@pytest.fixture
def locked(tmp_path):
    """A mode-555 folder that ``_run_unprivileged`` processes cannot write in (the test is
    skipped where no such process can run)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    os.chmod(folder, 0o555)
    try:
        probe = _run_unprivileged("-c", f"open({str(folder / 'probe')!r}, 'w')")
        if probe.returncode == 97 or "PermissionError" not in probe.stderr:
            pytest.skip("cannot run a process that a mode-555 folder refuses here "
                        f"(rc {probe.returncode}: {probe.stderr[-200:]!r})")
        yield folder
    finally:
        os.chmod(folder, 0o755)


def test_pack_into_a_folder_without_write_permission_is_one_line(src, locked):
    """Mode 555, packed by a process without root's file-permission override."""
    for name, extra in (("out.lmdb", []), ("out", ["--num-shards", "2"])):
        out = locked / name
        proc = _run_unprivileged("-m", "shardkit.cli", "pack", src, str(out), "--size", "16",
                                 "--workers", "1", "-q", *extra)
        assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
        assert proc.stderr.strip() == (f"shardkit pack: error: cannot write {out}: folder "
                                       f"{locked} is not writable; no output written")
    assert os.listdir(locked) == []


def test_pack_never_creates_folders_under_an_unwritable_ancestor(src, locked):
    """A missing OUT folder under a mode-555 one: refused naming that ancestor, nothing made."""
    out = locked / "stores" / "train"
    proc = _run_unprivileged("-m", "shardkit.cli", "pack", src, str(out), "--size", "16",
                             "--workers", "1", "-q", "--num-shards", "2")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert proc.stderr.strip() == (
        f"shardkit pack: error: cannot write {out}: folder {out.parent} does not exist and "
        f"cannot be created in {locked} (not writable); no output written")
    assert os.listdir(locked) == []


def test_sharded_pack_that_finished_no_shard_claims_none(src, tmp_path):
    """OUT's folder is writable, its partial folder is not (a read-only mount): the pack fails
    before any shard is finished, and must not send the user to ``--resume``."""
    out = tmp_path / "out"
    partial = tmp_path / ".out.partial"
    partial.mkdir()
    proc = _run_read_only(str(partial), "pack", src, str(out), "--num-shards", "2", "--size",
                          "16", "--workers", "1", "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert proc.stderr.strip() == (f"shardkit pack: error: cannot write {out}: Read-only file "
                                   "system; no shard was finished, nothing to resume")
    assert sorted(os.listdir(tmp_path)) == [".out.partial"] and os.listdir(partial) == []


# -- full disk at the end of a sharded pack, and in merge -----------------------------------------

def _small_filesystem(folder: str, size: str) -> tuple[bool, list[str] | None]:
    """Mount a tmpfs of ``size`` on ``folder`` (as root), or find a prefix that runs a command
    with one mounted in a private namespace (``unshare -rm``): (mounted here, prefix or None)."""
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder],
                      capture_output=True).returncode == 0:
        return True, None
    script = f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(folder)} && exec \"$@\""
    prefix = ["unshare", "-rm", "sh", "-c", script, "sh"]
    if shutil.which("unshare") and subprocess.run(prefix + ["true"], capture_output=True,
                                                  timeout=60).returncode == 0:
        return False, prefix
    return False, None


def test_disk_full_while_finishing_a_sharded_pack(src, tmp_path):
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    kw = dict(num_shards=3, size=0, encoding="raw", workers=1, progress=False)
    for rank in range(2):
        pack(src, pristine / "nodes", num_nodes=2, node_rank=rank, **kw)
    os.rename(partial_of(str(pristine / "nodes")), pristine / "partial")
    pack(src, pristine / "old", **kw | {"size": 16})
    pack(src, pristine / "ref", **kw)
    old, ref = shard_digests(str(pristine / "old")), shard_digests(str(pristine / "ref"))
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted, prefix = _small_filesystem(str(disk), "4m")
    if not mounted and prefix is None:
        pytest.skip("cannot mount a small tmpfs here (not root, and no unshare -rm)")
    try:
        proc = subprocess.run([*(prefix or []), *program_cmd("sharded_disk_full"), src, str(disk),
                               str(pristine)], env=program_env(), capture_output=True, text=True,
                              timeout=600)
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = json.loads(proc.stdout.splitlines()[-1])
    print("mounted here" if mounted else "mounted by unshare -rm",
          [(t["mode"], t["free"], (t["error"] or "ok")[:60]) for t in trials])
    for t in trials:
        final = t["final"]
        assert final["ok"] and final["records"] == 12, t
        assert [sha for _, sha in final["shards"]] == [sha for _, _, sha in ref], t
        if t["error"] is None:
            continue
        assert "No space left on device" in t["error"] and "\n" not in t["error"], t
        if t["mode"] in ("pack-overwrite", "install"):  # the old store is left as it was
            after = t["after_error"]
            assert after["ok"] and [(f, sha) for f, sha in after["shards"]] == \
                [(f, sha) for f, _, sha in old], t
        else:
            assert t["after_error"] is None, t
        if "cli" in t:
            assert t["cli"]["rc"] == 1 and one_line_error(t["cli"]["stderr"]), t
            assert "No space left on device" in t["cli"]["stderr"], t
    failed = {(t["mode"], t["free"]) for t in trials if t["error"] is not None}
    assert {(mode, 0) for mode in ("pack", "pack-overwrite", "merge", "install")} <= failed
    assert any(free > 0 for _, free in failed), failed  # past the first write of each run


# -- a lost Dask worker ---------------------------------------------------------------------------

@pytest.mark.leaves_threads  # a Dask client in this process
def test_lost_dask_worker_is_one_line(src, tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    import dask

    class DieOnShard(distributed.WorkerPlugin):
        """Ends the worker process as soon as it starts packing a shard."""

        def transition(self, key, start, finish, **kwargs):
            if finish == "executing" and str(key).startswith("shardkit-shard-"):
                os._exit(1)

    out = tmp_path / "out"
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                      host="127.0.0.1", dashboard_address=None,
                                      silence_logs=logging.ERROR) as cluster, \
                distributed.Client(cluster) as client:
            client.register_plugin(DieOnShard())
            proc = run_cli("pack", src, str(out), "--num-shards", "2", "--size", "16",
                           "--engine", "dask", "--scheduler", cluster.scheduler_address, "-q",
                           timeout=300)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert "the Dask worker packing shard" in proc.stderr and "--resume" in proc.stderr
    assert not out.exists()


# -- replacing a folder store by a single file ----------------------------------------------------

def _aside(folder) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith(".store.old-")]


def test_folder_store_replaced_by_a_file_keeps_open_readers(src, tmp_path):
    out = str(tmp_path / "store")
    pack(src, out, num_shards=3, size=16, workers=1, progress=False)
    shutil.copytree(out, tmp_path / "copy")
    expected = all_records(str(tmp_path / "copy"))
    pack(src, tmp_path / "single", size=24, workers=1, progress=False)
    expected_new = all_records(str(tmp_path / "single"))
    ds = ShardDataset(out, output="numpy")
    first = ds[0]  # this dataset now reads the folder store (shard 0 open, the others not yet)
    pack(src, out, size=24, workers=1, overwrite=True, progress=False)
    assert os.path.isfile(out)
    got = [ds[i] for i in range(len(ds))]
    assert np.array_equal(first[0], expected[0][0])
    assert len(got) == len(expected) == 12
    for (img, label), (want, want_label) in zip(got, expected):
        assert label == want_label and np.array_equal(img, want)
    new = all_records(out)
    assert len(new) == len(expected_new)
    for (img, label), (want, want_label) in zip(new, expected_new):
        assert label == want_label and np.array_equal(img, want)
    assert len(_aside(tmp_path)) == 1  # the old folder, kept while `ds` holds it
    ds.close()
    del ds
    gc.collect()
    pack(src, out, size=24, workers=1, overwrite=True, progress=False)  # a later install
    assert _aside(tmp_path) == []


# -- the pack summary: start-up apart from the packing rate ---------------------------------------

def test_pack_result_reports_startup_apart(src, tmp_path):
    t0 = time.perf_counter()
    result = pack(src, tmp_path / "out.lmdb", size=16, workers=2, progress=False)
    wall = time.perf_counter() - t0
    assert result.sources == 12 and result.count == 12
    assert 0 < result.startup_seconds and 0 < result.packing_seconds
    assert result.startup_seconds + result.packing_seconds <= wall
    # measured by the pack: once its workers are up, before the call returns
    assert 0 < result.startup_seconds <= result.first_record_seconds <= result.seconds
    assert result.images_per_second * result.packing_seconds == pytest.approx(12, rel=1e-9)


def test_cli_summary_prints_startup_and_rate(src, tmp_path):
    import re

    proc = run_cli("pack", src, str(tmp_path / "out"), "--num-shards", "2", "--size", "16",
                   "--workers", "2", "-q")
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"packed 12 images into \S+ \(2 shards\) in ([0-9.]+) s: ([0-9.]+) s start-up "
                  r"\(first record at ([0-9.]+) s\), then ([0-9]+) images/s", proc.stderr)
    assert m, proc.stderr
    assert float(m.group(2)) <= float(m.group(3)) <= float(m.group(1))


def test_resume_and_merge_errors_name_the_parameter(src, tmp_path):
    """Python callers read `resume=True`; the CLI shows --resume."""
    out = str(tmp_path / "out")
    pack(src, out, num_shards=2, num_nodes=2, node_rank=0, size=16, workers=1, progress=False)
    with pytest.raises(PackError) as info:
        pack(src, out, num_shards=2, size=24, resume=True, workers=1, progress=False)
    assert str(info.value).endswith("differs from the one made now from the source in its "
                                    "settings, classes or shard boundaries; pack again with "
                                    "`overwrite=True` to start over")
    proc = run_cli("pack", src, out, "--num-shards", "2", "--size", "24", "--resume", "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert proc.stderr.strip().endswith("pack again with --overwrite to start over")
    from shardkit.packing.api import merge

    with pytest.raises(PackError, match=r"^1 of 2 shards are not finished yet \(first: 1\); run "
                                        r"the remaining nodes, or pack with `resume=True`$"):
        merge(out)
    proc = run_cli("merge", out)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert proc.stderr.strip() == ("shardkit merge: error: 1 of 2 shards are not finished yet "
                                   "(first: 1); run the remaining nodes, or pack with --resume")


# -- a pack that packs nothing ------------------------------------------------------------------

def test_a_pack_that_packs_nothing_is_an_error_unless_allow_empty(tmp_path, capsys):
    from shardkit.cli import main as cli_main

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for name in ("x.jpg", "y.png"):
        (src / "a" / name).write_bytes(b"not an image at all")
    for kw in ({}, {"num_shards": 2}):
        with pytest.raises(PackError, match=r"^no images packed: 2 sources skipped \(first: "):
            pack(str(src), str(tmp_path / "out"), workers=1, progress=False, **kw)
        assert sorted(os.listdir(tmp_path)) == ["src"]  # no store, no partial left behind
    assert cli_main(["pack", str(src), str(tmp_path / "o.lmdb"), "-q", "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--allow-empty" in err
    assert sorted(os.listdir(tmp_path)) == ["src"]
    result = pack(str(src), str(tmp_path / "e.lmdb"), workers=1, progress=False,
                  allow_empty=True)
    assert result.count == 0 and len(result.skipped) == 2
    assert len(ShardDataset(str(tmp_path / "e.lmdb"))) == 0
