#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: python -m pytest -q "$@".
#
# The torchvision-parity tests run programs in .venv-tv (torch 2.14.1 + torchvision 0.29.1,
# scripts/torchvision_venv.sh) and the pillow-simd tests in .venv-simd
# (scripts/pillow_simd_venv.sh); without them those tests skip. So each one that is missing is
# built first where this machine can build it:
#   .venv-simd  a C compiler, the libjpeg and zlib headers (Debian: libjpeg-dev zlib1g-dev), AVX2;
#   .venv-tv    the package index reachable and 8 GiB free (PyPI's torch 2.14.1 is the CUDA build,
#               about 5.5 GB installed; a few minutes).
# SIDE_ENVS=skip builds neither. Where one is still missing, the run ends with one line saying how
# many tests skipped and the command that runs them. Under CI (CI set) a failed build is an error
# (.ci/run builds both before calling this, so nothing is built twice).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

can_build_simd() {
  command -v cc >/dev/null || { echo "no C compiler (cc)"; return 1; }
  printf '#include <jpeglib.h>\n#include <zlib.h>\n' | cc -E -x c - >/dev/null 2>&1 ||
    { echo "no libjpeg/zlib headers (Debian: apt-get install libjpeg-dev zlib1g-dev)"; return 1; }
  grep -qw avx2 /proc/cpuinfo 2>/dev/null || { echo "no AVX2 CPU (Linux /proc/cpuinfo)"; return 1; }
}

can_build_tv() {
  local free_kib
  free_kib=$(df -Pk . | awk 'NR == 2 {print $4}')
  [ "${free_kib:-0}" -ge $((8 * 1024 * 1024)) ] || { echo "under 8 GiB free here"; return 1; }
  .venv/bin/python -m pip index versions torchvision --timeout 10 --retries 0 >/dev/null 2>&1 ||
    { echo "the package index does not answer"; return 1; }
}

# build VENV SCRIPT CHECK: build VENV with SCRIPT when it is missing and CHECK passes.
build() {
  local venv=$1 script=$2 check=$3 why
  [ -x "$venv/bin/python" ] && return 0
  if ! why=$($check); then
    echo "test.sh: not building $venv: $why" >&2
    return 0
  fi
  echo "test.sh: building $venv with $script (SIDE_ENVS=skip to skip)" >&2
  if ! "$script" "$venv"; then
    rm -rf "$venv"  # it was missing before: a half-built one would fail its tests, not skip
    [ -z "${CI:-}" ] || { echo "test.sh: building $venv failed" >&2; exit 1; }
    echo "test.sh: building $venv failed; its tests will skip" >&2
  fi
}

# Only a run of the tests needs them (not --collect-only, --help, --version).
wants_envs=1
for arg in "$@"; do
  case $arg in --co | --collect-only | -h | --help | --version | -V) wants_envs=0 ;; esac
done
if [ "${SIDE_ENVS:-build}" != skip ] && [ $wants_envs = 1 ]; then
  build .venv-simd ./scripts/pillow_simd_venv.sh can_build_simd
  build .venv-tv ./scripts/torchvision_venv.sh can_build_tv
fi
# helpers.side_envs (tests/helpers/, on pytest's pythonpath) prints how many tests skipped for
# want of a side environment, and the command that runs them.
exec .venv/bin/python -m pytest -q -p helpers.side_envs "$@"
