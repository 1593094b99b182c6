#!/usr/bin/env bash
# bench/op_table.sh — the op table's benchmark mode (tests/ops/test_op_table.cc, OpTableBench):
# every row of tests/ops/cases_*.inc timed on this machine, the forward alone and, for rows with a
# differentiable input, a whole training-graph step (forward + backward), REPS repetitions after a
# warm-up, with the forward's effective bandwidth (inputs + outputs bytes / time) as a fraction of
# memcpy's, measured in the same run. CI runs the same rows once each (the smoke run in ctest).
#   bash bench/op_table.sh [OUT.tsv]      (default build/op_table_bench.tsv; REPS=50)
# Prints the 20 slowest forwards. The rows are small test shapes: this finds outliers between
# kernels (an unvectorized path, a plan that copies), it is not a model benchmark (bench/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${1:-$BUILD/op_table_bench.tsv}
ONYX_OP_TABLE_REPS=${REPS:-50} ONYX_OP_TABLE_BENCH="$OUT" "$BUILD/onyx_tests" \
  --gtest_filter=OpTableBench.Rows --gtest_brief=1
head -1 "$OUT"
echo "slowest forwards (row, op, forward µs, train step µs, forward GB/s, of memcpy):"
tail -n +3 "$OUT" | sort -t$'\t' -k3,3 -g -r | head -20 | column -t -s$'\t'
echo "written: $OUT ($(($(wc -l <"$OUT") - 2)) rows)"
