// parallel.cc — one knob for every thread pool in the process.
#include "runtime/parallel.h"

#include <dnnl.h>

namespace onyx::runtime {

void set_num_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);  // onyx kernels and oneDNN (GNU OpenMP build) share this pool
}

}  // namespace onyx::runtime
