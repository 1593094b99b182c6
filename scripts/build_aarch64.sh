#!/usr/bin/env bash
# Cross-compiles the minimal build (-DONYX_MINIMAL=ON: the training core, libonyx_c.so, its C tests
# and example, the unit tests) for 64-bit Arm Linux into build-aarch64/ (issue #42), installing
# what it needs first (idempotent, as root): Debian's g++-aarch64-linux-gnu, qemu-user-static, and
# the arm64 multiarch packages of the libraries (cmake/aarch64.cmake says why two of them come as
# runtime packages plus an unpacked -dev package). scripts/test_aarch64.sh runs the result.
#   bash scripts/build_aarch64.sh [ninja targets...]   (default: the C programs and onyx_tests)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${BUILD_AARCH64:-build-aarch64}
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "aarch64: adding Debian's arm64 architecture (dpkg --add-architecture arm64)"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
fi
bash scripts/apt_install.sh cmake ninja-build g++-aarch64-linux-gnu qemu-user-static \
  nlohmann-json3-dev libonnx-dev libdnnl-dev \
  libprotobuf-dev:arm64 libhwy-dev:arm64 libgtest-dev:arm64 zlib1g-dev:arm64 \
  libdnnl2:arm64 libonnx1:arm64 libyaml-cpp0.7:arm64 | sed 's/^/aarch64: /'

# The -dev packages that cannot be installed beside their amd64 twins (libonnx-dev with the
# libonnxifi it names, libyaml-cpp-dev: not Multi-Arch: same), unpacked into $OUT/overlay; their
# library links are pointed at the installed arm64 runtime packages' files.
OVERLAY=$PWD/$OUT/overlay
if [ ! -f "$OVERLAY/.unpacked" ]; then
  echo "aarch64: unpacking libonnx-dev, libonnxifi and libyaml-cpp-dev (arm64) into $OUT/overlay"
  rm -rf "$OVERLAY" && mkdir -p "$OVERLAY/debs"
  (cd "$OVERLAY/debs" && apt-get download -q libonnx-dev:arm64 libonnxifi:arm64 libyaml-cpp-dev:arm64 2>&1 |
    grep -v "^W: Download is performed unsandboxed" || true)
  for deb in "$OVERLAY"/debs/*_arm64.deb; do dpkg-deb -x "$deb" "$OVERLAY"; done
  for lib in /usr/lib/aarch64-linux-gnu/libonnx*.so.* /usr/lib/aarch64-linux-gnu/libyaml-cpp.so.*; do
    ln -sf "$lib" "$OVERLAY/usr/lib/aarch64-linux-gnu/"
  done
  touch "$OVERLAY/.unpacked"
fi

echo "aarch64: configuring with CMake into $OUT/ (minimal build, cross-compiled)"
cmake -S . -B "$OUT" -G Ninja --no-warn-unused-cli -DCMAKE_BUILD_TYPE=Release -DONYX_MINIMAL=ON \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake -DONYX_AARCH64_OVERLAY="$OVERLAY" >/dev/null
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(onyx_c onyx_c_tests onyx_c_example onyx_c_train onyx_tests)
echo "aarch64: compiling ${TARGETS[*]} on $(nproc) cores"
bash scripts/ninja_progress.sh aarch64 -C "$OUT" "${TARGETS[@]}"
echo "aarch64: done ($OUT/)"
