// kernels/kernel_api.h — what a kernel file uses of the runtime's kernel contract
// (runtime/kernel.h: contexts, OpKernel, OpTraits, the family registrar and ONYX_REGISTER_KERNELS;
// runtime/parallel.h: the thread pool), named in namespace onyx::kernels where every kernel
// lives. Kernel files include this instead of the runtime headers.
#pragma once
#include "runtime/kernel.h"
#include "runtime/parallel.h"

namespace onyx::kernels {

using runtime::broadcast_shapes;
using runtime::Device;
using runtime::gemm_like_flops;
using runtime::infer_node;
using runtime::InferContext;
using runtime::KernelContext;
using runtime::KernelFamilyRegistrar;
using runtime::NeedValue;
using runtime::normalize_axis;
using runtime::num_threads;
using runtime::op_traits;
using runtime::OpKernel;
using runtime::OpTraits;
using runtime::parallel_for;
using runtime::shape_product;

}  // namespace onyx::kernels
