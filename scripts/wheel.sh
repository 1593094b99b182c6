#!/usr/bin/env bash
# The Python package as a wheel for any recent x86-64 Linux (issue #42): `pip wheel .` (an
# isolated build, scikit-build-core and nanobind from PyPI, as a user's pip makes it), then
# `auditwheel repair`, which copies the shared libraries the extension links and a bare system
# lacks (oneDNN, protobuf, ONNX, yaml-cpp, OpenBLAS, ICU, FFTW, OpenMPI, libgomp, ...) into the
# wheel and tags it manylinux for the oldest glibc its symbols allow. Distribution name onyx-train
# (`onyx` on PyPI is an unrelated package); the import stays `onyx`.
#   bash scripts/wheel.sh [OUT_DIR]     (default wheelhouse/; the repaired wheel's path is the last line)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${1:-wheelhouse}
bash scripts/setup.sh | grep -v "up to date\|present\|ready" || true
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
echo "wheel: pip wheel . (an isolated build of the extension: minutes)" >&2
"$BUILD/venv/bin/python" -m pip wheel . --no-deps -w "$RAW" -q
echo "wheel: auditwheel repair (the shared libraries into the wheel)" >&2
mkdir -p "$OUT"
PATH="$PWD/$BUILD/venv-wheel/bin:$PATH" auditwheel repair -w "$OUT" "$RAW"/onyx_train-*.whl >&2
ls -t "$OUT"/onyx_train-*.whl | head -1
