#!/usr/bin/env bash
# End to end on a fresh machine: set up, make a sample folder of photo-like JPEGs, pack it to
# LMDB and HDF5, inspect and verify the stores, then run the throughput benchmark on it.
# COUNT (default 2000) sets the number of sample images.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
COUNT=${COUNT:-2000}
DATA=${DATA:-sample-data}
if [ ! -d "$DATA/images" ]; then
  python scripts/make_sample.py "$DATA/images" --count "$COUNT" --classes 10
fi
shardkit pack "$DATA/images" "$DATA/train.lmdb" --overwrite
shardkit pack "$DATA/images" "$DATA/train.h5" --overwrite
shardkit info "$DATA/train.lmdb"
shardkit verify "$DATA/train.h5" --quiet
SIMD=()
if [ -x .venv-simd/bin/python ]; then  # made by scripts/pillow_simd_venv.sh: pack figures there too
  SIMD=(--simd-python .venv-simd/bin/python)
fi
python benchmarks/throughput.py "$DATA/images" --out-dir "$DATA/bench" --recommend "${SIMD[@]}"
