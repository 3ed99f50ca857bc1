#!/usr/bin/env bash
# Build a second virtual environment (default .venv-simd) where shardkit runs on pillow-simd,
# compiled with AVX2. Installing shardkit there must leave pillow-simd in place: its core
# requirements do not name Pillow (Pillow is the optional extra `shardkit[pillow]`).
# Needs a C compiler and the libjpeg/zlib headers (Debian: libjpeg-dev zlib1g-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-simd}
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet torch==2.13.0
CC="cc -mavx2" "$VENV/bin/python" -m pip install --quiet --no-cache-dir --no-binary pillow-simd pillow-simd
"$VENV/bin/python" -m pip install --quiet -e .
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import PIL
names = {d.metadata["Name"].lower() for d in md.distributions()}
assert "pillow-simd" in names and "pillow" not in names, names & {"pillow", "pillow-simd"}
print(f"pillow-simd {PIL.__version__} in place; shardkit installed beside it")
PY
