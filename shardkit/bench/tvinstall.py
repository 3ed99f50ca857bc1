"""The pip command that adds torchvision beside the installed torch, keeping that torch.

A plain ``pip install torchvision`` takes the newest torchvision, which pins the newest torch:
pip replaces the installed torch with it (on Linux x86_64 PyPI's CUDA build, about 20 packages).
A torchvision of the right version from the wrong index fails the other way: PyPI's Linux wheels
are built against CUDA torch, and beside a ``+cpu`` torch their operators do not load
(``operator torchvision::nms does not exist``). So the command names:

- the torchvision release of this torch: torch ``2.M.P`` pairs with torchvision ``0.(M+15).P``
  (2.1.0 / 0.16.0 through 2.9.1 / 0.24.1, 2.13.0 / 0.28.0, 2.14.1 / 0.29.1);
- the index of this torch's build: the installed distribution's local version (``+cpu``,
  ``+cu130``, ``+rocm6.4``...) is a build from PyTorch's own index, whose matching torchvision
  carries the same tag; without one, torch came from PyPI, and so does its torchvision;
- ``--no-deps``: torchvision needs only torch, numpy and Pillow, which are installed (Pillow is
  named in the command where it is missing), so pip never re-resolves torch.

``python -m shardkit.bench.tvinstall [--python PATH]`` prints the command for the torch this
interpreter has (``scripts/demo.sh`` shows it).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import sys

PYTORCH_INDEX = "https://download.pytorch.org/whl/"
_RELEASE = re.compile(r"2\.(\d+)\.(\d+)(?:\+([0-9A-Za-z.]+))?")


def matching_torchvision(torch_version: str) -> str | None:
    """torchvision's release for torch ``torch_version`` (``"2.13.0+cpu"`` -> ``"0.28.0"``);
    None for a version no release pairs with (a pre-release, a source build, torch < 2.1)."""
    found = _RELEASE.fullmatch(torch_version)
    if found is None or int(found[1]) < 1:
        return None
    return f"0.{int(found[1]) + 15}.{found[2]}"


def install_command(torch_version: str, python: str = "python",
                    have_pillow: bool = True) -> str:
    """The command that installs torchvision for the torch distribution ``torch_version``
    (as ``importlib.metadata.version("torch")`` gives it) without touching that torch."""
    release = matching_torchvision(torch_version)
    if release is None:
        raise ValueError(f"no torchvision release pairs with torch {torch_version}: install "
                         "the torchvision built for it (a nightly or a source build)")
    tag = _RELEASE.fullmatch(torch_version)[3]  # type: ignore[index]
    words = [python, "-m", "pip", "install", "--no-deps"]
    if tag:
        words += ["--index-url", PYTORCH_INDEX + tag, f"torchvision=={release}+{tag}"]
    else:
        words.append(f"torchvision=={release}")
    if not have_pillow:
        words.append("pillow")
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardkit.bench.tvinstall",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python",
                        help="the interpreter the command names (default: python)")
    args = parser.parse_args(argv)
    version = importlib.metadata.version("torch")
    try:
        print(install_command(version, args.python, importlib.util.find_spec("PIL") is not None))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
