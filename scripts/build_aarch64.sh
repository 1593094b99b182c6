#!/usr/bin/env bash
# Cross-compiles the minimal build (-DONYX_MINIMAL=ON: the training core, libonyx_c.so, its C tests
# and example, the unit tests) for 64-bit Arm Linux into build-aarch64/ (issue #42), installing
# what it needs first (idempotent, as root): Debian's g++-aarch64-linux-gnu, qemu-user-static, and
# the arm64 multiarch packages of the libraries (cmake/aarch64.cmake says why two of them come as
# runtime packages plus an unpacked -dev package). scripts/test_aarch64.sh runs the result.
#   bash scripts/build_aarch64.sh [ninja targets...]   (default: the C programs and onyx_tests)
#   bash scripts/build_aarch64.sh --prepare            the packages and the CMake configure only
#       (scripts/test.sh does that in the foreground, where apt-get cannot race another apt-get,
#       and compiles in the background)
#   bash scripts/build_aarch64.sh --full [targets...]  the full build into build-aarch64-full/
#       (default target: libonyx_c.so, for bench/device_bench.py's sizes), against an arm64
#       Debian 12 unpacked by debootstrap --foreign into build-aarch64-full/sysroot, since the
#       -dev packages of OpenMPI, ICU, OpenBLAS and Cairo cannot be installed beside their amd64
#       twins (about 350 MB; its libraries are not installed on this machine: nothing runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
# The toolchain file, on the first configure only (CMake keeps it, and warns when given it again).
toolchain() { [ -f "$1/CMakeCache.txt" ] || echo "-DCMAKE_TOOLCHAIN_FILE=cmake/aarch64.cmake"; }
if [ "${1:-}" = --full ]; then
  shift
  bash scripts/apt_install.sh cmake ninja-build g++-aarch64-linux-gnu debootstrap | sed 's/^/aarch64: /'
  OUT=build-aarch64-full
  ROOT=$PWD/$OUT/sysroot
  DEV=libstdc++-12-dev,nlohmann-json3-dev,libcli11-dev,libonnx-dev,libprotobuf-dev,libdnnl-dev,\
libopenblas-dev,libyaml-cpp-dev,zlib1g-dev,libcairo2-dev,libicu-dev,libfftw3-dev,libpng-dev,\
libjpeg-dev,libgtest-dev,libgmock-dev,libbenchmark-dev,libhwy-dev,libopenmpi-dev
  # (unpacked again when the list changes: the stamp holds the list it was made with)
  if [ "$(cat "$ROOT/.unpacked" 2>/dev/null)" != "$DEV" ]; then
    echo "aarch64: an arm64 Debian 12 with the -dev packages into $OUT/sysroot (debootstrap --foreign)"
    rm -rf "$ROOT" && mkdir -p "$ROOT"
    debootstrap --arch=arm64 --foreign --variant=minbase --include="$DEV" \
      bookworm "$ROOT" http://deb.debian.org/debian >"$ROOT.log" 2>&1
    for deb in "$ROOT"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
    # the links the packages' maintainer scripts (update-alternatives) would make
    lib=$ROOT/usr/lib/aarch64-linux-gnu inc=$ROOT/usr/include/aarch64-linux-gnu
    for f in libopenblas.so libopenblas.so.0; do ln -sf "openblas-pthread/$f" "$lib/$f"; done
    for h in cblas.h f77blas.h openblas_config.h; do ln -sf "openblas-pthread/$h" "$inc/$h"; done
    ln -sfn ../../lib/aarch64-linux-gnu/openmpi/include "$inc/mpi"
    echo "$DEV" >"$ROOT/.unpacked"
  fi
  echo "aarch64: configuring the full build with CMake into $OUT/"
  lib=$ROOT/usr/lib/aarch64-linux-gnu
  cmake -S . -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=Release -DONYX_AARCH64_SYSROOT="$ROOT" \
    -DMPI_CXX_SKIP_MPICXX=ON -DMPI_CXX_HEADER_DIR="$lib/openmpi/include" \
    -DMPI_CXX_LIB_NAMES="mpi_cxx;mpi" -DMPI_mpi_LIBRARY="$lib/libmpi.so.40" \
    -DMPI_mpi_cxx_LIBRARY="$lib/libmpi_cxx.so.40" $(toolchain "$OUT") >/dev/null
  TARGETS=("$@")
  ((${#TARGETS[@]})) || TARGETS=(onyx_c)
  bash scripts/ninja_progress.sh aarch64 -C "$OUT" "${TARGETS[@]}"
  echo "aarch64: done ($OUT/)"
  exit 0
fi
PREPARE_ONLY=0
[ "${1:-}" = --prepare ] && { PREPARE_ONLY=1; shift; }
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
cmake -S . -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=Release -DONYX_MINIMAL=ON \
  -DONYX_AARCH64_OVERLAY="$OVERLAY" $(toolchain "$OUT") >/dev/null
((PREPARE_ONLY)) && exit 0
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(onyx_c onyx_c_tests onyx_c_example onyx_c_train onyx_tests)
echo "aarch64: compiling ${TARGETS[*]} on $(nproc) cores"
bash scripts/ninja_progress.sh aarch64 -C "$OUT" "${TARGETS[@]}"
echo "aarch64: done ($OUT/)"
