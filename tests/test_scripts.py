"""scripts/test.sh: the shell scripts parse, and a run without the side environments ends with
one line per missing environment saying how many tests skipped and the command that runs them."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script", sorted(glob.glob(os.path.join(ROOT, "scripts", "*.sh")))
                         + [os.path.join(ROOT, ".ci", "run")], ids=os.path.basename)
def test_shell_script_parses(script):
    run = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_test_sh_runs_pytest_with_the_side_env_report():
    with open(os.path.join(ROOT, "scripts", "test.sh")) as f:
        last = [ln for ln in f.read().splitlines() if ln.strip()][-1]
    assert last == 'exec .venv/bin/python -m pytest -q -p helpers.side_envs "$@"'


@pytest.mark.timeout(300)
def test_missing_side_envs_end_the_run_with_one_line_each(tmp_path):
    """The real side-environment tests, with both environments pointed at a missing
    interpreter, outside CI: they skip, and the report counts them per environment."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(SHARDKIT_TV_PYTHON=str(tmp_path / "no-tv" / "python"),
               SHARDKIT_SIMD_PYTHON=str(tmp_path / "no-simd" / "python"))
    files = ["tests/test_torch_versions.py", "tests/test_pillow_simd.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "helpers.side_envs",
                          "-p", "no:cacheprovider", *files], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    report = {m.group(2): int(m.group(1)) for ln in lines if (m := re.fullmatch(
        r"(\d+) tests skipped without (\.venv-\w+); to run them: "
        r"\./scripts/\w+\.sh \2 && \./scripts/test\.sh", ln))}
    assert set(report) == {".venv-tv", ".venv-simd"}, run.stdout
    # Every test of these files needs one of the two: the lines account for all the skips.
    assert lines[-1].startswith(f"{sum(report.values())} skipped in"), run.stdout
    assert len([ln for ln in lines if "tests skipped without" in ln]) == 2


def test_demo_quick_mode_asks_bench_for_what_it_knows():
    """The demo's quick benchmark (its default) names systems and options ``shardkit bench``
    accepts; a renamed system would fail only at the end of a user's first run."""
    from shardkit.bench import build_parser

    with open(os.path.join(ROOT, "scripts", "demo.sh")) as f:
        text = f.read()
    quick = re.search(r"MODE=\((--systems .*?)\)", text, re.S)
    assert quick, "demo.sh has no quick MODE"
    argv = ["imgs", "--workers-list", "0,2", "--threads-list", "2", *quick.group(1).split()]
    args = build_parser().parse_args(argv)
    assert args.systems == ["imagefolder", "lmdb-jpeg", "lmdb-jpeg/threads", "recipe-decode"]
    assert args.epochs == 1 and args.no_pack_figures
    assert re.search(r"COUNT=\$\{COUNT:-300\}", text) and re.search(r"COUNT=\$\{COUNT:-2000\}", text)
