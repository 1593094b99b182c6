// grad_nn.cc — fused gradient kernels of this family, "onyx" domain (being written).
#include "runtime/kernel.h"
namespace onyx::runtime {
void register_nn_grad_kernels(KernelRegistry&) {}
}  // namespace onyx::runtime
