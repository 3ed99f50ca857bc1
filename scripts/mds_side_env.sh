#!/usr/bin/env bash
# Build the MosaicML Streaming side environment (default .venv-mds) that tests/sources use to
# write MDS shards with `streaming.MDSWriter` and read them back with `streaming.StreamingDataset`.
# mosaicml-streaming imports torch, torchvision and transformers<5 at import time and pins
# numpy<2.2; installed normally it would pull a CUDA torch and downgrade packages other tests
# rely on. So its pure-Python packages go, --no-deps, into a folder that is put first on
# PYTHONPATH over the torchvision environment (.venv-tv, scripts/torchvision_venv.sh), which
# provides torch and torchvision; nothing in .venv-tv changes.
# Use: PYTHONPATH=.venv-mds .venv-tv/bin/python -c 'import streaming'
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-.venv-mds}
TV_PYTHON=${TV_PYTHON:-.venv-tv/bin/python}
rm -rf "$TARGET"
"$TV_PYTHON" -m pip install --quiet --no-deps --target "$TARGET" \
  "mosaicml-streaming==0.13.0" "transformers>=4.57,<5" "huggingface_hub>=0.34,<1.0" \
  "tokenizers==0.22.1" xxhash zstd python-snappy cramjam Brotli catalogue
PYTHONPATH="$TARGET" "$TV_PYTHON" - <<'PY'
import torch, torchvision
from streaming import MDSWriter, StreamingDataset
import streaming
print(f"mosaicml-streaming {streaming.__version__} over torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}")
PY
