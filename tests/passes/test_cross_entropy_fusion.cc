// tests/passes/test_cross_entropy_fusion.cc — passes/cross_entropy_fusion.cc:
// SoftmaxCrossEntropyLoss over a linear layer's logits becomes one onyx.LinearCrossEntropy. Small
// graphs built here, in each form the pass claims (GPT-2's tied LM head with the time-shift Slice
// and row Reshape; linear_fusion's MatMulT with and without bias; a Gemm classifier head; the
// trainer's appended loss over a 3-D logits output): op counts before and after, and equal loss and
// parameter gradients through runtime::Session and autodiff (1e-5 relative). Chains the pass must
// leave alone stay unfused. Then the real opset-14 exports in <build>/bench-exports: one fusion
// each, same loss.
#include <gtest/gtest.h>

#include <climits>
#include <filesystem>
#include <random>

#include "../real_exports.h"
#include "autodiff/gradient.h"
#include "ir/onnx_io.h"
#include "passes/pass.h"
#include "runtime/session.h"

using namespace onyx;
using autodiff::attr_i;
using autodiff::attr_ints;
using autodiff::attr_s;

namespace {

int count_ops(const ir::Graph& g, const std::string& op, const std::string& domain = "") {
  int n = 0;
  for (auto& nd : g.nodes)
    if (nd.op_type == op && nd.domain == domain) n++;
  return n;
}

Tensor rand_f32(Shape s, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(g);
  return Tensor::from_vector(DType::Float32, s, v);
}

Tensor ints(Shape s, std::vector<int64_t> v) {
  return Tensor::from_vector<int64_t>(DType::Int64, s, v);
}

// A small graph builder: nodes named after their first output.
struct G {
  std::shared_ptr<ir::Graph> g = std::make_shared<ir::Graph>();
  std::set<std::string> params;
  G() {
    g->opsets[""] = 14;
    g->opsets["onyx"] = 1;
  }
  std::string node(const std::string& op, std::vector<std::string> in, const std::string& out,
                   std::map<std::string, ir::Attribute> attrs = {},
                   const std::string& domain = "") {
    ir::Node n;
    n.name = "n_" + out;
    n.op_type = op;
    n.domain = domain;
    n.inputs = std::move(in);
    n.outputs = {out};
    n.attrs = std::move(attrs);
    g->nodes.push_back(n);
    return out;
  }
  std::string param(const std::string& name, const Tensor& t) {
    g->add_initializer(name, t);
    params.insert(name);
    return name;
  }
  std::string constant(const std::string& name, const Tensor& t) {
    g->add_initializer(name, t);
    return name;
  }
  void input(const std::string& name, DType dt) {
    ir::ValueInfo v;
    v.name = name;
    v.dtype = dt;
    g->inputs.push_back(v);
  }
  void output(const std::string& name) {
    ir::ValueInfo v;
    v.name = name;
    g->outputs.push_back(v);
  }
};

// Shift-by-one causal LM loss, as GPT-2's export writes it:
//   x = Gather(wte, ids); h = Tanh(MatMul(x, w1)); logits = head(h) (B,T,V)
//   SCE(Reshape(Slice(logits, 0:-1 on axis 1), (-1, V)), Reshape(Slice(labels, 1: on axis 1), -1))
enum class Head { MatMulTranspose, MatMulT, MatMulTBias, MatMulWAdd };
constexpr int64_t B = 2, T = 9, C = 8, V = 23;

G lm_graph(Head head, bool logits_output = false, int64_t slice_axis = 1) {
  G m;
  m.input("ids", DType::Int64);
  m.input("labels", DType::Int64);
  m.param("wte", rand_f32({V, C}, 11));
  m.param("w1", rand_f32({C, C}, 12));
  std::string x = m.node("Gather", {"wte", "ids"}, "x");
  std::string h = m.node("Tanh", {m.node("MatMul", {x, "w1"}, "xw")}, "h");
  std::string logits;
  switch (head) {
    case Head::MatMulTranspose:
      logits = m.node("MatMul",
                      {h, m.node("Transpose", {"wte"}, "wte_t", {{"perm", attr_ints({1, 0})}})},
                      "logits");
      break;
    case Head::MatMulT:
      logits = m.node("MatMulT", {h, "wte"}, "logits", {{"transB", attr_i(1)}}, "onyx");
      break;
    case Head::MatMulTBias:
      m.param("head_w", rand_f32({C, V}, 13));
      m.param("head_b", rand_f32({V}, 14));
      logits = m.node("MatMulT", {h, "head_w", "head_b"}, "logits", {}, "onyx");
      break;
    case Head::MatMulWAdd:
      m.param("head_w", rand_f32({C, V}, 13));
      m.param("head_b", rand_f32({V}, 14));
      logits = m.node("Add", {m.node("MatMul", {h, "head_w"}, "mm"), "head_b"}, "logits");
      break;
  }
  m.constant("s0", ints({1}, {0}));
  m.constant("s1", ints({1}, {1}));
  m.constant("e_1", ints({1}, {-1}));
  m.constant("e_max", ints({1}, {INT64_MAX}));
  m.constant("ax", ints({1}, {slice_axis}));
  m.constant("ax1", ints({1}, {1}));
  m.constant("rows_v", ints({2}, {-1, V}));
  m.constant("flat", ints({1}, {-1}));
  std::string shifted = m.node("Slice", {logits, "s0", "e_1", "ax", "s1"}, "shifted");
  std::string rows = m.node("Reshape", {shifted, "rows_v"}, "rows");
  std::string lab = m.node(
      "Reshape", {m.node("Slice", {"labels", "s1", "e_max", "ax1", "s1"}, "lab_s"), "flat"}, "lab");
  m.node("SoftmaxCrossEntropyLoss", {rows, lab}, "loss",
         {{"reduction", attr_s("mean")}, {"ignore_index", attr_i(-100)}});
  m.output("loss");
  if (logits_output) m.output("logits");
  return m;
}

std::map<std::string, Tensor> lm_feeds() {
  std::mt19937 g(5);
  std::vector<int64_t> ids(B * T), lab(B * T);
  for (auto& v : ids) v = g() % V;
  for (size_t i = 0; i < lab.size(); i++) lab[i] = i % 5 == 3 ? -100 : (int64_t)(g() % V);
  return {{"ids", ints({B, T}, ids)}, {"labels", ints({B, T}, lab)}};
}

std::map<std::string, TensorMeta> sig_of(const std::map<std::string, Tensor>& feeds) {
  std::map<std::string, TensorMeta> s;
  for (auto& [k, t] : feeds) s[k] = t.meta();
  return s;
}

// Folded and cleaned (no fusions), as the pass sees it in the pipeline.
ir::Graph prepared(const G& m, const std::map<std::string, TensorMeta>& sig) {
  passes::OptimizeOptions plain;
  plain.fusions = false;
  return passes::optimize_forward(*m.g, sig, m.params, plain, nullptr);
}

// Runs fuse_cross_entropy alone and removes what it left dead; returns the count.
int fuse_only(ir::Graph& g, const std::map<std::string, TensorMeta>& sig,
              const std::set<std::string>& vars) {
  passes::PassContext ctx;
  ctx.signature = sig;
  ctx.variables = vars;
  ctx.refresh(g);
  int n = passes::fuse_cross_entropy(g, ctx);
  std::map<std::string, Tensor> keep;
  for (auto& v : vars) keep[v] = g.initializers.at(v);
  passes::eliminate_dead_nodes(g);
  for (auto& [k, t] : keep)
    if (!g.initializers.count(k)) g.add_initializer(k, t);
  return n;
}

struct Trained {
  double loss;
  std::map<std::string, Tensor> grads;  // by parameter
};

Trained train(const ir::Graph& g, const std::set<std::string>& params,
              const std::map<std::string, Tensor>& feeds) {
  autodiff::GradientOptions opts;
  opts.trainable.assign(params.begin(), params.end());
  opts.loss.output = "loss";
  ir::Graph one = g;
  one.outputs.resize(1);
  auto tg = autodiff::build_training_graph(one, sig_of(feeds), opts);
  runtime::Session s(tg.graph, params);
  auto res = s.run(feeds);
  Trained t;
  t.loss = res.at(tg.loss).get_as_double(0);
  for (auto& [p, gname] : tg.gradients) t.grads[p] = res.at(gname);
  return t;
}

void expect_same_training(const ir::Graph& before, const ir::Graph& after,
                          const std::set<std::string>& params,
                          const std::map<std::string, Tensor>& feeds) {
  Trained a = train(before, params, feeds), b = train(after, params, feeds);
  EXPECT_NEAR(b.loss, a.loss, 1e-5 * std::fabs(a.loss));
  for (auto& [p, ga] : a.grads) {
    const Tensor& gb = b.grads.at(p);
    ASSERT_EQ(ga.shape(), gb.shape()) << p;
    double scale = 0;
    for (int64_t i = 0; i < ga.numel(); i++)
      scale = std::max(scale, std::fabs(ga.get_as_double(i)));
    for (int64_t i = 0; i < ga.numel(); i++)
      ASSERT_NEAR(gb.get_as_double(i), ga.get_as_double(i), 1e-5 * scale + 1e-8)
          << p << "[" << i << "]";
  }
}

struct HeadCase {
  const char* name;
  Head head;
};

class CrossEntropyFusionHeads : public ::testing::TestWithParam<HeadCase> {};

TEST_P(CrossEntropyFusionHeads, FusesAndKeepsNumerics) {
  G m = lm_graph(GetParam().head);
  auto feeds = lm_feeds();
  auto sig = sig_of(feeds);
  ir::Graph before = prepared(m, sig);
  EXPECT_EQ(count_ops(before, "SoftmaxCrossEntropyLoss"), 1);
  EXPECT_EQ(count_ops(before, "Slice"), 2);  // logits and labels
  EXPECT_EQ(count_ops(before, "Reshape"), 2);
  ir::Graph after = before;
  EXPECT_EQ(fuse_only(after, sig, m.params), 1);
  EXPECT_EQ(count_ops(after, "SoftmaxCrossEntropyLoss"), 0);
  EXPECT_EQ(count_ops(after, "LinearCrossEntropy", "onyx"), 1);
  EXPECT_EQ(count_ops(after, "Transpose"), 0);
  EXPECT_EQ(count_ops(after, "MatMulT", "onyx"), 0);
  EXPECT_EQ(count_ops(after, "Add"), 0);
  EXPECT_EQ(count_ops(after, "MatMul"), 1);   // only x · w1 is left
  EXPECT_EQ(count_ops(after, "Slice"), 2);    // the shift moved onto h; labels keep theirs
  EXPECT_EQ(count_ops(after, "Reshape"), 2);  // h rows (N, C); labels
  for (auto& n : after.nodes)
    if (n.op_type == "LinearCrossEntropy") {
      EXPECT_EQ(n.inputs.size(), GetParam().head >= Head::MatMulTBias ? 4u : 3u);
      EXPECT_EQ(n.attr_int("ignore_index", 0), -100);
    }
  expect_same_training(before, after, m.params, feeds);
}

INSTANTIATE_TEST_SUITE_P(Forms, CrossEntropyFusionHeads,
                         ::testing::Values(HeadCase{"MatMul_Transpose", Head::MatMulTranspose},
                                           HeadCase{"MatMulT", Head::MatMulT},
                                           HeadCase{"MatMulT_bias", Head::MatMulTBias},
                                           HeadCase{"MatMul_Add_bias", Head::MatMulWAdd}),
                         [](const auto& info) { return std::string(info.param.name); });

// A classifier: Gemm(h (B,C), W (K,C), b, transB=1) → SCE (reduction sum), as bert-mini / vit-tiny.
TEST(CrossEntropyFusion, GemmClassifierHead) {
  G m;
  m.input("x", DType::Float32);
  m.input("labels", DType::Int64);
  m.param("w", rand_f32({5, 6}, 21));
  m.param("b", rand_f32({5}, 22));
  std::string lg = m.node("Gemm", {"x", "w", "b"}, "logits", {{"transB", attr_i(1)}});
  m.node("SoftmaxCrossEntropyLoss", {lg, "labels"}, "loss", {{"reduction", attr_s("sum")}});
  m.output("loss");
  std::map<std::string, Tensor> feeds{{"x", rand_f32({7, 6}, 23)},
                                      {"labels", ints({7}, {0, 4, 2, 2, 1, 3, 0})}};
  auto sig = sig_of(feeds);
  ir::Graph before = prepared(m, sig), after = before;
  EXPECT_EQ(fuse_only(after, sig, m.params), 1);
  EXPECT_EQ(count_ops(after, "Gemm"), 0);
  EXPECT_EQ(count_ops(after, "Reshape"), 0);  // h is already (N, C)
  EXPECT_EQ(count_ops(after, "LinearCrossEntropy", "onyx"), 1);
  expect_same_training(before, after, m.params, feeds);
}

// The trainer's appended loss (LossSpec CrossEntropy: Flatten(logits) and Reshape(labels)) over a
// model whose output is 3-D logits, through the whole forward pipeline.
TEST(CrossEntropyFusion, AppendedLossThroughPipeline) {
  G m;
  m.input("ids", DType::Int64);
  m.param("wte", rand_f32({V, C}, 31));
  m.param("w1", rand_f32({C, C}, 32));
  std::string h =
      m.node("Tanh", {m.node("MatMul", {m.node("Gather", {"wte", "ids"}, "x"), "w1"}, "xw")}, "h");
  m.node("MatMul", {h, m.node("Transpose", {"wte"}, "wte_t", {{"perm", attr_ints({1, 0})}})},
         "logits");
  m.output("logits");
  auto feeds = lm_feeds();
  autodiff::GradientOptions opts;
  opts.loss.kind = autodiff::LossSpec::Kind::CrossEntropy;
  opts.loss.labels = "labels";
  auto lg = autodiff::build_loss_graph(*m.g, opts, sig_of(feeds));
  ir::Graph fwd = *lg.graph;
  fwd.outputs.resize(1);  // the loss only, as TrainingSession does
  passes::PassReport report;
  ir::Graph fused = passes::optimize_forward(fwd, sig_of(feeds), m.params, {}, &report);
  EXPECT_EQ(report.applied("cross_entropy_fusion"), 1);
  EXPECT_EQ(count_ops(fused, "LinearCrossEntropy", "onyx"), 1);
  EXPECT_EQ(count_ops(fused, "SoftmaxCrossEntropyLoss"), 0);
  passes::OptimizeOptions plain;
  plain.fusions = false;
  ir::Graph unfused = passes::optimize_forward(fwd, sig_of(feeds), m.params, plain, nullptr);
  // Outputs renamed to "loss" for the shared training helper.
  for (ir::Graph* g : {&fused, &unfused}) {
    for (auto& n : g->nodes)
      for (auto& o : n.outputs)
        if (o == lg.loss) o = "loss";
    g->outputs[0].name = "loss";
  }
  expect_same_training(unfused, fused, m.params, feeds);
  // Evaluation keeps the logits as an output: then nothing is fused.
  ir::Graph eval = passes::optimize_forward(*lg.graph, sig_of(feeds), m.params, {}, nullptr);
  EXPECT_EQ(count_ops(eval, "LinearCrossEntropy", "onyx"), 0);
}

TEST(CrossEntropyFusion, LeavesOtherChainsAlone) {
  auto feeds = lm_feeds();
  auto sig = sig_of(feeds);
  {  // logits also a graph output
    G m = lm_graph(Head::MatMulTranspose, /*logits_output=*/true);
    ir::Graph g = prepared(m, sig);
    EXPECT_EQ(fuse_only(g, sig, m.params), 0);
  }
  {  // the Slice cuts the vocabulary axis
    G m = lm_graph(Head::MatMulTranspose, false, /*slice_axis=*/2);
    for (auto& n : m.g->nodes)
      if (n.op_type == "Reshape" && n.outputs[0] == "rows") n.inputs[1] = "rows_v2";
    m.constant("rows_v2", ints({2}, {-1, V - 1}));
    for (auto& n : m.g->nodes)  // labels of the full sequence: (B·T) rows
      if (n.op_type == "Slice" && n.outputs[0] == "lab_s") n.inputs[1] = "s0";
    ir::Graph g = prepared(m, sig);
    EXPECT_EQ(fuse_only(g, sig, m.params), 0);
  }
  {  // class weights, and reduction none
    for (int variant = 0; variant < 2; variant++) {
      G m = lm_graph(Head::MatMulTranspose);
      for (auto& n : m.g->nodes)
        if (n.op_type == "SoftmaxCrossEntropyLoss") {
          if (variant == 0)
            n.inputs.push_back(m.constant("cw", rand_f32({V}, 40, 0.5f, 1.5f)));
          else
            n.attrs["reduction"] = attr_s("none");
        }
      if (variant == 1) {  // a scalar loss again, after the per-row losses
        for (auto& n : m.g->nodes)
          if (n.op_type == "SoftmaxCrossEntropyLoss") n.outputs[0] = "per_row";
        m.node("ReduceSum", {"per_row"}, "loss", {{"keepdims", attr_i(0)}});
      }
      ir::Graph g = prepared(m, sig);
      EXPECT_EQ(fuse_only(g, sig, m.params), 0) << variant;
    }
  }
}

// Random feeds for an exported model's inputs (batch 2): token ids and labels small enough for
// every vocabulary / class count, one ignored label, masks of ones, pixels in [-1, 1].
std::map<std::string, Tensor> export_feeds(const ir::Graph& g) {
  std::map<std::string, Tensor> f;
  std::mt19937 r(3);
  for (auto& in : g.inputs) {
    Shape s = in.shape;
    for (auto& d : s) d = d < 0 ? 2 : d;
    int64_t n = shape_numel(s);
    if (in.dtype == DType::Float32) {
      f[in.name] = rand_f32(s, 7);
      continue;
    }
    std::vector<int64_t> v(n);
    for (int64_t i = 0; i < n; i++) {
      if (in.name == "attention_mask")
        v[i] = 1;
      else if (in.name == "token_type_ids")
        v[i] = 0;
      else if (in.name == "labels")
        v[i] = i == 1 ? -100 : (int64_t)(r() % 2);
      else
        v[i] = (int64_t)(r() % 1000);
    }
    f[in.name] = ints(s, v);
  }
  return f;
}

TEST(CrossEntropyFusion, FiresOnRealExports) {
  for (const char* model : {"gpt2-tiny", "bert-mini", "vit-tiny"}) {
    std::string path = onyx::test_exports::real_export(model);
    if (path.empty()) GTEST_SKIP() << onyx::test_exports::real_export_missing(model);
    ir::Graph g = ir::load_onnx(path);
    auto feeds = export_feeds(g);
    auto [fused, report, sig, vars] = onyx::test_exports::optimize_export(g, feeds);
    EXPECT_EQ(report.applied("cross_entropy_fusion"), 1) << model;
    EXPECT_EQ(count_ops(fused, "LinearCrossEntropy", "onyx"), 1) << model;
    EXPECT_EQ(count_ops(fused, "SoftmaxCrossEntropyLoss"), 0) << model;
    passes::OptimizeOptions plain;
    plain.fusions = false;
    ir::Graph unfused = passes::optimize_forward(g, sig, vars, plain, nullptr);
    std::string out = g.outputs[0].name;
    runtime::Session sf(std::make_shared<ir::Graph>(fused), vars);
    runtime::Session su(std::make_shared<ir::Graph>(unfused), vars);
    double lf = sf.run(feeds).at(out).get_as_double(0);
    double lu = su.run(feeds).at(out).get_as_double(0);
    EXPECT_NEAR(lf, lu, 1e-5 * std::fabs(lu)) << model;
  }
}

}  // namespace
