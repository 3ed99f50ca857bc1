#!/usr/bin/env bash
# Create .venv (if missing) with the CPU build of torch first, then shardkit and its extras.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
# torch first and pinned: a bare or open-ended torch requirement pulls a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e '.[test,bench,pillow,dask]'
