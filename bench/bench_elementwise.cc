// bench_elementwise.cc — GB/s of the main memory-bound kernels (through the kernel registry, as
// the executor calls them), next to a plain memcpy of the same bytes: the ceiling they chase.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

#include "autodiff/gradient.h"
#include "runtime/kernel.h"
#include "runtime/session.h"

using namespace onyx;

namespace {

Tensor randn(Shape s, float sigma = 1.0f) {
  Tensor t(DType::Float32, s);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, sigma);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = d(rng);
  return t;
}

void set_bytes(benchmark::State& st, double bytes) {
  st.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
  st.counters["GB/s"].value /= 1e9;
}

const Shape kAct = {16, 128, 768};  // (B,T,C) activations of a BERT-base-sized layer

void bm_memcpy(benchmark::State& st) {
  Tensor a = randn(kAct), b(DType::Float32, kAct);
  for (auto _ : st) {
    std::memcpy(b.raw(), a.raw(), a.nbytes());
    benchmark::DoNotOptimize(b.raw());
  }
  set_bytes(st, 2.0 * a.nbytes());
}

void bm_node(benchmark::State& st, std::string op, std::vector<Tensor> in,
             std::map<std::string, ir::Attribute> attrs, double bytes) {
  ir::Node n;
  n.name = op;
  n.op_type = op;
  n.attrs = attrs;
  for (size_t i = 0; i < in.size(); i++) n.inputs.push_back("x" + std::to_string(i));
  n.outputs = {"y"};
  for (auto _ : st) {
    auto out = runtime::run_node(n, 17, in);
    benchmark::DoNotOptimize(out[0].raw());
  }
  set_bytes(st, bytes);
}

// The kernel as the executor calls it: inputs and the (arena) output allocated once, only
// compute() timed — run_node's fresh output costs page faults that dwarf the kernel itself.
void bm_kernel(benchmark::State& st, std::string domain, std::string op, std::vector<Tensor> in,
               std::map<std::string, ir::Attribute> attrs, double bytes) {
  ir::Node n;
  n.name = op;
  n.op_type = op;
  n.domain = domain;
  n.attrs = attrs;
  for (size_t i = 0; i < in.size(); i++) n.inputs.push_back("x" + std::to_string(i));
  n.outputs = {"y"};
  const runtime::OpKernel* k = runtime::KernelRegistry::instance().find(domain, op);
  Tensor y(in[0].dtype(), in[0].shape());
  std::vector<const Tensor*> ins;
  for (auto& t : in) ins.push_back(&t);
  runtime::KernelContext kc{n, 17, ins, {&y}};
  for (auto _ : st) {
    k->compute(kc);
    benchmark::DoNotOptimize(y.raw());
  }
  set_bytes(st, bytes);
}

void register_all() {
  double act = (double)shape_numel(kAct) * 4;
  benchmark::RegisterBenchmark("memcpy/16x128x768", bm_memcpy)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  auto reg = [&](const char* name, std::string op, std::vector<Tensor> in,
                 std::map<std::string, ir::Attribute> attrs, double bytes) {
    benchmark::RegisterBenchmark(name, bm_node, op, in, attrs, bytes)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  };
  reg("Add/same_shape", "Add", {randn(kAct), randn(kAct)}, {}, 3 * act);
  reg("Add/bias_row", "Add", {randn(kAct), randn({768})}, {}, 2 * act);
  reg("Mul/same_shape", "Mul", {randn(kAct), randn(kAct)}, {}, 3 * act);
  reg("Relu", "Relu", {randn(kAct)}, {}, 2 * act);
  reg("Erf", "Erf", {randn(kAct)}, {}, 2 * act);
  reg("Tanh", "Tanh", {randn(kAct)}, {}, 2 * act);
  reg("Gelu/erf", "Gelu", {randn(kAct)}, {}, 2 * act);
  reg("Softmax/16x4x128x128", "Softmax", {randn({16, 4, 128, 128})},
      {{"axis", autodiff::attr_i(-1)}}, 2.0 * 16 * 4 * 128 * 128 * 4);
  reg("LayerNormalization/16x128x768", "LayerNormalization",
      {randn(kAct), randn({768}), randn({768})}, {{"axis", autodiff::attr_i(-1)}}, 2 * act);
  reg("Transpose/0213", "Transpose", {randn({16, 128, 12, 64})},
      {{"perm", autodiff::attr_ints({0, 2, 1, 3})}}, 2 * act);
}

// vit-tiny's MLP activation (B=64, T=50, C=768): the Gelu / GeluGrad of the training step.
// Inputs N(0, 1) and N(0, 0.3) (what the bench models' GELUs see early in training: erf's outer
// branch, |x| > 1.31, is then almost never needed, and erf_ps skips it per 8-lane vector).
void register_gelu() {
  const Shape vit = {64, 50, 768};
  double act = (double)shape_numel(vit) * 4;
  auto reg = [&](const char* name, std::string domain, std::string op, std::vector<Tensor> in,
                 std::map<std::string, ir::Attribute> attrs, double bytes) {
    benchmark::RegisterBenchmark(name, bm_kernel, domain, op, in, attrs, bytes)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  };
  auto tanh = autodiff::attr_s("tanh");
  reg("kernel/Relu/64x50x768", "", "Relu", {randn(vit)}, {}, 2 * act);
  reg("kernel/Gelu/erf/64x50x768", "", "Gelu", {randn(vit)}, {}, 2 * act);
  reg("kernel/Gelu/tanh/64x50x768", "", "Gelu", {randn(vit)}, {{"approximate", tanh}}, 2 * act);
  reg("kernel/Gelu/erf/64x50x768/sigma0.3", "", "Gelu", {randn(vit, 0.3f)}, {}, 2 * act);
  reg("kernel/GeluGrad/erf/64x50x768", "onyx", "GeluGrad", {randn(vit), randn(vit)}, {}, 3 * act);
  reg("kernel/GeluGrad/erf/64x50x768/sigma0.3", "onyx", "GeluGrad", {randn(vit), randn(vit, 0.3f)},
      {}, 3 * act);
  reg("kernel/GeluGrad/tanh/64x50x768", "onyx", "GeluGrad", {randn(vit), randn(vit)},
      {{"approximate", tanh}}, 3 * act);
}

// BiasGrad over vit-tiny's MLP and attention shapes: the column sums alone (float32 training)
// and with the bf16 copy of dY it writes for the GEMMs under bf16 (output 1). Bytes: dY read,
// plus the copy written.
void bm_bias_grad(benchmark::State& st, Shape s, bool copy) {
  ir::Node n;
  n.name = "BiasGrad";
  n.op_type = "BiasGrad";
  n.domain = "onyx";
  n.inputs = {"dy"};
  n.outputs = copy ? std::vector<std::string>{"db", "dy16"} : std::vector<std::string>{"db"};
  const runtime::OpKernel* k = runtime::KernelRegistry::instance().find("onyx", "BiasGrad");
  Tensor dy = randn(s), db(DType::Float32, {s.back()}), dy16(DType::BFloat16, s);
  std::vector<Tensor*> outs = {&db};
  if (copy) outs.push_back(&dy16);
  runtime::KernelContext kc{n, 17, {&dy}, outs};
  for (auto _ : st) {
    k->compute(kc);
    benchmark::DoNotOptimize(db.raw());
  }
  set_bytes(st, (double)dy.nbytes() + (copy ? (double)dy16.nbytes() : 0.0));
}

void register_bias_grad() {
  for (Shape s : {Shape{64, 50, 768}, Shape{64, 50, 192}})
    for (bool copy : {false, true})
      benchmark::RegisterBenchmark(
          cat("kernel/BiasGrad/", s[0], "x", s[1], "x", s[2], copy ? "/bf16_copy" : "").c_str(),
          bm_bias_grad, s, copy)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
}

const bool registered_bias_grad = (register_bias_grad(), true);
const bool registered_gelu = (register_gelu(), true);
const bool registered = (register_all(), true);

}  // namespace
