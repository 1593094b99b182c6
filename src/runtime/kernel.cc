// kernel.cc — kernel registry and the context helpers shared by every op.
#include "runtime/kernel.h"

#include <algorithm>
#include <map>

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

namespace {

struct Family {
  const char* name;
  Device device;
  KernelFamilyFn fn;
};

// Filled at static initialization (a function-local static: safe whatever the order of files).
std::vector<Family>& families() {
  static std::vector<Family> all;
  return all;
}

std::string key(const std::string& domain, const std::string& op) {
  std::string d = domain == "ai.onnx" ? "" : domain;
  return d.empty() ? op : d + "." + op;
}

}  // namespace

KernelFamilyRegistration::KernelFamilyRegistration(const char* family, Device device,
                                                   KernelFamilyFn fn) {
  families().push_back({family, device, fn});
}

KernelRegistry& KernelRegistry::instance() {
  static KernelRegistry* reg = [] {
    auto* r = new KernelRegistry();
    std::vector<Family> order = families();
    std::sort(order.begin(), order.end(), [](const Family& a, const Family& b) {
      return a.device != b.device ? a.device < b.device : std::string(a.name) < b.name;
    });
    std::map<Device, std::map<std::string, std::string>> owners;
    for (const Family& f : order) {
      KernelFamilyRegistrar registrar(*r, f.name, f.device, owners[f.device]);
      f.fn(registrar);
    }
    return r;
  }();
  return *reg;
}

OpTraits& KernelFamilyRegistrar::add(const std::string& domain, const std::string& op, OpKernel k) {
  const std::string name = key(domain, op);
  auto [it, fresh] = owners_.emplace(name, family_);
  ONYX_CHECK(fresh, "kernel families '", it->second, "' and '", family_, "' both register ", name,
             " on ", device_name(device_));
  if (device_ != Device::Cpu && !k.infer) {  // shape inference is the CPU kernel's, as are traits
    const OpKernel* cpu = registry_.find(domain, op, Device::Cpu);
    ONYX_CHECK(cpu != nullptr, "kernel family '", family_, "' registers ", name, " on ",
               device_name(device_), " without shape inference, and no CPU kernel has one");
    k.infer = cpu->infer;
    k.value_inputs = cpu->value_inputs;
    k.traits = cpu->traits;
  }
  return registry_.add(domain, op, std::move(k), device_);
}

OpTraits& KernelRegistry::add(const std::string& domain, const std::string& op, OpKernel k,
                              Device device) {
  OpKernel& slot = kernels_[{device, key(domain, op)}];
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

const OpKernel* KernelRegistry::find(const std::string& domain, const std::string& op,
                                     Device device) const {
  auto it = kernels_.find({device, key(domain, op)});
  return it == kernels_.end() ? nullptr : &it->second;
}

std::vector<std::string> KernelRegistry::op_names(Device device) const {
  std::vector<std::string> v;
  for (auto& [k, _] : kernels_)
    if (k.first == device) v.push_back(k.second);
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

// 2·M·N·K for Gemm and onyx.MatMulT (transA picks which axis of A is K).
double gemm_like_flops(const ir::Node& n, const std::vector<const TensorMeta*>& in,
                       const std::vector<const TensorMeta*>& out) {
  if (!in[0] || !out[0] || in[0]->shape.size() < 2) return 0;
  const Shape& as = in[0]->shape;
  bool ta = n.attr_int("transA", 0) != 0;
  return 2 * shape_product(out[0]->shape) * (double)(ta ? as[as.size() - 2] : as.back());
}

int64_t normalize_axis(int64_t axis, int64_t rank, const ir::Node& node) {
  ONYX_CHECK(axis >= -rank && axis < std::max<int64_t>(rank, 1), node.describe(), ": axis ", axis,
             " is out of range for rank ", rank);
  return axis < 0 ? axis + rank : axis;
}

}  // namespace onyx::runtime
