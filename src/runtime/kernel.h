// runtime/kernel.h — the contract between the planner/executor and every op implementation.
//
// An op registers two functions under (domain, op_type, device) — from its family's file, with
// ONYX_REGISTER_KERNELS below:
//   infer(InferContext&)   : output dtypes and shapes from input metas (and, for shape-like inputs
//                            such as Reshape's `shape`, from their values when known at plan time).
//   compute(KernelContext&): fills the outputs, which the executor has already allocated with the
//                            inferred metas.
// An infer that needs an input's value calls ctx.value(i). At plan time that throws NeedValue when
// the value is not a constant; the planner then marks the node dynamic and re-runs infer at run
// time, when every value is known. Constant inputs (initializers, Constant nodes, Shape of a known
// shape, ...) are folded at plan time by running compute once.
//
// Ops throw onyx::Error for bad input (the executor adds the node's name, op and shapes) and
// onyx::Unsupported for attribute values or dtypes onyx does not claim.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onyx/tensor.h"

namespace onyx::runtime {

struct NeedValue {
  int input;
};

struct InferContext {
  const ir::Node& node;
  int64_t opset;                          // version of the node's domain
  std::vector<const TensorMeta*> inputs;  // nullptr for an absent optional input
  std::vector<const Tensor*> values;      // known values (constants / run time) or nullptr
  std::vector<TensorMeta> outputs;        // to fill: one per node output

  int num_inputs() const { return (int)inputs.size(); }
  bool has_input(int i) const { return i < (int)inputs.size() && inputs[i] != nullptr; }
  const TensorMeta& input(int i) const;  // throws (naming the node) if absent
  const Tensor& value(int i) const;      // throws NeedValue if unknown, Error if absent
  int num_outputs() const { return (int)node.outputs.size(); }
  void set_output(int i, DType dtype, Shape shape);
};

struct KernelContext {
  const ir::Node& node;
  int64_t opset;
  std::vector<const Tensor*> inputs;  // nullptr for an absent optional input
  std::vector<Tensor*> outputs;       // pre-allocated; nullptr for an absent optional output
  uint64_t seed = 0;                  // per-run seed for random ops (Dropout in training)
  bool training = false;              // Dropout etc.: training mode requested by the caller
  bool bf16_gemm = false;             // GEMM-class kernels: bf16 inputs, float32 accumulation
  bool fp16_gemm = false;             // ... float16-rounded inputs instead (emulated: no fp16 math)
  bool accumulate = false;            // onyx.AccumulateGrad: add into the (bound) output
  uint64_t accumulate_mask = 0;       // bit i: output i is bound and the run accumulates into it

  int num_inputs() const { return (int)inputs.size(); }
  bool has_input(int i) const { return i < (int)inputs.size() && inputs[i] != nullptr; }
  const Tensor& input(int i) const;
  bool has_output(int i) const { return i < (int)outputs.size() && outputs[i] != nullptr; }
  Tensor& output(int i);
  // Output i must be added into (out += result) instead of overwritten: the executor sets this
  // only for outputs listed in OpKernel::accumulate_outputs that are bound to caller storage.
  bool accumulates(int i) const { return i < 64 && ((accumulate_mask >> i) & 1) != 0; }
};

using InferFn = std::function<void(InferContext&)>;
using ComputeFn = std::function<void(KernelContext&)>;

// FLOPs of one call, from the node and the metas of its inputs and outputs (nullptr when unknown).
using FlopsFn = std::function<double(const ir::Node&, const std::vector<const TensorMeta*>& inputs,
                                     const std::vector<const TensorMeta*>& outputs)>;

// What passes and planners know about an op, declared once where its kernel registers
// (KernelRegistry::add returns them: `r.add("", "Reshape", {...}).view = true;`) and read back
// with op_traits(node). An op without a kernel has the defaults: nothing is assumed of it.
struct OpTraits {
  // Draws random numbers (Dropout, RandomNormal, ...): run every time, never folded at plan time.
  bool random = false;
  // Writes more than its outputs (onyx.AccumulateGrad adds into bound storage): never folded.
  bool side_effects = false;
  // Output 0 is input 0's bytes under another shape: the memory planner aliases it (no copy).
  bool view = false;
  // Output 0 is input 0 reshaped (Reshape, Flatten, Squeeze, Unsqueeze): no-op elimination drops
  // one that keeps the shape and merges chains into one Reshape.
  bool reshape_like = false;
  // Inputs read only through their metas (Shape's data, CastLike's target): the node folds when
  // its other inputs are constants and these metas are static.
  std::vector<int> meta_only_inputs;
  // Token pruning (passes/token_pruning.cc) may run the op on a subset of the token rows:
  // Unary: each output row depends only on the same input row; Binary: elementwise with
  // broadcasting, so rows of [B,T,...] operands are selected and smaller operands kept.
  enum class PerToken { No, Unary, Binary } per_token = PerToken::No;
  // FLOPs per call (onyx plan, bench); ops without one count 0 (elementwise work is not counted).
  FlopsFn flops;
  // Mixed precision class: LowPrecision = GEMM-like, may take bf16 inputs with fp32 accumulation
  // (MatMul, Gemm, Conv, attention); Fp32 = must see fp32 (normalizations, softmax, losses,
  // reductions, the optimizer's inputs); Follow = computes in whatever dtype it is given (shape
  // ops, elementwise). Read by `onyx ops`; the bf16 pass (issue #13) is to place casts by it.
  enum class Precision { Follow, LowPrecision, Fp32 } precision = Precision::Follow;
};
const char* precision_name(OpTraits::Precision p);

struct OpKernel {
  InferFn infer;
  ComputeFn compute;
  // Inputs whose *values* the infer function reads (e.g. Reshape's shape = {1}); used by the
  // planner to decide what to fold. Inputs not listed are only read through their metas.
  std::vector<int> value_inputs;
  // (output i, input j): output i may be written over input j's memory (the memory planner does
  // so when input j dies at this node and has the output's element count and element size).
  // Declare only when compute reads element k of input j before it writes element k of output i
  // and reads no other element of input j afterwards.
  std::vector<std::pair<int, int>> inplace;
  // Outputs the kernel can add into instead of overwriting (float32; KernelContext::accumulates):
  // passes/gradient_into_buffer.cc lets such an output be a parameter gradient of the training
  // graph directly, written (or, accumulating micro-batches, added) into the flat gradient
  // buffer without an onyx.AccumulateGrad pass. The sum must be out + (result as computed
  // without accumulation), so gradient accumulation stays bit-identical.
  std::vector<int> accumulate_outputs;
  OpTraits traits;
};

// The device a kernel runs on. Each op family registers its kernels per device from the
// family's own file (src/kernels/<family>/: `.cc` CPU, `.cu` CUDA); passes and planners read one
// set of OpTraits per op, the CPU kernel's. A CUDA kernel registered without an infer function
// takes the CPU kernel's infer, value_inputs and traits (families register CPU first).
using onyx::Device;  // include/onyx/device.h
using onyx::device_name;

class KernelRegistry {
 public:
  // Filled on first use by every kernel family registered with ONYX_REGISTER_KERNELS.
  static KernelRegistry& instance();
  // Registers (or, for custom ops, replaces) a kernel; returns its traits for the caller to
  // declare.
  OpTraits& add(const std::string& domain, const std::string& op_type, OpKernel k,
                Device device = Device::Cpu);
  const OpKernel* find(const std::string& domain, const std::string& op_type,
                       Device device = Device::Cpu) const;
  // "Add", "onyx.LayerNormGrad", ...: the ops with a kernel on `device`
  std::vector<std::string> op_names(Device device = Device::Cpu) const;

 private:
  std::map<std::pair<Device, std::string>, OpKernel> kernels_;
};

// What a kernel family's registration function receives: add() as KernelRegistry's, on the
// family's device; an op the family registers twice, or that another family registered on the
// same device, is an error naming both.
class KernelFamilyRegistrar {
 public:
  KernelFamilyRegistrar(KernelRegistry& registry, const char* family, Device device,
                        std::map<std::string, std::string>& owners)
      : registry_(registry), family_(family), device_(device), owners_(owners) {}
  OpTraits& add(const std::string& domain, const std::string& op_type, OpKernel k);

 private:
  KernelRegistry& registry_;
  const char* family_;
  Device device_;
  std::map<std::string, std::string>& owners_;  // op -> the family that registered it
};

// Registers a kernel family from its own file, at static initialization (onyx_core is an OBJECT
// library: every kernel file is linked); the registry runs the families on first use, by device
// and name. No central list names them:
//   ONYX_REGISTER_KERNELS(softmax, Cpu) {
//     r.add("", "Softmax", make_softmax_kernel<false>()).precision = OpTraits::Precision::Fp32;
//   }
using KernelFamilyFn = void (*)(KernelFamilyRegistrar&);
struct KernelFamilyRegistration {
  KernelFamilyRegistration(const char* family, Device device, KernelFamilyFn fn);
};
#define ONYX_REGISTER_KERNELS(family, device)                                                    \
  static void onyx_kernels_##family##_##device(::onyx::runtime::KernelFamilyRegistrar&);         \
  static const ::onyx::runtime::KernelFamilyRegistration onyx_kernel_family_##family##_##device( \
      #family, ::onyx::runtime::Device::device, onyx_kernels_##family##_##device);               \
  static void onyx_kernels_##family##_##device(::onyx::runtime::KernelFamilyRegistrar& r)

// Product of shape[from, to) as a double (FLOPs functions).
inline double shape_product(const Shape& s, size_t from = 0, size_t to = SIZE_MAX) {
  double p = 1;
  for (size_t i = from; i < std::min(to, s.size()); i++) p *= (double)s[i];
  return p;
}

// Shared helpers for infer functions.
// Numpy-style multidirectional broadcast; throws naming both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Normalizes an axis in [-rank, rank) to [0, rank); throws naming the node otherwise.
int64_t normalize_axis(int64_t axis, int64_t rank, const ir::Node& node);

// 2·M·N·K of a Gemm-like node (Gemm, onyx.MatMulT; transA picks A's K axis): an OpTraits::flops.
double gemm_like_flops(const ir::Node& n, const std::vector<const TensorMeta*>& inputs,
                       const std::vector<const TensorMeta*>& outputs);

// Runs k's shape inference for `node`: output metas from input metas (nullptr = absent) and the
// values known so far (nullptr = unknown). Throws NeedValue when infer needs an unknown value,
// and the kernel's Error otherwise.
std::vector<TensorMeta> infer_node(const OpKernel& k, const ir::Node& node, int64_t opset,
                                   const std::vector<const TensorMeta*>& inputs,
                                   const std::vector<const Tensor*>& values);

// The traits of the node's op (the defaults when no kernel is registered for it).
const OpTraits& op_traits(const ir::Node& node);

}  // namespace onyx::runtime
