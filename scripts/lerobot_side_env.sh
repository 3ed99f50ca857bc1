#!/usr/bin/env bash
# Build the LeRobot side environment (default .venv-lerobot) that tests/sources/test_lerobot.py
# uses to read a dataset with LeRobot's own `LeRobotDataset`. lerobot 0.4.4 is the newest release
# for Python 3.11 (0.5 and later need 3.12); it imports torchvision and pins torch, datasets<5
# and huggingface_hub<0.36. So its packages go, --no-deps, into a folder put first on PYTHONPATH
# over the torchvision environment (.venv-tv, scripts/torchvision_venv.sh), which nothing here
# changes. Its decoder is torchcodec, which loads FFmpeg's shared libraries by their sonames:
# ffmpeg-libs/ links those names to the FFmpeg that PyAV's wheel bundles (no system FFmpeg).
# Use: LD_LIBRARY_PATH=.venv-lerobot/ffmpeg-libs PYTHONPATH=.venv-lerobot .venv-tv/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-.venv-lerobot}
TV_PYTHON=${TV_PYTHON:-.venv-tv/bin/python}
rm -rf "$TARGET"
"$TV_PYTHON" -m pip install --quiet --no-deps --target "$TARGET" \
  "lerobot==0.4.4" "datasets>=4.0,<5" "huggingface_hub>=0.34.2,<0.36" httpx httpcore h11 anyio \
  sniffio jsonlines termcolor "draccus==0.10.0" einops "av==18.1.0" "torchcodec==0.17.0"
mkdir -p "$TARGET/ffmpeg-libs"
for lib in "$TARGET"/av.libs/libav*.so.* "$TARGET"/av.libs/libsw*.so.*; do
  name=$(basename "$lib" | sed -E 's/-[0-9a-f]{8}(\.so\.[0-9]+).*/\1/')  # libavutil.so.60
  ln -sf "../av.libs/$(basename "$lib")" "$TARGET/ffmpeg-libs/$name"
done
LD_LIBRARY_PATH="$TARGET/ffmpeg-libs" PYTHONPATH="$TARGET" "$TV_PYTHON" - <<'PY'
import importlib.metadata as md
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from torchcodec.decoders import VideoDecoder
print(f"lerobot {md.version('lerobot')}, torchcodec {md.version('torchcodec')}")
PY
