#!/usr/bin/env bash
# Compiles the minimal arm64 build (scripts/build_aarch64.sh) and runs it under qemu-aarch64-static
# (issue #42): its unit tests on emulated CPUs that pick each kernel path (src/kernels/cpu/simd/
# dispatch.cc), then the C tests and the C example, whose printed losses must equal this machine's
# (tests/cli/test_c_api.py). qemu's `max` CPU has SVE2 with 512-bit vectors (path sve2); with
# sve256=on it is a 256-bit SVE machine (path sve_256, as Neoverse V1), with sve128=on a 128-bit
# SVE2 one (sve2_128, as Neoverse N2 / Grace), with sve=off a NEON one. Every unit test runs on
# neon; on sve2 the kernel families' tests (the op table included: qemu emulates SVE several times
# slower than NEON, too slow for the model-level tests), on sve_256 and sve2_128 the tests that
# run the kernels on every path (each also runs sve2, sve, neon and portable there: the other
# widths' tails and reductions).
# Writes its logs into LOGDIR: aarch64-build.log, gtest-aarch64-PATH.log (+ .rc) per path,
# c-api-aarch64.log, and aarch64.done at the end.
# scripts/test.sh runs it in the background under `nice -n 19` after `build_aarch64.sh --prepare`
# (the apt-get part) while its own tests run, so the cross-compile and the emulated tests use the
# cores those tests leave idle, then counts the logs.
#   bash scripts/test_aarch64.sh LOGDIR     (BUILD: the x86 build with onyx and bench-exports)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LOGDIR=${1:?usage: scripts/test_aarch64.sh LOGDIR}
PY=$BUILD/venv/bin/python
rm -f "$LOGDIR"/aarch64.done "$LOGDIR"/gtest-aarch64* "$LOGDIR"/c-api-aarch64.log
finish() { echo "$1" >"$LOGDIR/aarch64.done"; exit 0; }
bash scripts/build_aarch64.sh >"$LOGDIR/aarch64-build.log" 2>&1 || finish build-failed
# The tests that run the kernels on every path the CPU has (each path selected in turn), and the
# op-level tests of the kernel families (the op table, softmax, norms, dropout, attention, ...)
KERNEL_TESTS='SimdPaths.*:SimdNn.*:VecMath.*:Optimizer.*:Bnb4Kernels.*'
OP_TESTS="$KERNEL_TESTS:ElementwiseKernels.*:NnGradKernels.*:Softmax.*:LogSoftmax.*:LayerNorm.*"
OP_TESTS+=":SoftmaxCrossEntropy.*:Dropout.*:DropoutAdd.*:DropoutGrad.*:Attention.*:AttentionDropout.*"
OP_TESTS+=":AttentionBf16.*:Rows/*:Cases/*:Shapes/*:RandomDraws.*"
OP_TESTS+=":Philox.*:Reduce.*:LinearCrossEntropyKernel.*:Bf16Gemm.*"
# unit_tests PATH QEMU_CPU [FILTER]: the unit tests on an emulated CPU whose best path is PATH.
# Bounded: a hang fails the run. Generous, as the tests share the cores with the foreground's.
unit_tests() {
  local log=$LOGDIR/gtest-aarch64-$1.log
  # (ONYX_EXPECT_CPU_PATH: SimdPaths.EveryPathIsCompiledAndTheBestIsChosen checks the choice)
  QEMU_CPU=$2 ONYX_EXPECT_CPU_PATH=$1 ONYX_BENCH_EXPORTS=$PWD/$BUILD/bench-exports timeout 3600 \
    qemu-aarch64-static build-aarch64/onyx_tests --gtest_brief=1 --gtest_filter="${3:-*}" \
    >"$log" 2>&1
  echo $? >"$log.rc"
}
unit_tests neon max,sve=off
unit_tests sve2 max "$OP_TESTS"
unit_tests sve_256 max,sve256=on "$KERNEL_TESTS"
unit_tests sve2_128 max,sve128=on "$KERNEL_TESTS"
ONYX="$BUILD/onyx" ONYX_C_BUILD=build-aarch64 ONYX_C_EMULATOR=qemu-aarch64-static \
  $PY tests/cli/test_c_api.py >"$LOGDIR/c-api-aarch64.log" 2>&1
finish ran
