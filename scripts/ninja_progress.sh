#!/usr/bin/env bash
# Runs ninja on every core with its [k/N] lines folded into one line per tenth done ("PREFIX: 30%
# (k/N)"); anything else (a compiler's warnings and errors) passes through. Exits with ninja's
# status. scripts/build.sh and scripts/build_aarch64.sh use it.
#   bash scripts/ninja_progress.sh PREFIX NINJA_ARGS...
set -euo pipefail
prefix=$1
shift
ninja -j"$(nproc)" "$@" | awk -v prefix="$prefix" '
  /^\[[0-9]+\/[0-9]+\]/ { split(substr($1, 2), kn, "/"); d = kn[2] + 0 < 20 ? 0 : int(10 * kn[1] / kn[2]);
                           if (d > shown) { shown = d; printf "%s: %d%% (%s)\n", prefix, 10 * d, substr($1, 2, length($1) - 2); fflush() }
                           next }
  /^ninja: (Entering|no work)/ { next }
  { print; fflush() }'
