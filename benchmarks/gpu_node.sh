#!/usr/bin/env bash
# benchmarks/gpu_node.py on a lent GPU node, with nothing fetched there.
#
# The node's python3 has torch, torchvision, numpy, Pillow, h5py and psutil, but not lmdb or
# simplejpeg, and it reaches no package index. So, on a machine that does (this one), once:
#
#   benchmarks/gpu_node.sh --fetch-wheels      # lmdb + simplejpeg wheels for the node into .wheels/
#
# (.wheels/ is ignored by git: name it in the device run's `carry`). On the node:
#
#   benchmarks/gpu_node.sh [gpu_node.py options]   # installs from .wheels/ if needed, runs, $OUT
#
# PYTHON picks the interpreter (default: python3); NODE_PYTHON_VERSION the wheels' Python (3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qx '/.wheels/' .git/info/exclude 2>/dev/null || echo '/.wheels/' >> .git/info/exclude
  "$PY" -m pip download --quiet --only-binary=:all: --no-deps \
    --python-version "${NODE_PYTHON_VERSION:-3.12}" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .wheels lmdb simplejpeg
  ls -l .wheels
  exit 0
fi
if ! "$PY" -c 'import lmdb, simplejpeg' 2>/dev/null; then
  "$PY" -m pip install --quiet --no-index --find-links .wheels lmdb simplejpeg
fi
export PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_node.py "$@"
