#!/usr/bin/env bash
# Build a virtual environment (default .venv-tv) with the current torch and torchvision releases
# installed first, then shardkit with its test extras. shardkit requires only torch>=2.1, so its
# install must keep that torch: a cap below it would downgrade torch and leave torchvision broken
# (`operator torchvision::nms does not exist`) while pip exits 0. tests/test_torch_versions.py
# runs shardkit and torchvision in it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-tv}
TORCH=2.14.1
TORCHVISION=0.29.1
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "torch==$TORCH" "torchvision==$TORCHVISION"
# coco: pycocotools, for torchvision's CocoDetection masks in tests/fields (issue 19)
"$VENV/bin/python" -m pip install --quiet -e '.[test,pillow,coco]'
# timm (needs torchvision) for tests/integrations/test_timm.py; it keeps the installed torch.
"$VENV/bin/python" -m pip install --quiet "timm==1.0.31"
"$VENV/bin/python" - "$TORCH" "$TORCHVISION" <<'PY'
import sys
import torch, torchvision
import shardkit
want_torch, want_tv = sys.argv[1], sys.argv[2]
assert torch.__version__.split("+")[0] == want_torch, f"torch changed to {torch.__version__}"
assert torchvision.__version__.split("+")[0] == want_tv, torchvision.__version__
keep = torchvision.ops.nms(torch.tensor([[0., 0, 10, 10], [1, 1, 10, 10]]), torch.tensor([1., .5]), .5)
assert keep.tolist() == [0], keep  # the compiled operators load against this torch
print(f"torch {torch.__version__}, torchvision {torchvision.__version__} kept; "
      f"shardkit {shardkit.__version__} installed beside them")
PY
