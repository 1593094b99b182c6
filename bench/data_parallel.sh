#!/usr/bin/env bash
# data_parallel.sh — data-parallel scaling of `onyx train` (mpirun, DDP / ZeRO-1) against one
# rank on one core and on all cores, side by side in one run (bench/dp_bench.py says what and how).
#   bash bench/data_parallel.sh                      # bert-mini
#   bash bench/data_parallel.sh --model gpt2-tiny
# Needs OpenMPI (scripts/setup.sh) and a Release build in $BUILD (default build/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
PY="${PYTHON:-$ROOT/build/venv/bin/python}"
flock "${ONYX_BUILD_LOCK:-/tmp/onyx-build.lock}" cmake --build "$BUILD" --target onyx >/dev/null
ONYX="$BUILD/onyx" exec "$PY" "$ROOT/bench/dp_bench.py" "$@"
