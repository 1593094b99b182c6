# cmake/aarch64.cmake — cross-compiling onyx for 64-bit Arm Linux on an x86-64 Debian 12
# (scripts/build_aarch64.sh): Debian's g++-aarch64-linux-gnu against the arm64 multiarch packages
# (/usr/lib/aarch64-linux-gnu). Three of those cannot be installed beside their amd64 twins
# (libdnnl-dev and libonnx-dev ship arch-specific files at shared paths, libyaml-cpp-dev is not
# Multi-Arch: same), so the build uses their runtime packages (libdnnl2, libonnx1, libyaml-cpp0.7:
# arm64) with headers that are the same for both (oneDNN's amd64 ones differ only in
# DNNL_GPU_RUNTIME) and the CMake configs of the arm64 -dev packages unpacked into
# ONYX_AARCH64_OVERLAY. Programs run under qemu-aarch64-static.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
# Libraries and packages: arm64 ones only (the multiarch directory, and the overlay for ONNX);
# programs (protoc) from the host.
if(ONYX_AARCH64_OVERLAY)
  list(APPEND CMAKE_PREFIX_PATH ${ONYX_AARCH64_OVERLAY}/usr)
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

# The full build (scripts/build_aarch64.sh --full) compiles against a whole arm64 Debian unpacked
# into ONYX_AARCH64_SYSROOT instead (the -dev packages of OpenMPI, ICU, OpenBLAS and Cairo cannot
# be installed beside their amd64 twins at all): headers, libraries, CMake and pkg-config files
# from there only (OpenMPI by its library names: scripts/build_aarch64.sh --full names them, as its
# compiler wrapper is an x86 program).
if(ONYX_AARCH64_SYSROOT)
  set(CMAKE_SYSROOT ${ONYX_AARCH64_SYSROOT})
  set(CMAKE_FIND_ROOT_PATH ${ONYX_AARCH64_SYSROOT})
  set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
  set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
  set(ENV{PKG_CONFIG_SYSROOT_DIR} ${ONYX_AARCH64_SYSROOT})
  set(ENV{PKG_CONFIG_LIBDIR}
      "${ONYX_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${ONYX_AARCH64_SYSROOT}/usr/share/pkgconfig")
endif()
