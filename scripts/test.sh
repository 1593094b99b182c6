#!/usr/bin/env bash
# Runs every onyx test: unit tests (ctest; then the gtests again on each other SIMD path of this
# CPU), the ONNX node conformance suite, PyTorch parity tests,
# and the loader tests under AddressSanitizer. Expects `make build` to have run (make test does).
# Ends with one line "total: N passed, M failed, K skipped"; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=$BUILD/venv/bin/python  # the reference venv made by scripts/setup.sh (torch 2.13, onnx, onnxruntime, ...)
bash scripts/build.sh || { echo "total: 0 passed, 1 failed"; exit 1; }
LOGDIR=$BUILD/test-logs
mkdir -p "$LOGDIR"
PASSED=0 FAILED=0 SKIPPED=0
# Each section's header carries the run's elapsed time (minutes:seconds), to see where CI's goes.
section() { printf '== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
tally() {  # reads "N passed, M failed, K skipped" from the last matching line of a log
  local line
  line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$1" | tail -1)
  if [ -z "$line" ]; then
    echo "  (no summary line in $1: counted as 1 failure)"
    FAILED=$((FAILED + 1))
    return
  fi
  local p f s
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
  f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+' || echo 0)
  PASSED=$((PASSED + p)) FAILED=$((FAILED + f)) SKIPPED=$((SKIPPED + ${s:-0}))
}

section "tokenizer references (GPT-2 BPE, all-MiniLM-L6-v2 WordPiece and Llama-family tokenizers trained here: ids from HF tokenizers)"
$PY tests/tokenizers/make_tokenizer_references.py "$BUILD" 2>&1 | tail -6

section "benchmark models exported from PyTorch at opset 14 (the passes' tests read them)"
$PY bench/make_exports.py "$BUILD/bench-exports" 2>&1 | tail -3

# The minimal build cross-compiled for arm64 (issue #42): its packages and CMake configure here,
# then scripts/test_aarch64.sh compiles it and runs its unit tests, C tests and C example under
# qemu-aarch64 in the background at nice 19 — on the cores the tests below leave idle — and its
# logs are counted at the end.
section "aarch64: preparing the minimal arm64 build; it compiles and runs under qemu in the background"
AARCH64_PID=""
if bash scripts/build_aarch64.sh --prepare >"$LOGDIR/aarch64-prepare.log" 2>&1; then
  grep -E '^aarch64: (adding|installing|unpacking)' "$LOGDIR/aarch64-prepare.log" | sed 's/^/  /'
  nice -n 19 bash scripts/test_aarch64.sh "$LOGDIR" >/dev/null 2>&1 &
  AARCH64_PID=$!
else
  tail -20 "$LOGDIR/aarch64-prepare.log"; FAILED=$((FAILED + 1))
fi

section "unit tests (ctest)"
(cd "$BUILD" && ctest --output-on-failure -j2 --timeout 300) >"$LOGDIR/ctest.log" 2>&1
rc=$?
tail -n 25 "$LOGDIR/ctest.log"
# Counted from ctest's per-test lines (its summary line differs between CMake 3 and 4); the
# summary line must still be there, else ctest did not finish.
if grep -qE 'tests passed(, [0-9]+ tests failed)? out of [0-9]+' "$LOGDIR/ctest.log"; then
  np=$(grep -cE 'Test +#[0-9]+: .* Passed' "$LOGDIR/ctest.log" || true)
  nf=$(grep -cE 'Test +#[0-9]+: .*\*\*\*(Failed|Exception|Timeout)' "$LOGDIR/ctest.log" || true)
  ns=$(grep -cE '\*\*\*Skipped|Not Run' "$LOGDIR/ctest.log" || true)
  [ "$rc" -ne 0 ] && [ "$nf" -eq 0 ] && nf=1
  PASSED=$((PASSED + np)) FAILED=$((FAILED + nf)) SKIPPED=$((SKIPPED + ns))
else
  echo "  ctest printed no summary (rc=$rc): counted as 1 failure"
  FAILED=$((FAILED + 1))
fi

section "SIMD paths: every gtest again on each other kernel path this CPU runs (ONYX_CPU=avx2|portable; src/kernels/cpu/simd/dispatch.h)"
VERSION_TEXT=$("$BUILD/onyx" --version)
DEFAULT_PATH=$(sed -n 's/^cpu path \([a-z0-9]*\) .*/\1/p' <<<"$VERSION_TEXT")
CPU_PATHS=$(sed -n 's/.*this CPU:\([^)]*\)).*/\1/p' <<<"$VERSION_TEXT")
echo "  default path: ${DEFAULT_PATH:-?}; this CPU runs:${CPU_PATHS:- ?}"
if [ -z "$DEFAULT_PATH" ] || [ -z "$CPU_PATHS" ]; then
  echo "  FAIL: \`onyx --version\` printed no cpu path line"; FAILED=$((FAILED + 1))
fi
gtest_tally() {  # gtest_tally LOG RC LABEL: a gtest run's counts from its log into the totals
  local log=$1 rc=$2 label=$3 np nf ns
  np=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$log" | tail -1)
  nf=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below:.*/\1/p' "$log" | tail -1)
  # ("N tests." under --gtest_brief, "N tests, listed below:" without it)
  ns=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}[.,].*/\1/p' "$log" | tail -1)
  np=${np:-0} nf=${nf:-0} ns=${ns:-0}
  [ "$rc" -ne 0 ] && [ "$nf" -eq 0 ] && nf=1
  grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | head -20
  echo "  $label: $np passed, $nf failed, $ns skipped"
  PASSED=$((PASSED + np)) FAILED=$((FAILED + nf)) SKIPPED=$((SKIPPED + ns))
}
for path in $CPU_PATHS; do
  [ "$path" = "$DEFAULT_PATH" ] && continue
  log="$LOGDIR/gtest-$path.log"
  ONYX_CPU=$path "$BUILD/onyx_tests" --gtest_brief=1 >"$log" 2>&1
  gtest_tally "$log" $? "$path"
done

section "ONNX node conformance (suite generated by onnx $($PY -c 'import onnx; print(onnx.__version__)') from PyPI)"
SUITE=$BUILD/onnx-node-tests
$PY tests/conformance/generate.py "$SUITE" >"$LOGDIR/generate.log" 2>&1 || { cat "$LOGDIR/generate.log"; FAILED=$((FAILED + 1)); }
tail -n 1 "$LOGDIR/generate.log"
"$BUILD/onyx" conformance "$SUITE/node" >"$LOGDIR/conformance.log" 2>&1
grep -E '^FAIL|skipped cases|^  [0-9]+ x' "$LOGDIR/conformance.log" | head -80
tail -n 1 "$LOGDIR/conformance.log"
tally "$LOGDIR/conformance.log"

section "clang-format: every C++ file in git formatted by .clang-format (fix: bash scripts/format.sh)"
if ! command -v clang-format >/dev/null; then
  echo "  FAIL: clang-format is not installed (scripts/setup.sh installs Debian's clang-format)"
  FAILED=$((FAILED + 1))
else
  bash scripts/format.sh --check >"$LOGDIR/format.log" 2>&1
  if [ $? -eq 0 ]; then
    echo "  $(tail -1 "$LOGDIR/format.log")"; PASSED=$((PASSED + 1))
  else
    head -20 "$LOGDIR/format.log"; FAILED=$((FAILED + 1))
  fi
fi

section "docs/OPS.md is the registry's op list (build/onyx ops --markdown)"
if "$BUILD/onyx" ops --markdown | diff - docs/OPS.md >"$LOGDIR/ops.diff"; then
  echo "  docs/OPS.md up to date: $("$BUILD/onyx" ops | tail -1)"; PASSED=$((PASSED + 1))
else
  echo "  FAIL: docs/OPS.md differs from the registry (regenerate: build/onyx ops --markdown > docs/OPS.md):"
  head -20 "$LOGDIR/ops.diff"; FAILED=$((FAILED + 1))
fi

# The Python test files, two at a time: most of them keep one core busy (a Python driver, tiny
# models, a subprocess at a time), so two lanes halve their ~19 minutes of serial time. They write
# only into their own temporary folders; the one dependency is test_readme.py, which imports the
# package test_package.py installs ($BUILD/python-target) and so starts once that has finished.
# The longest start first (seconds in a serial run: package 366, grpo 123, ...), the rest in name
# order; each file's log is reported whole, in the serial order, when all have finished.
PY_TESTS=(tests/ops/test_*.py tests/parity/test_*.py tests/cli/test_*.py tests/python/test_*.py)
PY_LONG_FIRST=(tests/python/test_package.py tests/parity/test_grpo.py tests/parity/test_dpo.py
               tests/cli/test_plan.py tests/parity/test_diffusion.py tests/parity/test_hf_exports.py
               tests/parity/test_grad_parity.py tests/cli/test_chat_template.py)
PY_LAST=tests/python/test_readme.py
PY_LANES=${ONYX_TEST_LANES:-2}
py_log() { echo "$LOGDIR/$(basename "$1").log"; }
py_running() { jobs -rp | grep -vc "^${AARCH64_PID:-none}\$"; }  # (the aarch64 job is not one)
run_py_test() {  # one file into its log, and its seconds beside it (.seconds) once it has finished
  local log start
  log=$(py_log "$1") start=$(date +%s)
  rm -f "$log.seconds"
  ONYX="$BUILD/onyx" $PY "$1" >"$log" 2>&1
  echo $(($(date +%s) - start)) >"$log.seconds"
}
py_queue=("${PY_LONG_FIRST[@]}")
for t in "${PY_TESTS[@]}"; do
  [[ " ${PY_LONG_FIRST[*]} $PY_LAST " == *" $t "* ]] || py_queue+=("$t")
done
py_queue+=("$PY_LAST")
section "Python tests (tests/ops, parity, cli, python), $PY_LANES at a time; each reported below with its seconds"
for t in "${py_queue[@]}"; do
  [ -f "$t" ] || continue
  while [ "$(py_running)" -ge "$PY_LANES" ]; do wait -n; done
  if [ "$t" = "$PY_LAST" ]; then
    while [ ! -f "$(py_log tests/python/test_package.py).seconds" ]; do wait -n; done
  fi
  run_py_test "$t" &
done
while [ "$(py_running)" -gt 0 ]; do wait -n; done
for t in "${PY_TESTS[@]}"; do
  [ -f "$t" ] || continue
  log=$(py_log "$t")
  echo "-- $t ($(cat "$log.seconds" 2>/dev/null || echo '?') s)"
  # every failure's line first (the tail alone hides those of early cases), then the tail
  grep -a -E '^FAIL' "$log" | cut -c1-1500 | head -n 20 || true
  tail -n 15 "$log"
  tally "$log"
done

section "loader tests under AddressSanitizer"
if [ "${ONYX_SKIP_ASAN:-0}" = 1 ]; then
  echo "  skipped: ONYX_SKIP_ASAN=1 was set"
  SKIPPED=$((SKIPPED + 1))
else
  cmake -S . -B "$BUILD-asan" -G Ninja -DONYX_ASAN=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null &&
    ninja -C "$BUILD-asan" onyx_loader_tests >"$LOGDIR/asan-build.log" 2>&1
  if [ $? -ne 0 ]; then
    tail -20 "$LOGDIR/asan-build.log"
    FAILED=$((FAILED + 1))
  else
    ASAN_OPTIONS=detect_leaks=0 "$BUILD-asan/onyx_loader_tests" >"$LOGDIR/asan.log" 2>&1
    rc=$?
    tail -n 5 "$LOGDIR/asan.log"
    np=$(grep -oE '\[  PASSED  \] [0-9]+' "$LOGDIR/asan.log" | grep -oE '[0-9]+$' || echo 0)
    nf=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$LOGDIR/asan.log" | grep -oE '[0-9]+' || echo 0)
    PASSED=$((PASSED + ${np:-0})) FAILED=$((FAILED + ${nf:-0}))
    if [ $rc -ne 0 ] && [ "${nf:-0}" = 0 ]; then FAILED=$((FAILED + 1)); grep -A20 ERROR "$LOGDIR/asan.log" | head -40; fi
  fi
fi

section "fuzzing: the model-folder readers under libFuzzer + ASan/UBSan, ${ONYX_FUZZ_SECONDS:-30} s per target (longer: bash scripts/fuzz.sh 1800)"
bash scripts/fuzz.sh "${ONYX_FUZZ_SECONDS:-30}" >"$LOGDIR/fuzz.log" 2>&1
tail -n 8 "$LOGDIR/fuzz.log"
tally "$LOGDIR/fuzz.log"

section "aarch64: the minimal build under qemu-aarch64-static (waiting for the background job)"
if [ -n "$AARCH64_PID" ]; then
  wait "$AARCH64_PID"
  grep -E '^aarch64: (compiling|done)' "$LOGDIR/aarch64-build.log" | sed 's/^/  /'
  if [ "$(cat "$LOGDIR/aarch64.done" 2>/dev/null)" = ran ]; then
    for log in "$LOGDIR"/gtest-aarch64-*.log; do
      path=${log##*/gtest-aarch64-} path=${path%.log}
      gtest_tally "$log" "$(cat "$log.rc")" "aarch64 unit tests, $path path"
    done
    grep -a -E '^(PASS|FAIL)' "$LOGDIR/c-api-aarch64.log" | sed 's/^/  aarch64 /' | cut -c1-400
    tally "$LOGDIR/c-api-aarch64.log"
  else
    echo "  FAIL: the aarch64 build did not finish:"; tail -20 "$LOGDIR/aarch64-build.log"
    FAILED=$((FAILED + 1))
  fi
fi

section "sizes: the longest functions and largest files (scripts/sizes.py; split what grows past 150 lines)"
python3 scripts/sizes.py --top 10

echo "total: $PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED" -eq 0 ]
