// kernels/cuda/cublaslt.h — cuBLASLt, loaded on first use (dlopen of libcublasLt.so.13) instead of
// linked: the library is 550 MB, and a linked one is mapped and relocated by every process of a
// CUDA build (+60 ms and +200 MB RSS at each start, measured on onyx_tests), CPU-only runs and
// the thousands of test processes included; loaded here it costs only the runs that use a GPU,
// and a CUDA build runs on machines without the wheel. Found through the loader's search path:
// LD_LIBRARY_PATH, then the executable's RUNPATH (the build tree's venv-cuda wheel, CMake).
// For the .cu files and runtime.cc (needs cublasLt.h: CUDA builds only).
#pragma once
#include <cublasLt.h>

namespace onyx::cuda {

// clang-format off
#define ONYX_CUBLASLT_FUNCTIONS(X) \
  X(Create) \
  X(Destroy) \
  X(GetStatusString) \
  X(GetVersion) \
  X(Matmul) \
  X(MatmulAlgoGetHeuristic) \
  X(MatmulDescCreate) \
  X(MatmulDescDestroy) \
  X(MatmulDescSetAttribute) \
  X(MatmulPreferenceCreate) \
  X(MatmulPreferenceDestroy) \
  X(MatmulPreferenceSetAttribute) \
  X(MatrixLayoutCreate) \
  X(MatrixLayoutDestroy) \
  X(MatrixLayoutSetAttribute)
// clang-format on

// cublasLt<Name> as lt_api().<Name>.
struct CublasLtApi {
#define ONYX_CUBLASLT_POINTER(name) decltype(&cublasLt##name) name = nullptr;
  ONYX_CUBLASLT_FUNCTIONS(ONYX_CUBLASLT_POINTER)
#undef ONYX_CUBLASLT_POINTER
};

// Loads the library on first call; throws an Error saying what to install when it is missing.
const CublasLtApi& lt_api();

}  // namespace onyx::cuda
