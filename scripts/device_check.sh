#!/usr/bin/env bash
# device_check.sh — the CUDA checks of issue #37 in one call on a GPU machine (an H100 / H200 lent
# through the device tool: no package registry there, 64 MiB of files in, ~15 minutes of GPU time
# in all). Two halves:
#
#   bash scripts/device_check.sh pack   here, on a development machine: builds $BUILD (default
#       build-cuda) with -DONYX_CUDA=ON for sm_80 and sm_90, and packs onyx_tests and onyx_bench
#       with the Debian libraries they load (everything but glibc's and CUDA's own: cuBLASLt is
#       the machine's nvidia-cublas wheel) into .device/onyx-cuda.tar.xz (.gitignore; carried).
#   bash scripts/device_check.sh        there, from the repository root (results under $OUT):
#       1. the machine: GPU, driver, glibc, torch;
#       2. the CUDA gtests (CudaRuntime.*, and the op table's Rows/OpCuda.*: every row whose op
#          has a CUDA kernel, forward and training graph node by node against the CPU kernels);
#       3. tests/ops/test_forward_reference.py with ONYX_OP_TABLE_CUDA=1: the CUDA outputs against
#          the float64 references, beside the CPU ones;
#       4. onyx_bench's CUDA benchmarks (GEMM and copy ceilings, GPT-2-sized GEMMs and row
#          kernels);
#       5. bench/gpu_torch_baseline.py: PyTorch eager and torch.compile on the same GPU;
#       and writes GPU_RESULTS.md (the tables to copy into bench/GPU_RESULTS.md). Exits non-zero
#       when a test failed. Every stage has a time limit; the whole stays under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
PACK=.device/onyx-cuda.tar.xz

if [ "${1:-}" = pack ]; then
  set -e
  BUILD=${BUILD:-build-cuda}
  bash scripts/setup.sh >/dev/null
  CUBLAS=$(ls -d "$PWD"/build/venv-cuda/lib/python3*/site-packages/nvidia/cu13 | head -1)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DONYX_CUDA=ON \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DONYX_CUBLAS_ROOT="$CUBLAS" >/dev/null
  ninja -C "$BUILD" onyx_tests onyx_bench
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib"
  for b in onyx_tests onyx_bench; do
    strip --strip-unneeded -o "$stage/bin/$b.bin" "$BUILD/$b"
    # The wrapper puts the packed libraries on the path of this binary only (python3 there keeps
    # its own libstdc++).
    printf '#!/bin/sh\nd=$(dirname "$0")\nLD_LIBRARY_PATH="$d/../lib:${ONYX_CUBLAS_DIR:-}" exec "$d/%s.bin" "$@"\n' \
      "$b" >"$stage/bin/$b"
    chmod +x "$stage/bin/$b"
  done
  ldd "$BUILD/onyx_tests" "$BUILD/onyx_bench" | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libgcc_s|libcublasLt|libcublas|libcuda)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  mkdir -p .device
  tar -C "$stage" -cf - bin lib | xz -T0 -6 >"$PACK"
  rm -rf "$stage"
  echo "packed $PACK ($(du -h "$PACK" | cut -f1)); carry .device in the device call"
  exit 0
fi

OUTDIR=${OUT:-/tmp/onyx-device-out}
mkdir -p "$OUTDIR"
FAILED=0
stage() { echo; echo "== $*"; }

stage "machine" | tee "$OUTDIR/machine.txt"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit \
    --format=csv 2>&1
  ldd --version | head -1
  nproc
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1
} | tee -a "$OUTDIR/machine.txt"

[ -f "$PACK" ] || { echo "no $PACK: run 'bash scripts/device_check.sh pack' here first and carry .device"; exit 2; }
ROOT=/tmp/onyx-device
rm -rf "$ROOT" && mkdir -p "$ROOT" && xz -dc "$PACK" | tar -C "$ROOT" -xf -
ONYX_CUBLAS_DIR=$(python3 - <<'PY'
import glob, os, nvidia
for d in nvidia.__path__:
    for p in glob.glob(os.path.join(d, "cu13", "lib", "libcublasLt.so.*")):
        print(os.path.dirname(p)); raise SystemExit
PY
)
export ONYX_CUBLAS_DIR
echo "cuBLASLt from $ONYX_CUBLAS_DIR" | tee -a "$OUTDIR/machine.txt"

stage "CUDA gtests (CudaRuntime.*, Rows/OpCuda.*)"
timeout 120 "$ROOT/bin/onyx_tests" --gtest_filter='CudaRuntime.*:Rows/OpCuda.*' --gtest_brief=1 \
  >"$OUTDIR/gtest_cuda.log" 2>&1
rc=$?
grep -E '^\[  (PASSED|FAILED|SKIPPED) \]|Failure|error' "$OUTDIR/gtest_cuda.log" | head -40
[ $rc -eq 0 ] || { echo "gtests exited $rc"; FAILED=1; }

stage "op table on cuda against the float64 references"
ONYX_OP_TABLE_CUDA=1 ONYX="$ROOT/bin/onyx" timeout 150 python3 tests/ops/test_forward_reference.py \
  >"$OUTDIR/reference.log" 2>&1
rc=$?
grep -E '^FAIL|on cuda' "$OUTDIR/reference.log" | grep -E '^FAIL' | head -30
echo "on cuda: $(grep -c '^PASS .* on cuda' "$OUTDIR/reference.log") passed, $(grep -c '^FAIL .* on cuda' "$OUTDIR/reference.log") failed"
tail -1 "$OUTDIR/reference.log"
[ $rc -eq 0 ] || { echo "reference comparison exited $rc"; FAILED=1; }

stage "onyx CUDA kernels (onyx_bench --benchmark_filter=cuda)"
timeout 80 "$ROOT/bin/onyx_bench" --benchmark_filter=cuda --benchmark_min_time=0.3 \
  >"$OUTDIR/bench_cuda.log" 2>&1
grep -E 'bm_cuda|ERROR' "$OUTDIR/bench_cuda.log"

stage "PyTorch on the same GPU (eager, torch.compile)"
PYTHONUNBUFFERED=1 timeout 200 python3 bench/gpu_torch_baseline.py --out "$OUTDIR/torch_baseline.json" \
  2>&1 | grep -vE 'Warning|warn\(' | tail -12

{
  echo "# GPU results ($(date -u +%Y-%m-%d), scripts/device_check.sh)"
  echo
  echo '```'
  cat "$OUTDIR/machine.txt"
  echo '```'
  echo
  echo "## onyx CUDA tests"
  echo '```'
  grep -E '^\[  (PASSED|FAILED|SKIPPED) \]' "$OUTDIR/gtest_cuda.log"
  echo "op table on cuda vs float64: $(grep -c '^PASS .* on cuda' "$OUTDIR/reference.log") passed, $(grep -c '^FAIL .* on cuda' "$OUTDIR/reference.log") failed"
  echo '```'
  echo
  echo "## onyx CUDA kernels"
  echo '```'
  grep -E 'bm_cuda' "$OUTDIR/bench_cuda.log"
  echo '```'
  echo
  echo "## PyTorch"
  echo '```'
  cat "$OUTDIR/torch_baseline.json" 2>/dev/null
  echo '```'
} >"$OUTDIR/GPU_RESULTS.md"
echo
echo "device_check: $([ $FAILED -eq 0 ] && echo passed || echo FAILED) (results in $OUTDIR)"
exit $FAILED
