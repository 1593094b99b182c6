#!/usr/bin/env bash
# run.sh — the end-to-end training benchmark in one command: builds onyx and onyx_bench (Release),
# then runs bench/train_bench.py, which trains each model on onyx, PyTorch eager, torch.compile and
# ONNX Runtime Training (same ONNX file / module, weights and batches), checks onyx's gradients
# against ORT Training's, and regenerates bench/RESULTS.md, bench/results.png and
# bench/results.json. Extra arguments go to train_bench.py, e.g.
#   bash bench/run.sh                                   # all 5 models, all 4 peers (~30 min, 2 cores)
#   bash bench/run.sh --models bert-mini --no-curves    # one model, timing only
#   bash bench/run.sh --peers onyx,torch                # a subset of onyx,torch,compile,ortt
#   bash bench/run.sh --onyx-threads 0                  # onyx at its default threads only
#   bash bench/run.sh --warmup 1 --steps 2 --out /tmp/bench-out   # a quick check, elsewhere
#   BUILD=/work/build-bench bash bench/run.sh           # another build folder
#   SKIP_BUILD=1 bash bench/run.sh                      # use the binaries in $BUILD as they are
#   PYTHON=... ORTT_PYTHON=... bash bench/run.sh        # other Pythons (torch / onnxruntime-training)
# Python: build/venv (torch 2.13, onnx, matplotlib) runs the harness, PyTorch and torch.compile;
# build/venv-ortt (onnxruntime-training 1.19.2) runs bench/ortt_train.py. scripts/setup.sh makes both.
# The build takes /tmp/onyx-build.lock (ONYX_BUILD_LOCK), shared with other builds on the machine.
# Exits 1 (after writing the results) if onyx's gradients differ from ORT Training's by > 1e-4.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
PY="${PYTHON:-$ROOT/build/venv/bin/python}"
ORTT_PY="${ORTT_PYTHON:-$ROOT/build/venv-ortt/bin/python}"
LOCK="${ONYX_BUILD_LOCK:-/tmp/onyx-build.lock}"

peers="onyx,torch,compile,ortt"
prev=""
for a in "$@"; do
  case "$a" in --peers=*) peers="${a#--peers=}" ;; esac
  [ "$prev" = "--peers" ] && peers="$a"
  prev="$a"
done
if [ ! -x "$PY" ] || ! "$PY" -c 'import torch, onnx' 2>/dev/null; then
  echo "error: no Python with torch and onnx at $PY (the reference venv): run scripts/setup.sh," >&2
  echo "       or point PYTHON at one" >&2
  exit 2
fi
if [[ ",$peers," == *",ortt,"* ]]; then
  if [ ! -x "$ORTT_PY" ] || ! "$ORTT_PY" -c 'import onnxruntime.training.api' 2>/dev/null; then
    echo "error: no ONNX Runtime Training at $ORTT_PY (build/venv-ortt): run scripts/setup.sh," >&2
    echo "       point ORTT_PYTHON at one, or leave ortt out of --peers" >&2
    exit 2
  fi
fi

if [ "${SKIP_BUILD:-0}" = 1 ]; then
  :  # use the binaries already in $BUILD
elif [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD/CMakeCache.txt"; then
  echo "warning: $BUILD is not a Release build: timings will not mean much" >&2
fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if command -v flock >/dev/null; then
    flock "$LOCK" cmake --build "$BUILD" --target onyx onyx_bench -- -j"$(nproc)" >/dev/null
  else
    cmake --build "$BUILD" --target onyx onyx_bench -- -j"$(nproc)" >/dev/null
  fi
fi
"$PY" -c 'import matplotlib' 2>/dev/null || echo "note: no matplotlib in $PY: no results.png" >&2
exec "$PY" "$ROOT/bench/train_bench.py" --onyx "$BUILD/onyx" --onyx-bench "$BUILD/onyx_bench" \
  --ortt-python "$ORTT_PY" "$@"
