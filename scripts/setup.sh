#!/usr/bin/env bash
# Create .venv (if missing), install torch first if .venv has none, then shardkit and its extras.
# Idempotent: a second run keeps the installed torch and only checks that everything is installed.
#
# shardkit needs torch>=2.1 and keeps whatever torch is installed, so choose the build here.
# Which build `pip install torch` fetches depends on the index: PyPI's Linux x86_64 wheels are
# CUDA builds (several GB), its macOS and Windows wheels CPU builds. PyTorch's own index has
# every build (pytorch.org lists the CUDA ones, .../whl/cuXYZ):
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu ./scripts/setup.sh     # CPU only
# TORCH (default torch==2.13.0, the release CI tests in .venv) picks the version. On this project's
# CI machine the configured package mirror serves torch==2.13.0 as the CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
    "${TORCH:-torch==2.13.0}"
fi
.venv/bin/python -m pip install --quiet -e '.[test,bench,pillow,dask]'
