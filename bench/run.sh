#!/usr/bin/env bash
# run.sh — the end-to-end training benchmark in one command: builds onyx and onyx_bench (Release),
# then runs bench/train_bench.py, which regenerates bench/RESULTS.md, bench/results.png and
# bench/results.json. Extra arguments go to train_bench.py, e.g.
#   bash bench/run.sh                                  # all models, 3 warmup + 10 steps, 50-step curves
#   bash bench/run.sh --models bert-mini --no-curves   # one model, timing only
#   bash bench/run.sh --onyx-threads 0,1               # also try onyx with one thread
#   BUILD=/work/build-bench bash bench/run.sh          # another build folder
#   SKIP_BUILD=1 bash bench/run.sh                     # use the binaries in $BUILD as they are
# Takes ~15 minutes on an idle 2-core machine with the defaults (most of it gpt2-tiny).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
PY="${PYTHON:-$BUILD/venv/bin/python}"
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  :  # use the binaries already in $BUILD
elif [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD/CMakeCache.txt"; then
  echo "warning: $BUILD is not a Release build: timings will not mean much" >&2
fi
[ "${SKIP_BUILD:-0}" = 1 ] || cmake --build "$BUILD" --target onyx onyx_bench -- -j"$(nproc)" >/dev/null
"$PY" -c 'import matplotlib' 2>/dev/null || echo "note: no matplotlib (apt-get install -y python3-matplotlib): no results.png" >&2
exec "$PY" "$ROOT/bench/train_bench.py" --onyx "$BUILD/onyx" --onyx-bench "$BUILD/onyx_bench" "$@"
