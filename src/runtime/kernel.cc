// kernel.cc — kernel registry and the context helpers shared by every op.
#include "runtime/kernel.h"

#include <mutex>

#include "runtime/parallel.h"

namespace onyx::runtime {

const TensorMeta& InferContext::input(int i) const {
  ONYX_CHECK(has_input(i), node.describe(), ": required input ", i, " is missing");
  return *inputs[i];
}

const Tensor& InferContext::value(int i) const {
  ONYX_CHECK(has_input(i), node.describe(), ": required input ", i, " is missing");
  if (i >= (int)values.size() || values[i] == nullptr) throw NeedValue{i};
  return *values[i];
}

void InferContext::set_output(int i, DType dtype, Shape shape) {
  if (outputs.size() < node.outputs.size()) outputs.resize(node.outputs.size());
  ONYX_CHECK(i < (int)outputs.size(), node.describe(), ": output ", i, " does not exist");
  for (int64_t d : shape)
    ONYX_CHECK(d >= 0, node.describe(), ": inferred a negative dimension for output ", i, ": ",
               shape_str(shape));
  outputs[i] = TensorMeta{dtype, std::move(shape)};
}

const Tensor& KernelContext::input(int i) const {
  ONYX_CHECK(has_input(i), node.describe(), ": required input ", i, " is missing");
  return *inputs[i];
}

Tensor& KernelContext::output(int i) {
  ONYX_CHECK(has_output(i), node.describe(), ": output ", i, " is not requested");
  return *outputs[i];
}

KernelRegistry& KernelRegistry::instance() {
  static KernelRegistry* reg = [] {
    auto* r = new KernelRegistry();
    register_elementwise_kernels(*r);
    register_matmul_kernels(*r);
    register_conv_kernels(*r);
    register_shape_kernels(*r);
    register_reduce_kernels(*r);
    register_nn_kernels(*r);
    register_attention_kernels(*r);
    register_dropout_add_kernels(*r);
    register_loss_kernels(*r);
    register_linear_cross_entropy_kernels(*r);
    register_pool_kernels(*r);
    register_resize_kernels(*r);
    register_conv_transpose_kernels(*r);
    register_group_norm_kernels(*r);
    register_accumulate_kernels(*r);
    register_llama_kernels(*r);
    return r;
  }();
  return *reg;
}

static std::string key(const std::string& domain, const std::string& op) {
  std::string d = domain == "ai.onnx" ? "" : domain;
  return d.empty() ? op : d + "." + op;
}

OpTraits& KernelRegistry::add(const std::string& domain, const std::string& op, OpKernel k) {
  OpKernel& slot = kernels_[key(domain, op)];
  slot = std::move(k);
  return slot.traits;
}

std::vector<TensorMeta> infer_node(const OpKernel& k, const ir::Node& node, int64_t opset,
                                   const std::vector<const TensorMeta*>& inputs,
                                   const std::vector<const Tensor*>& values) {
  InferContext ic{node, opset, inputs, values, {}};
  ic.outputs.resize(node.outputs.size());
  k.infer(ic);
  return std::move(ic.outputs);
}

const OpTraits& op_traits(const ir::Node& node) {
  static const OpTraits none;
  const OpKernel* k = KernelRegistry::instance().find(node.domain, node.op_type);
  return k ? k->traits : none;
}

const char* precision_name(OpTraits::Precision p) {
  switch (p) {
    case OpTraits::Precision::LowPrecision:
      return "bf16-ok";
    case OpTraits::Precision::Fp32:
      return "fp32";
    default:
      return "follow";
  }
}

const OpKernel* KernelRegistry::find(const std::string& domain, const std::string& op) const {
  auto it = kernels_.find(key(domain, op));
  return it == kernels_.end() ? nullptr : &it->second;
}

std::vector<std::string> KernelRegistry::op_names() const {
  std::vector<std::string> v;
  for (auto& [k, _] : kernels_) v.push_back(k);
  return v;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; i++) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    ONYX_CHECK(da == db || da == 1 || db == 1, "shapes ", shape_str(a), " and ", shape_str(b),
               " cannot be broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const ir::Node& node) {
  ONYX_CHECK(axis >= -rank && axis < std::max<int64_t>(rank, 1), node.describe(), ": axis ", axis,
             " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

}  // namespace onyx::runtime
