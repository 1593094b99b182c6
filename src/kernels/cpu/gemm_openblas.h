// kernels/cpu/gemm_openblas.h — OpenBLAS's sgemm, gemm.cc's second backend (ONYX_GEMM=openblas).
#pragma once
#include <cstdint>

namespace onyx::kernels {

// false in a build without OpenBLAS (-DONYX_MINIMAL=ON: gemm_openblas_absent.cc)
bool openblas_available();
// row-major C = alpha·op(A)·op(B) + beta·C through cblas_sgemm
void openblas_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc);

}  // namespace onyx::kernels
