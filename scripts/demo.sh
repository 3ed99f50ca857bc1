#!/usr/bin/env bash
# Quick start, end to end: what shardkit does to an image folder, and how fast it reads it back.
#
#   ./scripts/demo.sh            # quick: 300 sample photos, a short benchmark (a few minutes)
#   ./scripts/demo.sh --full     # the full benchmark: 2,000 photos, every system and setting
#   COUNT=500 ./scripts/demo.sh  # another sample size (either mode)
#
# How long (this project's 2-core machine, .venv present; a first run adds setup, installing
# torch: a minute or two): see "Quick start" in README.md for the latest measured times. Each
# step prints its time, and the total is printed at the end.
#
# Steps and what each shows:
#   1. setup      .venv with torch and shardkit (scripts/setup.sh; a no-op when installed)
#   2. sample     COUNT photo-like JPEGs in 10 class folders (ImageFolder layout), DATA/images
#   3. pack       the folder packed once to LMDB and once to HDF5 (shorter side 256, JPEG q90)
#   4. inspect    `shardkit info` (count, classes, sizes) and `shardkit verify` (every record)
#   5. benchmark  DataLoader images/s: the ImageFolder baseline against ShardDataset, a table
#                 explained column by column after it (full report: DATA/bench/throughput.txt).
#                 Quick mode: ImageFolder, LMDB jpeg (workers 0 and all CPUs, threads), the
#                 training recipe at decode; one timed epoch each, no pack-speed figures.
#                 --full: every system (LMDB/HDF5 x jpeg/raw, the recipe three ways), workers
#                 0..CPUs, pack-speed figures (and under pillow-simd where .venv-simd exists).
set -euo pipefail
cd "$(dirname "$0")/.."
FULL=0
case "${1:-}" in
  --full) FULL=1 ;;
  "") ;;
  *) echo "usage: $0 [--full]" >&2; exit 2 ;;
esac
if [ $FULL = 1 ]; then COUNT=${COUNT:-2000}; else COUNT=${COUNT:-300}; fi
DATA=${DATA:-sample-data/$COUNT}
START=$SECONDS
STEP_START=$SECONDS
step() {  # step N "title": prints the previous step's time, then the new step's title
  if [ "$1" != 1 ]; then echo "   ($((SECONDS - STEP_START)) s)"; fi
  STEP_START=$SECONDS
  echo
  echo "== [$1/5] $2"
}

step 1 "setup: .venv with torch and shardkit"
./scripts/setup.sh
. .venv/bin/activate

step 2 "sample: $COUNT photo-like JPEGs in 10 classes under $DATA/images"
if [ ! -d "$DATA/images" ]; then
  python scripts/make_sample.py "$DATA/images" --count "$COUNT" --classes 10
else
  echo "   $DATA/images exists: reused (delete it for a new sample)"
fi

step 3 "pack: the folder once to LMDB and once to HDF5 (decoded, resized to 256, re-encoded)"
shardkit pack "$DATA/images" "$DATA/train.lmdb" --overwrite
shardkit pack "$DATA/images" "$DATA/train.h5" --overwrite

step 4 "inspect and verify: what a store holds; every record's checksum and decode"
shardkit info "$DATA/train.lmdb"
shardkit verify "$DATA/train.h5" --quiet && echo "   $DATA/train.h5: every record verified"

step 5 "benchmark: DataLoader throughput, ImageFolder against ShardDataset"
# Sweep workers (and threads) up to the CPUs this process may use (its affinity, so taskset and
# a container's CPU set count): more workers than CPUs only measures contention, and DataLoader
# warns about them ("suggested max number of worker").
CPUS=$(python -c "import os; print(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count())")
if [ $FULL = 1 ]; then
  WORKERS=$(python -c "print(','.join(str(n) for n in range($CPUS + 1)))")
  THREADS=$(python -c "print(','.join(str(n) for n in range(1, $CPUS + 1)))")
  MODE=()
else
  WORKERS="0,$CPUS"
  THREADS="$CPUS"
  MODE=(--systems imagefolder,lmdb-jpeg,lmdb-jpeg/threads,recipe-decode --epochs 1
        --min-seconds 0.5 --no-pack-figures)
  echo "   quick mode (./scripts/demo.sh --full for every system and setting)"
fi
if python -c "import torchvision" 2>/dev/null; then
  echo "   baseline: torchvision's ImageFolder (Resize 256, CenterCrop 224), as installed"
else
  echo "   baseline: torchvision is not installed in .venv, so the ImageFolder baseline is"
  echo "   shardkit's PIL+numpy copy of it (same files, same pixels, same order). To make it"
  echo "   torchvision's own, add the torchvision of this torch (a plain 'pip install"
  echo "   torchvision' would replace torch with the newest release):"
  echo "     $(python -m shardkit.bench.tvinstall --python .venv/bin/python 2>&1 || true)"
fi
SIMD=()
if [ $FULL = 1 ] && [ -x .venv-simd/bin/python ]; then  # scripts/pillow_simd_venv.sh: pack figures there too
  SIMD=(--simd-python .venv-simd/bin/python)
fi
shardkit bench "$DATA/images" --out-dir "$DATA/bench" --workers-list "$WORKERS" \
  --threads-list "$THREADS" --recommend "${MODE[@]}" "${SIMD[@]}"
cat <<'EOF'

How to read the table above (one row per system and setting):
  system         what was read: imagefolder = JPEG files through the ImageFolder baseline;
                 lmdb-/hdf5-jpeg|raw = ShardDataset over that store and record encoding;
                 /threads = decoding with threads instead of worker processes; recipe-* =
                 RandomResizedCrop + flip three ways; random-crop = ShardDataset random crop
  setting        DataLoader num_workers (or threads) for that row
  images/s       images delivered per second, median of the timed epochs (higher is better)
  MB/s           stored bytes read per second
  wait           share of a simulated training step spent waiting for data (only with --step-ms)
  x ceil         images/s against the decode ceiling: one core's tight decode loop x the cores
  x base         images/s against the ImageFolder baseline's best row
  CPU us/img     CPU time per image, main process and workers together (lower is better)
  PrivDirty MB   worker memory the run made private (copy-on-write copies), and its growth
  USS MB, PSS MB worker memory unique to the workers / shared memory counted proportionally
The lines under the table compare the best ShardDataset row with the decode ceiling and the
baseline; DATA/bench/throughput.txt keeps the whole report, throughput.png the plot.
EOF
echo "   ($((SECONDS - STEP_START)) s)"
echo
echo "demo done in $((SECONDS - START)) s"
