#!/usr/bin/env bash
# Installs the Debian packages that onyx's build, tests and benchmarks need.
# Idempotent; run as root (or with sudo available) on Debian 12.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build ccache pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler
  libdnnl-dev libopenblas-dev libomp-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-onnx python3-torch
  dataset-fashion-mnist wordnet-base
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: all packages present"

# ONNX Runtime (from npm's onnxruntime-node, which carries libonnxruntime.so) checks exported
# models in the tests. --ignore-scripts: its install script only fetches optional CUDA binaries.
if ! command -v npm >/dev/null; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
cd "$(dirname "$0")/.."
if [ ! -d build/npm/node_modules/onnxruntime-node ]; then
  mkdir -p build/npm
  npm install --prefix build/npm --ignore-scripts --no-audit --no-fund onnxruntime-node@1.30.0 >/dev/null 2>&1 ||
    echo "setup: npm install onnxruntime-node failed (export checks will be skipped)"
fi
if [ ! -d build/npm/node_modules/js-tiktoken ]; then
  npm install --prefix build/npm --ignore-scripts --no-audit --no-fund js-tiktoken >/dev/null 2>&1 ||
    echo "setup: npm install js-tiktoken failed (BPE reference checks will be skipped)"
fi
