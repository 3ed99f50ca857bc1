"""The demo's hint for adding torchvision keeps the installed torch: the torchvision release of
that torch, from that torch's index, with ``--no-deps`` (``shardkit.bench.tvinstall``)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from shardkit.bench.tvinstall import install_command, matching_torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Released pairs (torch, torchvision), from PyTorch's release notes; the last two are what
# scripts/setup.sh (.venv) and scripts/torchvision_venv.sh (.venv-tv) install.
PAIRS = [("2.1.0", "0.16.0"), ("2.1.2", "0.16.2"), ("2.2.1", "0.17.1"), ("2.3.1", "0.18.1"),
         ("2.4.1", "0.19.1"), ("2.5.1", "0.20.1"), ("2.6.0", "0.21.0"), ("2.7.1", "0.22.1"),
         ("2.8.0", "0.23.0"), ("2.9.1", "0.24.1"), ("2.13.0", "0.28.0"), ("2.14.1", "0.29.1")]


def test_the_torchvision_of_each_torch_release():
    assert [matching_torchvision(t) for t, _ in PAIRS] == [v for _, v in PAIRS]
    assert matching_torchvision("2.13.0+cpu") == "0.28.0"
    for unpaired in ("2.0.1", "2.15.0.dev20260101+cu130", "2.14.0a0+git1234abc", "1.13.1"):
        assert matching_torchvision(unpaired) is None, unpaired
    with pytest.raises(ValueError, match="no torchvision release pairs with torch 2.0.1"):
        install_command("2.0.1")


def test_each_build_gets_its_own_index_and_never_a_new_torch():
    assert install_command("2.13.0+cpu", ".venv/bin/python") == (
        ".venv/bin/python -m pip install --no-deps --index-url "
        "https://download.pytorch.org/whl/cpu torchvision==0.28.0+cpu")
    assert install_command("2.14.1+cu130") == (
        "python -m pip install --no-deps --index-url https://download.pytorch.org/whl/cu130 "
        "torchvision==0.29.1+cu130")
    assert install_command("2.14.1") == "python -m pip install --no-deps torchvision==0.29.1"
    assert install_command("2.14.1", have_pillow=False).endswith(" torchvision==0.29.1 pillow")


def test_the_demo_prints_the_command_for_the_installed_torch():
    with open(os.path.join(ROOT, "scripts", "demo.sh")) as f:
        demo = f.read()
    line = re.search(r"\$\((python -m shardkit\.bench\.tvinstall [^)]*?) 2>&1", demo)
    assert line, "demo.sh no longer prints shardkit.bench.tvinstall's command"
    argv = shlex.split(line.group(1))
    done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True,
                          timeout=120, check=True)
    torch_version = importlib.metadata.version("torch")
    assert done.stdout.strip() == install_command(torch_version, ".venv/bin/python")
    if torch_version == "2.13.0+cpu":  # what scripts/setup.sh installs on CI
        assert done.stdout.strip() == (
            ".venv/bin/python -m pip install --no-deps --index-url "
            "https://download.pytorch.org/whl/cpu torchvision==0.28.0+cpu")


def test_the_command_installs_torchvision_beside_the_installed_torch(tv_python, tmp_path):
    """In the torchvision environment (torch 2.14.1 from PyPI): the printed command, run into a
    separate target folder, installs a torchvision whose operators load with that torch."""
    done = subprocess.run([tv_python, "-m", "shardkit.bench.tvinstall", "--python", tv_python],
                          capture_output=True, text=True, timeout=120, check=True)
    command = shlex.split(done.stdout.strip())
    assert command == [tv_python, "-m", "pip", "install", "--no-deps", "torchvision==0.29.1"]
    target = tmp_path / "target"
    subprocess.run([*command, "--quiet", "--target", str(target)], check=True, timeout=300)
    # torchvision alone (its package, bundled libraries and metadata): no torch, no numpy
    assert {p.name.split("-")[0].split(".")[0] for p in target.iterdir()} == {"torchvision"}
    probe = ("import json, torch, torchvision\n"
             "keep = torchvision.ops.nms(torch.tensor([[0., 0, 10, 10], [1, 1, 10, 10]]),\n"
             "                           torch.tensor([1., .5]), .5)\n"
             "print(json.dumps([torch.__version__, torchvision.__version__,\n"
             "                  torchvision.__file__, keep.tolist()]))\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run([tv_python, "-c", probe], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    torch_version, tv_version, tv_file, keep = json.loads(ran.stdout.strip().splitlines()[-1])
    assert torch_version.split("+")[0] == "2.14.1" and tv_version.split("+")[0] == "0.29.1"
    assert tv_file.startswith(str(target)) and keep == [0]
