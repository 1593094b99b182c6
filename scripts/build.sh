#!/usr/bin/env bash
# Installs dependencies (idempotent) and builds everything into build/ (CLI at build/onyx).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bash scripts/setup.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$BUILD" -j"$(nproc)" onyx onyx_tests onyx_bench
