#!/usr/bin/env bash
# Fuzzes the readers of files from downloaded model folders (fuzz/: chat templates and
# conversations, tokenizer.json, safetensors, config.json / generation_config.json, WAV audio, PNG
# and JPEG images: the first byte picks the channels and the resize) with
# libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer.
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     (default: 60 s, every target)
# Installs clang-16 (Debian) for libFuzzer, builds build-fuzz/ (only the readers), runs the targets
# two at a time on copies of fuzz/corpus/<target> (the repository's corpus is not changed; new
# inputs worth keeping can be merged in with -merge=1), each input bounded by -timeout (a hang),
# -rss_limit_mb (memory) and -max_len. An input slower than libFuzzer's default 10 s but under the
# timeout is not a finding (-report_slow_units 30): a 776-byte JPEG declaring 32791x3584 pixels —
# within PIL's decompression-bomb limit, which onyx keeps — took 11 s to decode under ASan. A crash, hang, leak, memory overrun or sanitizer report
# fails the target and leaves its reproducer in build-fuzz/findings/<target>/.
# Ends with "N passed, M failed" (one per target) and each target's executions.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(chat_template tokenizer safetensors config wav image)
BUILD=${ONYX_FUZZ_BUILD:-build-fuzz}
bash scripts/apt_install.sh clang-16 libclang-rt-16-dev llvm-16  # libFuzzer; llvm-symbolizer
bash scripts/setup.sh >/dev/null
mkdir -p "$BUILD"
CC=clang-16 CXX=clang++-16 cmake -S . -B "$BUILD" -G Ninja -DONYX_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD/configure.log" 2>&1 ||
  { tail -20 "$BUILD/configure.log"; echo "0 passed, 1 failed"; exit 1; }
ninja -C "$BUILD" "${TARGETS[@]/#/fuzz_}" >"$BUILD/build.log" 2>&1 ||
  { grep -A5 -E "error|FAILED" "$BUILD/build.log" | head -30; echo "0 passed, 1 failed"; exit 1; }

declare -A MAX_LEN=([chat_template]=8192 [tokenizer]=32768 [safetensors]=4096 [config]=4096
                   [wav]=4096 [image]=4096)
declare -A DICT=([chat_template]=fuzz/jinja.dict [tokenizer]=fuzz/json.dict
                 [safetensors]=fuzz/json.dict [config]=fuzz/json.dict [wav]=fuzz/wav.dict
                 [image]=fuzz/image.dict)
run_target() {  # run_target NAME: prints its summary line into $BUILD/findings/NAME.result
  local t=$1 work=$BUILD/fuzz-work/$1 findings=$BUILD/findings/$1
  rm -rf "$work" "$findings" && mkdir -p "$work" "$findings"
  cp fuzz/corpus/"$t"/* "$work"/
  ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-16/bin/llvm-symbolizer \
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$BUILD/fuzz_$t" "$work" -max_total_time="$SECONDS_PER_TARGET" -timeout=30 -report_slow_units=30 \
    -rss_limit_mb=4096 -malloc_limit_mb=4096 -max_len="${MAX_LEN[$t]}" -dict="${DICT[$t]}" \
    -artifact_prefix="$findings/" -print_final_stats=1 >"$BUILD/findings/$t.log" 2>&1
  local rc=$?
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$BUILD/findings/$t.log" | tail -1)
  if [ $rc -eq 0 ] && [ -z "$(ls -A "$findings")" ]; then
    echo "ok   fuzz_$t: ${execs:-?} executions in ${SECONDS_PER_TARGET} s, no finding" >"$findings.result"
  else
    {
      echo "FAIL fuzz_$t (rc $rc): $(ls "$findings" | head -3 | tr '\n' ' ')"
      grep -E "ERROR|SUMMARY|runtime error|deadly signal|Timeout|out-of-memory" "$BUILD/findings/$t.log" | head -5
    } >"$findings.result"
  fi
}
for ((i = 0; i < ${#TARGETS[@]}; i += 2)); do  # two at a time: the machines have 2 cores
  run_target "${TARGETS[i]}" &
  [ $((i + 1)) -lt ${#TARGETS[@]} ] && run_target "${TARGETS[i + 1]}" &
  wait
done
passed=0 failed=0
for t in "${TARGETS[@]}"; do
  cat "$BUILD/findings/$t.result"
  if grep -q '^ok' "$BUILD/findings/$t.result"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
