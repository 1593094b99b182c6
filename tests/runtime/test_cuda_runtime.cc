// The CUDA runtime (kernels/cuda/runtime.h): what a build without CUDA says, and with a device
// the copies, the host-access guard and the kernels' refusal of host tensors. The kernels
// themselves are checked by the op table (tests/ops/test_op_table.cc, OpCuda).
#include <gtest/gtest.h>

#include "kernels/cuda/runtime.h"
#include "runtime/kernel.h"

using namespace onyx;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define SKIP_WITHOUT_DEVICE() \
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason()

}  // namespace

TEST(CudaRuntime, SaysWhyItIsUnavailable) {
  if (cuda::available()) {
    EXPECT_TRUE(cuda::built_with_cuda());
    EXPECT_EQ(cuda::unavailable_reason(), "");
    EXPECT_NE(cuda::describe().find("sm_"), std::string::npos) << cuda::describe();
    return;
  }
  EXPECT_FALSE(cuda::unavailable_reason().empty());
  std::string err = error_of([] { cuda::empty(DType::Float32, {2}); });
  if (!cuda::built_with_cuda())
    EXPECT_NE(err.find("built without CUDA"), std::string::npos) << err;
  else
    EXPECT_NE(err.find("CUDA is not available"), std::string::npos) << err;
}

// No device needed: the library the GEMMs load at first use is there and has every function.
TEST(CudaRuntime, CublasLtLoadsWithoutADevice) {
  if (!cuda::built_with_cuda()) {
    std::string err = error_of([] { cuda::cublaslt_version(); });
    EXPECT_NE(err.find("built without CUDA"), std::string::npos) << err;
    return;
  }
  EXPECT_GE(cuda::cublaslt_version(), 130000u);  // CUDA 13's cuBLAS
}

TEST(CudaRuntime, CopiesRoundTrip) {
  SKIP_WITHOUT_DEVICE();
  Tensor h = Tensor::from_vector<float>(DType::Float32, {2, 3}, {1, -2, 3.5f, 0, 1e-30f, 7});
  Tensor d = cuda::to_device(h);
  EXPECT_EQ(d.device(), Device::Cuda);
  EXPECT_EQ(d.shape(), h.shape());
  Tensor back = cuda::to_host(d);
  EXPECT_EQ(back.device(), Device::Cpu);
  EXPECT_EQ(std::memcmp(back.raw(), h.raw(), h.nbytes()), 0);
  Tensor z = cuda::to_host(cuda::zeros(DType::BFloat16, {5}));
  for (int i = 0; i < 5; i++) EXPECT_EQ(z.data<uint16_t>()[i], 0);
  Tensor empty = cuda::to_host(cuda::empty(DType::Float32, {0, 4}));
  EXPECT_EQ(empty.numel(), 0);
}

TEST(CudaRuntime, HostAccessOfADeviceTensorIsAnError) {
  SKIP_WITHOUT_DEVICE();
  Tensor d = cuda::to_device(Tensor::scalar_f32(2.f));
  std::string err = error_of([&] { d.get_as_double(0); });
  EXPECT_NE(err.find("copy it to the host first"), std::string::npos) << err;
  err = error_of([&] { d.clone(); });
  EXPECT_NE(err.find("on cuda"), std::string::npos) << err;
}

TEST(CudaRuntime, AKernelRefusesHostTensorsNamingTheNode) {
  SKIP_WITHOUT_DEVICE();
  const runtime::OpKernel* k = runtime::KernelRegistry::instance().find("", "Add", Device::Cuda);
  ASSERT_NE(k, nullptr);
  ir::Node n;
  n.name = "add_on_host";
  n.op_type = "Add";
  n.inputs = {"a", "b"};
  n.outputs = {"y"};
  Tensor a = Tensor::from_vector<float>(DType::Float32, {2}, {1, 2});
  Tensor y = cuda::empty(DType::Float32, {2});
  runtime::KernelContext ctx{n, 17, {&a, &a}, {&y}};
  std::string err = error_of([&] { k->compute(ctx); });
  EXPECT_NE(err.find("add_on_host"), std::string::npos) << err;
  EXPECT_NE(err.find("not cuda"), std::string::npos) << err;
}

TEST(CudaRuntime, CudaKernelsTakeTheCpuShapeInference) {
  for (const std::string& op : runtime::KernelRegistry::instance().op_names(Device::Cuda)) {
    auto dot = op.rfind('.');
    std::string domain = dot == std::string::npos ? "" : op.substr(0, dot);
    std::string name = dot == std::string::npos ? op : op.substr(dot + 1);
    const runtime::OpKernel* k =
        runtime::KernelRegistry::instance().find(domain, name, Device::Cuda);
    ASSERT_NE(k, nullptr) << op;
    EXPECT_TRUE((bool)k->infer) << op;
    EXPECT_TRUE(runtime::KernelRegistry::instance().find(domain, name) != nullptr)
        << op << " has a CUDA kernel but no CPU kernel";
  }
}
