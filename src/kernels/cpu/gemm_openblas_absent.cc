// kernels/cpu/gemm_openblas_absent.cc — a build without OpenBLAS (-DONYX_MINIMAL=ON): gemm.cc
// refuses ONYX_GEMM=openblas before it would call here.
#include "kernels/cpu/gemm_openblas.h"
#include "onyx/error.h"

namespace onyx::kernels {

bool openblas_available() { return false; }

void openblas_sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                    const float*, int64_t, float, float*, int64_t) {
  throw Error("OpenBLAS is not in this minimal build (-DONYX_MINIMAL=ON)");
}

}  // namespace onyx::kernels
