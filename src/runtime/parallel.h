// runtime/parallel.h — the one thread pool (DESIGN decision 8).
// onyx's kernels, oneDNN (Debian builds it on GNU OpenMP) and OpenMP all share libgomp's pool, so
// threads never oversubscribe the cores. `set_num_threads` is the single knob.
#pragma once
#include <omp.h>

#include <cstdint>

namespace onyx::runtime {

inline int num_threads() { return omp_get_max_threads(); }
void set_num_threads(int n);  // also sets oneDNN's and OpenBLAS's thread counts

// Runs f(begin, end) over [0, n) split into contiguous chunks, one per thread; runs inline when the
// work is small (n < grain) or when already inside a parallel region.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  int nt = num_threads();
  if (grain < 1) grain = 1;
  int64_t chunks = (n + grain - 1) / grain;
  if (nt <= 1 || chunks <= 1 || omp_in_parallel()) {
    f((int64_t)0, n);
    return;
  }
  if (chunks < nt) nt = (int)chunks;
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    int64_t per = (n + nt - 1) / nt;
    int64_t b = t * per, e = b + per < n ? b + per : n;
    if (b < e) f(b, e);
  }
}

}  // namespace onyx::runtime
