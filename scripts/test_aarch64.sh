#!/usr/bin/env bash
# Compiles the minimal arm64 build (scripts/build_aarch64.sh) and runs it under qemu-aarch64-static
# (issue #42): every unit test it has (the NEON path), then the C tests and the C example, whose
# printed losses must equal this machine's (tests/cli/test_c_api.py). Writes its logs into LOGDIR:
#   aarch64-build.log, gtest-aarch64.log (+ .rc), c-api-aarch64.log, and aarch64.done at the end.
# scripts/test.sh runs it in the background under `nice -n 19` after `build_aarch64.sh --prepare`
# (the apt-get part) while its own tests run, so the cross-compile and the emulated tests use the
# cores those tests leave idle, then counts the logs.
#   bash scripts/test_aarch64.sh LOGDIR     (BUILD: the x86 build with onyx and bench-exports)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LOGDIR=${1:?usage: scripts/test_aarch64.sh LOGDIR}
PY=$BUILD/venv/bin/python
rm -f "$LOGDIR"/aarch64.done "$LOGDIR"/gtest-aarch64.* "$LOGDIR"/c-api-aarch64.log
finish() { echo "$1" >"$LOGDIR/aarch64.done"; exit 0; }
bash scripts/build_aarch64.sh >"$LOGDIR/aarch64-build.log" 2>&1 || finish build-failed
# Bounded: a hang fails the run. Generous, as the tests share the cores with the foreground's.
ONYX_BENCH_EXPORTS=$PWD/$BUILD/bench-exports timeout 3600 \
  qemu-aarch64-static build-aarch64/onyx_tests --gtest_brief=1 >"$LOGDIR/gtest-aarch64.log" 2>&1
echo $? >"$LOGDIR/gtest-aarch64.rc"
ONYX="$BUILD/onyx" ONYX_C_BUILD=build-aarch64 ONYX_C_EMULATOR=qemu-aarch64-static \
  $PY tests/cli/test_c_api.py >"$LOGDIR/c-api-aarch64.log" 2>&1
finish ran
