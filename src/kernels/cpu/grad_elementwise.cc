// grad_elementwise.cc — fused gradient kernels of this family, "onyx" domain (being written).
#include "runtime/kernel.h"
namespace onyx::runtime {
void register_elementwise_grad_kernels(KernelRegistry&) {}
}  // namespace onyx::runtime
