// kernels/cpu/gemm_openblas.cc — see gemm_openblas.h. OpenBLAS (Debian's pthread build) keeps its
// own thread pool; it is resized to the OpenMP thread count before each call so the two pools
// never ask for more threads than cores.
#include "kernels/cpu/gemm_openblas.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>

namespace onyx::kernels {

namespace {
// Keeps OpenBLAS's pthread pool at the OpenMP thread count (1 inside a parallel region, where the
// caller's threads already occupy the cores).
void sync_openblas_threads() {
  static std::atomic<int> current{0};
  int want = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (current.load(std::memory_order_relaxed) != want) {
    openblas_set_num_threads(want);
    current.store(want, std::memory_order_relaxed);
  }
}
}  // namespace

bool openblas_available() { return true; }

void openblas_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) {
  sync_openblas_threads();
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C,
              (blasint)ldc);
}

}  // namespace onyx::kernels
