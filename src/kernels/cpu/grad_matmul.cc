// grad_matmul.cc — fused gradient kernels of this family, "onyx" domain (being written).
#include "runtime/kernel.h"
namespace onyx::runtime {
void register_matmul_grad_kernels(KernelRegistry&) {}
}  // namespace onyx::runtime
