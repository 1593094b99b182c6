// test_op_table.cc — the op-case table (op_table.h; rows in cases_<family>.inc) run in its modes:
//   OpForward/<row>    the op alone: outputs have the metas shape inference gave, float outputs of
//                      a non-random op are finite; with ONYX_OP_TABLE_DIR=<dir> the row's model
//                      (<row>.onnx, inputs as initializers) and onyx's outputs (<row>.safetensors,
//                      y0, y1, ...) are written for tests/ops/test_forward_reference.py, which
//                      compares them with a float64 reference (for a row with a pattern, its
//                      unfused form <row>.reference.onnx)
//   OpGradient/<row>   rows with a differentiable input: finite differences of
//                      loss = Σ_k sum(y_k · W_k) against the training graph's gradients (with
//                      ONYX_OP_TABLE_DIR, written as <row>.grad.safetensors: refactors compare
//                      them, and the forward outputs, bit for bit before and after)
//   OpTableBench.Rows  every row timed, forward and (gradient rows) forward+backward;
//                      ONYX_OP_TABLE_REPS repetitions (default 1: the smoke run CI does),
//                      ONYX_OP_TABLE_BENCH=<file> writes the times as TSV (bench/op_table.sh)
//   OpFusion/<row>     rows with a pattern: the forward pipeline turns the unfused form into one
//                      node of the row's op; outputs and gradients equal the unfused graph's
//   OpCuda/<row>       rows whose op has a CUDA kernel (a build with -DONYX_CUDA=ON): the row's
//                      graph, and for a gradient row its training graph, run node by node with
//                      the CPU kernels; each node with a CUDA kernel runs again on the device from
//                      the same inputs and must match within the row's tolerances (so the
//                      backward kernels, onyx.*Grad, are checked where the rows' training graphs
//                      run them); with ONYX_OP_TABLE_DIR the op's outputs on the device are
//                      written as <row>.cuda.safetensors for test_forward_reference.py. Skipped
//                      with "no CUDA device" where there is none
//   OpTableCoverage.*  every registered kernel is a row's op or runs in a gradient row's training
//                      graph (CPU and CUDA); every gradient rule is the op of a gradient row
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "autodiff/gradient.h"
#include "io/safetensors.h"
#include "ir/onnx_io.h"
#include "kernels/cuda/runtime.h"
#include "op_table.h"
#include "passes/pass.h"
#include "runtime/kernel.h"
#include "runtime/session.h"

using namespace onyx;
using namespace onyx::optable;
using autodiff::attr_f;
using autodiff::attr_i;
using autodiff::attr_ints;
using autodiff::attr_s;

static const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = {
#include "cases_attention.inc"
#include "cases_elementwise.inc"
#include "cases_forward.inc"
#include "cases_llama.inc"
#include "cases_loss.inc"
#include "cases_matmul.inc"
#include "cases_nn.inc"
#include "cases_quant.inc"
#include "cases_shape.inc"
  };
  return cases;
}

static std::string key(const std::string& domain, const std::string& op) {
  bool standard = domain.empty() || domain == "ai.onnx";
  return standard ? op : domain + "." + op;
}

static bool has_diff_input(const Case& c) {
  for (auto& in : c.inputs)
    if (in.diff && !in.absent) return true;
  return false;
}

static const std::vector<Case>& gradient_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> v;
    for (auto& c : all_cases())
      if (has_diff_input(c)) v.push_back(c);
    return v;
  }();
  return cases;
}

static const std::vector<Case>& fusion_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> v;
    for (auto& c : all_cases())
      if (c.pattern) v.push_back(c);
    return v;
  }();
  return cases;
}

namespace {

struct Built {
  std::shared_ptr<ir::Graph> node_only;  // the op alone, its outputs y0.. as graph outputs
  std::shared_ptr<ir::Graph> forward;    // node + loss, loss is the only output
  std::vector<std::string> inputs;       // every present input (initializers x0, x1, ...)
  std::vector<std::string> params;       // differentiable inputs
};

ir::ValueInfo value(const std::string& name) {
  ir::ValueInfo vi;
  vi.name = name;
  return vi;
}

// Appends loss = Σ_k sum(y_k · W_k) over the float32 outputs y_k (c.loss_outputs, else all) to g,
// W_k fixed random; `values` is a graph computing the y_k named in `outs` (run to get their
// shapes).
void add_weighted_loss(ir::Graph& g, const Case& c, std::shared_ptr<ir::Graph> values,
                       std::mt19937& rng, std::vector<std::string> outs = {}) {
  if (outs.empty())
    for (int o = 0; o < c.num_outputs; o++) outs.push_back(cat("y", o));
  runtime::Session probe(values);
  auto vals = probe.run({});
  std::vector<std::string> terms;
  for (int o = 0; o < (int)outs.size(); o++) {
    bool use = c.loss_outputs.empty() ? true
                                      : std::find(c.loss_outputs.begin(), c.loss_outputs.end(),
                                                  o) != c.loss_outputs.end();
    const Tensor& y = vals.at(outs[o]);
    if (!use || y.dtype() != DType::Float32) continue;
    Tensor w(DType::Float32, y.shape());
    std::uniform_real_distribution<float> u(-1, 1);
    for (int64_t k = 0; k < w.numel(); k++) w.data<float>()[k] = u(rng);
    g.add_initializer(cat("w", o), w);
    ir::Node m;
    m.name = cat("mul", o);
    m.op_type = "Mul";
    m.inputs = {outs[o], cat("w", o)};
    m.outputs = {cat("yw", o)};
    ir::Node r;
    r.name = cat("sum", o);
    r.op_type = "ReduceSum";
    r.inputs = {cat("yw", o)};
    r.outputs = {cat("s", o)};
    r.attrs["keepdims"] = attr_i(0);
    g.nodes.push_back(m);
    g.nodes.push_back(r);
    terms.push_back(cat("s", o));
  }
  ir::Node total;
  total.name = "total";
  total.op_type = "Sum";
  total.inputs = terms;
  total.outputs = {"loss"};
  g.nodes.push_back(total);
  g.outputs.clear();
  ir::ValueInfo lo = value("loss");
  lo.dtype = DType::Float32;
  g.outputs.push_back(lo);
}

Built build(const Case& c, std::mt19937& rng, bool with_loss = true) {
  auto g = std::make_shared<ir::Graph>();
  g->name = c.name;
  g->opsets[""] = c.opset;
  if (!c.domain.empty()) g->opsets[c.domain] = 1;
  Built b;
  ir::Node n;
  n.name = "op";
  n.op_type = c.op;
  n.domain = c.domain;
  n.attrs = c.attrs;
  for (size_t i = 0; i < c.inputs.size(); i++) {
    const In& in = c.inputs[i];
    if (in.absent) {
      n.inputs.push_back("");
      continue;
    }
    std::string name = cat("x", i);
    Tensor t;
    if (in.fixed.defined()) {
      t = in.fixed.clone();
    } else {
      t = Tensor(DType::Float32, in.shape);
      std::uniform_real_distribution<float> u(in.lo, in.hi);
      for (int64_t k = 0; k < t.numel(); k++) {
        float v;
        do v = u(rng);
        while (std::fabs(v) < in.min_abs);
        t.data<float>()[k] = v;
      }
    }
    g->add_initializer(name, t);
    n.inputs.push_back(name);
    b.inputs.push_back(name);
    if (in.diff) b.params.push_back(name);
  }
  for (int o = 0; o < c.num_outputs; o++) n.outputs.push_back(cat("y", o));
  g->nodes.push_back(n);
  b.node_only = std::make_shared<ir::Graph>(*g);
  for (int o = 0; o < c.num_outputs; o++) b.node_only->outputs.push_back(value(cat("y", o)));
  if (!with_loss) return b;
  add_weighted_loss(*g, c, b.node_only, rng);
  b.forward = g;
  return b;
}

double loss_of(const ir::Graph& g) {
  runtime::Session s(std::make_shared<ir::Graph>(g));
  return s.run({}).at("loss").get_as_double(0);
}

// Every input is a parameter, so the session folds nothing (the kernel runs on each run).
std::set<std::string> all_inputs(const Built& b) { return {b.inputs.begin(), b.inputs.end()}; }

// The row's unfused form: its inputs, the pattern instead of the op; outputs the pattern's values.
std::shared_ptr<ir::Graph> unfused_graph(const Case& c, const Built& b) {
  auto g = std::make_shared<ir::Graph>(*b.node_only);
  g->nodes.clear();
  g->outputs.clear();
  PatternBuilder pb{*g};
  for (auto& y : c.pattern(pb, b.node_only->nodes[0].inputs)) g->outputs.push_back(value(y));
  return g;
}

}  // namespace

// ---- forward ------------------------------------------------------------------------------------

class OpForward : public ::testing::TestWithParam<Case> {};

TEST_P(OpForward, RunsAsInferred) {
  const Case& c = GetParam();
  std::mt19937 rng(1234);
  Built b = build(c, rng, /*with_loss=*/false);
  const ir::Node& n = b.node_only->nodes[0];
  const runtime::OpKernel* k = runtime::KernelRegistry::instance().find(n.domain, n.op_type);
  ASSERT_NE(k, nullptr) << c.name << ": no kernel for " << n.domain << "." << n.op_type;
  std::vector<TensorMeta> in_metas;
  std::vector<const TensorMeta*> in_ptrs;
  std::vector<const Tensor*> in_values;
  in_metas.reserve(n.inputs.size());
  for (auto& name : n.inputs) {
    if (name.empty()) {
      in_ptrs.push_back(nullptr);
      in_values.push_back(nullptr);
      continue;
    }
    const Tensor& t = b.node_only->initializers.at(name);
    in_metas.push_back(t.meta());
    in_ptrs.push_back(&in_metas.back());
    in_values.push_back(&t);
  }
  auto metas = runtime::infer_node(*k, n, c.opset, in_ptrs, in_values);
  runtime::Session s(b.node_only, all_inputs(b));
  auto outs = s.run({});
  const bool random = runtime::op_traits(n).random;
  std::map<std::string, Tensor> written;
  for (int o = 0; o < c.num_outputs; o++) {
    const Tensor& y = outs.at(cat("y", o));
    ASSERT_LT((size_t)o, metas.size()) << c.name;
    EXPECT_EQ(y.dtype(), metas[o].dtype) << c.name << ": output " << o << " dtype";
    EXPECT_EQ(y.shape(), metas[o].shape) << c.name << ": output " << o << " shape";
    if (is_float(y.dtype()) && !random && !c.nonfinite_ok) {
      for (int64_t e = 0; e < y.numel(); e++) {
        ASSERT_TRUE(std::isfinite(y.get_as_double(e))) << c.name << ": y" << o << "[" << e << "]";
      }
    }
    written[cat("y", o)] = y;
  }
  if (const char* dir = std::getenv("ONYX_OP_TABLE_DIR")) {
    std::filesystem::create_directories(dir);
    std::string base = std::string(dir) + "/" + c.name;
    ir::save_onnx(*b.node_only, base + ".onnx");
    // A fused op's float64 reference is its unfused pattern (standard ops) when the row has one.
    if (c.pattern) ir::save_onnx(*unfused_graph(c, b), base + ".reference.onnx");
    io::save_safetensors(base + ".safetensors", written, {{"random", random ? "1" : "0"}});
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, OpForward, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- gradient -----------------------------------------------------------------------------------

class OpGradient : public ::testing::TestWithParam<Case> {};

TEST_P(OpGradient, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  std::mt19937 rng(1234);
  Built b = build(c, rng);
  autodiff::GradientOptions opts;
  opts.trainable = b.params;
  auto tg = autodiff::build_training_graph(*b.forward, {}, opts);
  runtime::Session s(tg.graph, std::set<std::string>(b.params.begin(), b.params.end()));
  auto res = s.run({});
  ASSERT_EQ(tg.gradients.size(), b.params.size());
  if (const char* dir = std::getenv("ONYX_OP_TABLE_DIR")) {  // the gradients, for comparisons
    std::map<std::string, Tensor> grads;
    for (auto& [param, gname] : tg.gradients) grads[param] = res.at(gname);
    std::filesystem::create_directories(dir);
    io::save_safetensors(std::string(dir) + "/" + c.name + ".grad.safetensors", grads, {});
  }
  for (auto& [param, gname] : tg.gradients) {
    const Tensor& grad = res.at(gname);
    Tensor& x = b.forward->initializers.at(param);
    ASSERT_EQ(grad.shape(), x.shape()) << c.name << ": gradient of " << param;
    int64_t n = x.numel();
    int64_t stride = n > 48 ? n / 48 : 1;  // check up to ~48 elements spread over the tensor
    for (int64_t k = 0; k < n; k += stride) {
      float orig = x.data<float>()[k];
      x.data<float>()[k] = orig + c.eps;
      double lp = loss_of(*b.forward);
      x.data<float>()[k] = orig - c.eps;
      double lm = loss_of(*b.forward);
      x.data<float>()[k] = orig;
      double numeric = (lp - lm) / (2.0 * c.eps);
      double analytic = grad.get_as_double(k);
      EXPECT_NEAR(analytic, numeric, c.atol + c.rtol * std::fabs(numeric))
          << c.name << ": d loss / d " << param << "[" << k << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, OpGradient, ::testing::ValuesIn(gradient_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- fusion -------------------------------------------------------------------------------------

class OpFusion : public ::testing::TestWithParam<Case> {};

int count_op(const ir::Graph& g, const std::string& domain, const std::string& op) {
  int n = 0;
  for (auto& nd : g.nodes) n += nd.op_type == op && key(nd.domain, "") == key(domain, "");
  return n;
}

void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  for (int64_t e = 0; e < a.numel(); e++) {
    double x = a.get_as_double(e), y = b.get_as_double(e);
    ASSERT_NEAR(x, y, tol * (1 + std::fabs(y))) << what << "[" << e << "]";
  }
}

TEST_P(OpFusion, PipelineFusesThePattern) {
  const Case& c = GetParam();
  std::mt19937 rng(1234);
  Built b = build(c, rng, /*with_loss=*/false);
  auto unfused = unfused_graph(c, b);
  std::vector<std::string> ys;
  for (auto& o : unfused->outputs) ys.push_back(o.name);
  ASSERT_FALSE(ys.empty()) << c.name;
  // Every input a variable, so nothing folds; the pipeline as the Trainer runs it.
  std::set<std::string> vars = all_inputs(b);
  passes::PassReport report;
  auto fused = std::make_shared<ir::Graph>(
      passes::optimize_forward(*unfused, {}, vars, passes::OptimizeOptions{}, &report));
  EXPECT_EQ(count_op(*fused, c.domain, c.op), 1)
      << c.name << ": the pipeline should turn the pattern into one " << key(c.domain, c.op);
  EXPECT_EQ(count_op(*unfused, c.domain, c.op), 0) << c.name << ": the pattern holds the op itself";
  runtime::Session su(unfused, vars), sf(fused, vars);
  auto ou = su.run({}), of = sf.run({});
  for (auto& y : ys) expect_close(of.at(y), ou.at(y), 1e-5, c.name + ": " + y);
  if (b.params.empty()) return;
  // The backward built from the fused op's rule equals the one built from the pattern's ops.
  std::mt19937 wrng(99);
  ir::Graph fl = *fused, ul = *unfused;
  add_weighted_loss(fl, c, fused, wrng, ys);
  wrng.seed(99);
  add_weighted_loss(ul, c, unfused, wrng, ys);
  autodiff::GradientOptions opts;
  opts.trainable = b.params;
  auto tf = autodiff::build_training_graph(fl, {}, opts);
  auto tu = autodiff::build_training_graph(ul, {}, opts);
  std::set<std::string> params(b.params.begin(), b.params.end());
  runtime::Session gf(tf.graph, params), gu(tu.graph, params);
  auto rf = gf.run({}), ru = gu.run({});
  std::map<std::string, std::string> gu_of(tu.gradients.begin(), tu.gradients.end());
  ASSERT_EQ(tf.gradients.size(), b.params.size());
  for (auto& [p, grad] : tf.gradients)
    expect_close(rf.at(grad), ru.at(gu_of.at(p)), 1e-5, c.name + ": d loss / d " + p);
}

INSTANTIATE_TEST_SUITE_P(Rows, OpFusion, ::testing::ValuesIn(fusion_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- cuda ---------------------------------------------------------------------------------------

namespace {

const runtime::OpKernel* cuda_kernel(const std::string& domain, const std::string& op) {
  return runtime::KernelRegistry::instance().find(domain, op, Device::Cuda);
}

const std::vector<Case>& cuda_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> v;
    for (auto& c : all_cases())
      if (cuda_kernel(c.domain, c.op)) v.push_back(c);
    return v;
  }();
  return cases;
}

int64_t node_opset(const ir::Graph& g, const ir::Node& n) {
  auto it = g.opsets.find(n.domain == "ai.onnx" ? "" : n.domain);
  return it != g.opsets.end() ? it->second : 1;
}

// Runs node n's kernel on `device` from host values; returns its outputs on the host (undefined
// for an absent output).
std::vector<Tensor> run_node(const ir::Graph& g, const ir::Node& n,
                             const std::map<std::string, Tensor>& vals, Device device) {
  const runtime::OpKernel* cpu = runtime::KernelRegistry::instance().find(n.domain, n.op_type);
  const runtime::OpKernel* k =
      device == Device::Cpu ? cpu
                            : runtime::KernelRegistry::instance().find(n.domain, n.op_type, device);
  ONYX_CHECK(k != nullptr, n.describe(), ": no kernel on ", device_name(device));
  const int64_t opset = node_opset(g, n);
  std::vector<TensorMeta> metas_in;
  metas_in.reserve(n.inputs.size());
  std::vector<const TensorMeta*> in_ptrs;
  std::vector<const Tensor*> in_vals;
  std::vector<Tensor> dev_in;
  dev_in.reserve(n.inputs.size());
  std::vector<const Tensor*> kin;
  for (auto& name : n.inputs) {
    if (name.empty()) {
      in_ptrs.push_back(nullptr);
      in_vals.push_back(nullptr);
      kin.push_back(nullptr);
      continue;
    }
    const Tensor& t = vals.at(name);
    metas_in.push_back(t.meta());
    in_ptrs.push_back(&metas_in.back());
    in_vals.push_back(&t);
    if (device == Device::Cpu) {
      kin.push_back(&t);
    } else {
      dev_in.push_back(cuda::to_device(t));
      kin.push_back(&dev_in.back());
    }
  }
  auto metas = runtime::infer_node(*k, n, opset, in_ptrs, in_vals);
  std::vector<Tensor> outs(n.outputs.size());
  std::vector<Tensor*> kout(n.outputs.size(), nullptr);
  for (size_t o = 0; o < n.outputs.size(); o++) {
    if (n.outputs[o].empty()) continue;
    outs[o] = device == Device::Cpu ? Tensor(metas[o].dtype, metas[o].shape)
                                    : cuda::empty(metas[o].dtype, metas[o].shape);
    kout[o] = &outs[o];
  }
  runtime::KernelContext ctx{n, opset, kin, kout};
  k->compute(ctx);
  if (device != Device::Cpu)
    for (auto& t : outs)
      if (t.defined()) t = cuda::to_host(t);
  return outs;
}

// Both non-finite alike, or |got − want| <= atol + rtol·|want|.
void expect_matches(const Tensor& got, const Tensor& want, const Case& c, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  if (!is_float(want.dtype())) {
    ASSERT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << what;
    return;
  }
  int bad = 0;
  for (int64_t e = 0; e < want.numel() && bad < 5; e++) {
    double x = got.get_as_double(e), y = want.get_as_double(e);
    if (!std::isfinite(y)) {
      bool same = std::isnan(y) ? std::isnan(x) : x == y;
      EXPECT_TRUE(same) << what << "[" << e << "]: cuda " << x << ", cpu " << y;
      bad += !same;
      continue;
    }
    bool ok = std::fabs(x - y) <= c.atol + c.rtol * std::fabs(y);
    EXPECT_TRUE(ok) << what << "[" << e << "]: cuda " << x << ", cpu " << y;
    bad += !ok;
  }
}

// Runs g node by node on the CPU from its initializers; every node with a CUDA kernel runs on the
// device too and is compared. Returns the device outputs of the node named `keep` (if any).
std::vector<Tensor> compare_graph(const ir::Graph& g, const Case& c, const std::string& keep,
                                  int* compared) {
  std::map<std::string, Tensor> vals(g.initializers.begin(), g.initializers.end());
  std::vector<Tensor> kept;
  for (const ir::Node& n : g.nodes) {
    auto cpu = run_node(g, n, vals, Device::Cpu);
    if (cuda_kernel(n.domain, n.op_type) && !runtime::op_traits(n).random) {
      std::vector<Tensor> dev;
      try {
        dev = run_node(g, n, vals, Device::Cuda);
      } catch (const Unsupported& e) {
        // The row's own op must run; a node of the training graph whose dtype or attributes the
        // CUDA kernel does not take yet (an int64 Mul of shapes, a Cast to bool) is not compared.
        EXPECT_NE(n.name, keep) << c.name << ": " << e.what();
        std::cerr << "  not on cuda yet: " << e.what() << "\n";
        for (size_t o = 0; o < cpu.size(); o++)
          if (cpu[o].defined()) vals[n.outputs[o]] = cpu[o];
        continue;
      }
      for (size_t o = 0; o < cpu.size(); o++)
        if (cpu[o].defined())
          expect_matches(dev[o], cpu[o], c, cat(c.name, ": ", n.describe(), " output ", o));
      if (n.name == keep) kept = dev;
      ++*compared;
    }
    for (size_t o = 0; o < cpu.size(); o++)
      if (cpu[o].defined()) vals[n.outputs[o]] = cpu[o];
  }
  return kept;
}

}  // namespace

class OpCuda : public ::testing::TestWithParam<Case> {};
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OpCuda);  // a build without -DONYX_CUDA=ON

TEST_P(OpCuda, MatchesCpuNodeByNode) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  const Case& c = GetParam();
  std::mt19937 rng(1234);
  Built b = build(c, rng, has_diff_input(c));
  int compared = 0;
  auto outs = compare_graph(*b.node_only, c, "op", &compared);
  EXPECT_EQ(compared, 1) << c.name;
  if (const char* dir = std::getenv("ONYX_OP_TABLE_DIR")) {
    std::map<std::string, Tensor> written;
    for (size_t o = 0; o < outs.size(); o++)
      if (outs[o].defined()) written[cat("y", o)] = outs[o];
    std::filesystem::create_directories(dir);
    io::save_safetensors(std::string(dir) + "/" + c.name + ".cuda.safetensors", written, {});
  }
  if (!b.forward) return;
  autodiff::GradientOptions opts;
  opts.trainable = b.params;
  auto tg = autodiff::build_training_graph(*b.forward, {}, opts);
  compare_graph(*tg.graph, c, "", &compared);
}

INSTANTIATE_TEST_SUITE_P(Rows, OpCuda, ::testing::ValuesIn(cuda_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---- bench --------------------------------------------------------------------------------------

TEST(OpTableBench, Rows) {
  int reps = 1;
  if (const char* r = std::getenv("ONYX_OP_TABLE_REPS")) reps = std::max(1, std::atoi(r));
  const char* out_path = std::getenv("ONYX_OP_TABLE_BENCH");
  std::ofstream out;
  using clock = std::chrono::steady_clock;
  // The ceiling in the same run: memcpy bandwidth over 64 MiB (one thread, as std::memcpy runs).
  double memcpy_gbs = 0;
  {
    std::vector<char> a(64 << 20, 1), b(64 << 20);
    std::memcpy(b.data(), a.data(), a.size());
    auto t0 = clock::now();
    for (int i = 0; i < 4; i++) std::memcpy(b.data(), a.data(), a.size());
    double s = std::chrono::duration<double>(clock::now() - t0).count();
    memcpy_gbs = 4.0 * 2 * a.size() / s / 1e9;  // read + write
  }
  if (out_path) {
    out.open(out_path);
    ASSERT_TRUE(out) << out_path;
    out << "# memcpy " << memcpy_gbs << " GB/s (read+write, 64 MiB, 1 thread), reps " << reps
        << "\n";
    out << "row\top\tforward_us\ttrain_step_us\tforward_GBps\tof_memcpy\n";
  }
  auto time_us = [&](runtime::Session& s) {
    s.run({});  // plan and warm up
    auto t0 = clock::now();
    for (int i = 0; i < reps; i++) s.run({});
    return std::chrono::duration<double, std::micro>(clock::now() - t0).count() / reps;
  };
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(1234);
    Built b = build(c, rng, has_diff_input(c));
    runtime::Session fwd(b.node_only, all_inputs(b));
    double f_us = time_us(fwd);
    double bytes = 0;  // what the forward reads and writes, once each
    for (auto& [name, t] : b.node_only->initializers) bytes += (double)t.nbytes();
    for (auto& [name, t] : fwd.run({})) bytes += (double)t.nbytes();
    double gbs = f_us > 0 ? bytes / (f_us * 1e3) : 0;
    double t_us = -1;
    if (b.forward) {
      autodiff::GradientOptions opts;
      opts.trainable = b.params;
      auto tg = autodiff::build_training_graph(*b.forward, {}, opts);
      runtime::Session train(tg.graph, std::set<std::string>(b.params.begin(), b.params.end()));
      t_us = time_us(train);
    }
    EXPECT_TRUE(std::isfinite(f_us) && f_us >= 0);
    if (out)
      out << c.name << "\t" << c.domain << (c.domain.empty() ? "" : ".") << c.op << "\t" << f_us
          << "\t" << (t_us < 0 ? std::string("") : std::to_string(t_us)) << "\t" << gbs << "\t"
          << gbs / memcpy_gbs << "\n";
  }
}

// ---- coverage -----------------------------------------------------------------------------------

// Fails listing every op of `ops` that `covered` lacks.
static void expect_covered(const std::vector<std::string>& ops,
                           const std::set<std::string>& covered, const char* what) {
  std::string list;
  int n = 0;
  for (const std::string& op : ops)
    if (!covered.count(op)) {
      list += " " + op;
      n++;
    }
  EXPECT_EQ(n, 0) << n << " " << what << " in tests/ops/cases_*.inc:" << list;
}

TEST(OpTableCoverage, EveryKernelHasARow) {
  std::set<std::string> covered;
  for (const Case& c : all_cases()) covered.insert(key(c.domain, c.op));
  // The onyx-domain backward kernels (*Grad, AccumulateGrad) are covered where a gradient row's
  // training graph runs them: the gradient mode is their check against finite differences. Every
  // other kernel (standard, com.microsoft, onyx forward ops) needs a row of its own.
  for (const Case& c : gradient_cases()) {
    std::mt19937 rng(1234);
    Built b = build(c, rng);
    autodiff::GradientOptions opts;
    opts.trainable = b.params;
    auto tg = autodiff::build_training_graph(*b.forward, {}, opts);
    for (auto& n : tg.graph->nodes)
      if (n.domain == "onyx" && !runtime::KernelRegistry::instance().find("", n.op_type))
        covered.insert(key(n.domain, n.op_type));
  }
  expect_covered(runtime::KernelRegistry::instance().op_names(), covered,
                 "registered kernels have no row");
  // A CUDA kernel is checked where OpCuda runs it: a row of its op, or a node of the training
  // graph of a row whose op has a CUDA kernel.
  std::set<std::string> cuda_covered;
  for (const Case& c : cuda_cases()) {
    cuda_covered.insert(key(c.domain, c.op));
    if (!has_diff_input(c)) continue;
    std::mt19937 rng(1234);
    Built b = build(c, rng);
    autodiff::GradientOptions opts;
    opts.trainable = b.params;
    auto tg = autodiff::build_training_graph(*b.forward, {}, opts);
    for (auto& n : tg.graph->nodes) cuda_covered.insert(key(n.domain, n.op_type));
  }
  expect_covered(runtime::KernelRegistry::instance().op_names(Device::Cuda), cuda_covered,
                 "CUDA kernels are never run by OpCuda");
}

TEST(OpTableCoverage, EveryGradientRuleHasAGradientRow) {
  std::set<std::string> covered;
  for (const Case& c : gradient_cases()) covered.insert(key(c.domain, c.op));
  expect_covered(autodiff::GradRegistry::instance().op_names(), covered,
                 "gradient rules have no gradient row");
}

TEST(OpTableCoverage, RowNamesAreUnique) {
  std::set<std::string> seen;
  for (const Case& c : all_cases()) EXPECT_TRUE(seen.insert(c.name).second) << c.name;
}
