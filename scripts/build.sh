#!/usr/bin/env bash
# Installs dependencies (idempotent) and builds everything into build/ (CLI at build/onyx).
# The CUDA backend (-DONYX_CUDA=ON) is compiled and linked where nvcc (PATH or /usr/local/cuda) and
# the nvidia-cublas wheel of scripts/setup.sh ($BUILD/venv-cuda) are present, GPU or not, so it
# cannot rot; ONYX_CUDA=OFF turns it off.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bash scripts/setup.sh
CUDA_ARGS=(-DONYX_CUDA=OFF)
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
CUBLAS=$(ls -d "$PWD/$BUILD"/venv-cuda/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -1 || true)
if [ "${ONYX_CUDA:-ON}" != OFF ] && [ -n "$NVCC" ] && [ -n "$CUBLAS" ]; then
  CUDA_ARGS=(-DONYX_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DONYX_CUBLAS_ROOT="$CUBLAS")
fi
echo "build: configuring with CMake into $BUILD/"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${CUDA_ARGS[@]}" >/dev/null
TARGETS=(onyx onyx_tests onyx_bench onyx_c_tests onyx_c_example onyx_c_train)
if ninja -C "$BUILD" -n "${TARGETS[@]}" | grep -q '^ninja: no work to do'; then
  echo "build: up to date"
else
  echo "build: compiling and linking on $(nproc) cores (a first build takes a while)"
  bash scripts/ninja_progress.sh build -C "$BUILD" "${TARGETS[@]}"
  echo "build: done ($BUILD/onyx)"
fi
