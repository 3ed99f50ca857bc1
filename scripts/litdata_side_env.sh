#!/usr/bin/env bash
# Build the LitData side environment (default .venv-litdata) that tests/sources/test_litdata.py
# uses to write optimized folders with litdata's own BinaryWriter. litdata requires torchvision,
# boto3, obstore...: installed normally it would pull a CUDA torch. Its pure-Python package
# goes, --no-deps, into a folder put first on PYTHONPATH over the main environment (.venv: torch,
# lightning-utilities, filelock, numpy, Pillow), which nothing here changes.
# Use: PYTHONPATH=.venv-litdata .venv/bin/python -c 'import litdata'
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-.venv-litdata}
PYTHON=${PYTHON:-.venv/bin/python}
rm -rf "$TARGET"
"$PYTHON" -m pip install --quiet --no-deps --target "$TARGET" "litdata==0.2.76"
PYTHONPATH="$TARGET" "$PYTHON" - <<'PY'
import litdata
from litdata.streaming.writer import BinaryWriter
print(f"litdata {litdata.__version__}")
PY
