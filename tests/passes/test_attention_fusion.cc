// tests/passes/test_attention_fusion.cc — passes/attention_fusion.cc: the exported attention
// subgraph (tests/passes/attention_graphs.h builds it in each variant the pass claims) becomes one
// onyx.Attention node — op counts before and after, equal outputs through runtime::Session within
// 1e-5 — and chains the pass must leave alone stay unfused. Attention dropout (Softmax → Dropout →
// MatMul) is fused into the op's dropout_ratio with the Dropout's rng identity: equal outputs in a
// training run (same mask) and outside one. Then the real opset-14 exports in <build>/bench-exports
// (bert-mini, gpt2-tiny, vit-tiny): 4, 4 and 6 fused attentions after passes::optimize_forward,
// and the same loss with and without fusions.
#include <gtest/gtest.h>

#include <filesystem>

#include "../real_exports.h"
#include "attention_graphs.h"
#include "autodiff/gradient.h"
#include "ir/onnx_io.h"
#include "passes/pass.h"
#include "runtime/session.h"

using namespace onyx;
using namespace onyx::attn_test;

namespace {

int count_ops(const ir::Graph& g, const std::string& op, const std::string& domain = "") {
  int n = 0;
  for (auto& nd : g.nodes)
    if (nd.op_type == op && nd.domain == domain) n++;
  return n;
}

std::map<std::string, TensorMeta> signature_of(const ir::Graph& g) {
  std::map<std::string, TensorMeta> sig;
  for (auto& in : g.inputs) sig[in.name] = {in.dtype, in.shape};
  return sig;
}

std::set<std::string> weights_of(const Spec& s) {
  if (!s.projections) return {};
  return {"q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias"};
}

// Runs fuse_attention alone (after folding) and removes what it left dead; returns the count.
int fuse_only(ir::Graph& g, const std::set<std::string>& vars) {
  passes::PassContext ctx;
  ctx.signature = signature_of(g);
  ctx.variables = vars;
  ctx.refresh(g);
  int n = passes::fuse_attention(g, ctx);
  passes::eliminate_dead_nodes(g);
  return n;
}

std::map<std::string, Tensor> feeds_for(const Spec& s) {
  std::map<std::string, Tensor> f;
  if (s.projections) {
    f["x"] = random_tensor({s.B, s.Tq, s.E}, 5);
  } else {
    f["Q"] = random_tensor({s.B, s.Tq, s.H * s.D}, 6, -2, 2);
    f["K"] = random_tensor({s.B, s.Tk, s.kv_heads() * s.D}, 7, -2, 2);
    f["V"] = random_tensor({s.B, s.Tk, s.kv_heads() * s.Dv}, 8);
  }
  if (s.mask != Mask::None) f["mask"] = padding_mask(s);
  return f;
}

Tensor run(const ir::Graph& g, const std::map<std::string, Tensor>& feeds, const std::string& out,
           const runtime::RunOptions& ro = {}) {
  runtime::Session s(std::make_shared<ir::Graph>(g));
  return s.run(feeds, ro).at(out);
}

runtime::RunOptions training_run(uint64_t seed) {
  runtime::RunOptions ro;
  ro.training = true;
  ro.seed = seed;
  return ro;
}

const ir::Node* find_op(const ir::Graph& g, const std::string& op) {
  for (auto& n : g.nodes)
    if (n.op_type == op) return &n;
  return nullptr;
}

void expect_close(const Tensor& a, const Tensor& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); i++) {
    double x = a.get_as_double(i), y = b.get_as_double(i);
    ASSERT_NEAR(x, y, rtol * (1e-2 + std::fabs(y))) << what << " element " << i;
  }
}

struct Variant {
  const char* name;
  Spec spec;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  Spec s;
  v.push_back({"plain_div", s});  // ViT: no mask
  s.mask = Mask::Padding;
  v.push_back({"bert_padding_mask", s});
  s.mask = Mask::None, s.causal = true;
  v.push_back({"gpt2_causal_where", s});
  s.mask = Mask::Padding;
  v.push_back({"causal_and_padding", s});
  s = Spec();
  s.scale = Scale::MulAfter, s.mask = Mask::Full;
  v.push_back({"mul_scale_full_mask", s});
  s = Spec();
  s.scale = Scale::MulOnQ;
  v.push_back({"scale_on_q", s});
  s.scale = Scale::MulOnBoth, s.k = KLayout::DoubleTranspose;
  v.push_back({"scale_on_q_and_k_double_transpose", s});
  s = Spec();
  s.Tq = 6, s.Tk = 9, s.Dv = 3, s.mask = Mask::Full;
  v.push_back({"cross_attention_dv", s});
  s = Spec();
  s.projections = true, s.mask = Mask::Padding, s.Tq = s.Tk = 7;
  v.push_back({"with_projections", s});
  s = Spec();
  s.B = 3, s.mask = Mask::Padding, s.scale = Scale::MulOnBoth, s.nan_guard = true;
  v.push_back({"sdpa_nan_guard_fully_masked_rows", s});
  s = Spec();
  s.H = 4, s.Hk = 2, s.mask = Mask::Padding, s.causal = true;
  v.push_back({"grouped_query_repeat_kv", s});
  s = Spec();
  s.Hk = 1, s.projections = true, s.scale = Scale::MulOnBoth;
  v.push_back({"multi_query_with_projections", s});
  return v;
}

}  // namespace

TEST(AttentionFusion, FusesEachVariantWithEqualNumerics) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    ir::Graph before = unfused_attention(v.spec);
    ir::Graph after = before;
    EXPECT_EQ(fuse_only(after, weights_of(v.spec)), 1);
    // before: the exported chain; after: one fused node, no head transposes or score ops left
    EXPECT_EQ(count_ops(before, "Softmax"), 1);
    EXPECT_GE(count_ops(before, "Transpose"), 4);
    EXPECT_EQ(count_ops(after, "Attention", "onyx"), 1);
    EXPECT_EQ(count_ops(after, "Softmax"), 0);
    EXPECT_EQ(count_ops(after, "Transpose"), 0);
    EXPECT_EQ(count_ops(after, "Where"), 0);
    EXPECT_EQ(count_ops(after, "Div"), 0);
    EXPECT_EQ(count_ops(after, "MatMul"), v.spec.projections ? 3 : 0);
    EXPECT_EQ(count_ops(after, "Reshape"), 0);
    for (auto& n : after.nodes)
      if (n.op_type == "Attention") {
        EXPECT_EQ(n.attr_int("num_heads", 0), v.spec.H);
        EXPECT_EQ(n.attr_int("num_kv_heads", v.spec.H), v.spec.kv_heads());
        EXPECT_NEAR(n.attr_float("scale", 0), 1.0 / std::sqrt((double)v.spec.D), 1e-6);
        EXPECT_EQ(n.attr_int("causal", -1), v.spec.causal ? 1 : 0);
        EXPECT_EQ(n.inputs.size(), v.spec.mask == Mask::None ? 3u : 4u);
        EXPECT_EQ(n.attr_int("zero_masked_rows", 0), v.spec.nan_guard ? 1 : 0);
      }
    EXPECT_EQ(count_ops(after, "IsNaN"), 0);
    EXPECT_EQ(count_ops(after, "Expand"), 0);
    auto feeds = feeds_for(v.spec);
    expect_close(run(after, feeds, "out"), run(before, feeds, "out"), 1e-5, v.name);
  }
}

TEST(AttentionFusion, FiresInsideTheForwardPipeline) {
  Spec s;
  s.projections = true, s.mask = Mask::Padding, s.causal = true;
  ir::Graph g = unfused_attention(s);
  passes::PassReport report;
  ir::Graph opt = passes::optimize_forward(g, signature_of(g), weights_of(s), {}, &report);
  EXPECT_EQ(report.applied("attention_fusion"), 1);
  EXPECT_EQ(count_ops(opt, "Attention", "onyx"), 1);
  auto feeds = feeds_for(s);
  expect_close(run(opt, feeds, "out"), run(g, feeds, "out"), 1e-5, "pipeline");
}

TEST(AttentionFusion, LeavesOtherChainsAlone) {
  // A scale applied after the mask would scale the mask too.
  {
    Spec s;
    s.mask = Mask::Padding;
    s.scale = Scale::MulOnQ;
    ir::Graph g = unfused_attention(s);
    // move a Div after the mask Add: rewire softmax to read Div(Add(...))
    for (auto& n : g.nodes)
      if (n.op_type == "Softmax") {
        ir::Node d;
        d.name = "late_div";
        d.op_type = "Div";
        d.inputs = {n.inputs[0], "late_c"};
        d.outputs = {"late_div_out"};
        g.add_initializer("late_c", Tensor::scalar_f32(2.0f));
        n.inputs[0] = "late_div_out";
        g.nodes.insert(g.nodes.begin(), d);
        break;
      }
    passes::sort_topologically(g);
    EXPECT_EQ(fuse_only(g, {}), 0);
  }
  // A Where whose condition is not causal (the diagonal masked too) is an additive mask, not the
  // causal limit: row 0 is hidden whole, its softmax spreads over every key, as unfused.
  {
    Spec s;
    s.causal = true;
    ir::Graph g = unfused_attention(s);
    Tensor& c = g.initializers.at("causal_cond");
    for (int64_t i = 0; i < s.Tq; i++) c.data<uint8_t>()[i * s.Tk + i] = 1;
    ir::Graph fused = g;
    EXPECT_EQ(fuse_only(fused, {}), 1);
    const ir::Node* att = find_op(fused, "Attention");
    ASSERT_TRUE(att);
    EXPECT_EQ(att->attr_int("causal", -1), 0);
    EXPECT_EQ(att->inputs.size(), 4u);
    auto feeds = feeds_for(s);
    expect_close(run(fused, feeds, "out"), run(g, feeds, "out"), 1e-5, "diagonal masked");
  }
  // Probabilities read twice (e.g. returned as attention weights).
  {
    Spec s;
    ir::Graph g = unfused_attention(s);
    for (auto& n : g.nodes)
      if (n.op_type == "Softmax") {
        ir::ValueInfo vi;
        vi.name = n.outputs[0];
        g.outputs.push_back(vi);
      }
    EXPECT_EQ(fuse_only(g, {}), 0);
  }
  // A mask computed from trainable weights (a learned bias) would lose its gradient.
  {
    Spec s;
    s.mask = Mask::Full;
    ir::Graph g = unfused_attention(s);
    std::vector<ir::ValueInfo> inputs;
    for (auto& in : g.inputs)
      if (in.name != "mask") inputs.push_back(in);
    g.inputs = inputs;
    g.add_initializer("mask", padding_mask(s));
    EXPECT_EQ(fuse_only(g, {"mask"}), 0);
  }
  // Head dims that do not line up (K reshaped to other heads than Q).
  {
    Spec s;
    ir::Graph g = unfused_attention(s);
    g.initializers.at("k_shape") =
        Tensor::from_vector<int64_t>(DType::Int64, {4}, {s.B, s.Tk, 1, 8});
    g.initializers.at("q_shape") =
        Tensor::from_vector<int64_t>(DType::Int64, {4}, {s.B, s.Tq, 1, 8});
    // Q (B,1,T,8)·Kᵀ (B,1,8,T) is a valid graph with H=1, but V still has 2 heads: not attention.
    EXPECT_EQ(fuse_only(g, {}), 0);
  }
}

// ---- attention dropout ----------------------------------------------------------------------

TEST(AttentionFusion, FusesAttentionDropoutWithItsRngIdentity) {
  std::vector<Variant> vs;
  Spec s;
  s.mask = Mask::Padding, s.dropout = 0.1f;
  vs.push_back({"bert_padding_dropout", s});
  s.mask = Mask::None, s.causal = true;
  vs.push_back({"gpt2_causal_dropout", s});
  s = Spec();
  s.projections = true, s.mask = Mask::Padding, s.Tq = s.Tk = 7, s.dropout = 0.3f;
  vs.push_back({"with_projections_dropout", s});
  for (const Variant& v : vs) {
    SCOPED_TRACE(v.name);
    ir::Graph before = unfused_attention(v.spec);
    ir::Graph after = before;
    EXPECT_EQ(count_ops(before, "Dropout"), 1);
    EXPECT_EQ(fuse_only(after, weights_of(v.spec)), 1);
    EXPECT_EQ(count_ops(after, "Attention", "onyx"), 1);
    EXPECT_EQ(count_ops(after, "Dropout"), 0);
    EXPECT_EQ(count_ops(after, "Softmax"), 0);
    const ir::Node* att = find_op(after, "Attention");
    ASSERT_TRUE(att);
    EXPECT_FLOAT_EQ(att->attr_float("dropout_ratio", 0), v.spec.dropout);
    EXPECT_EQ(att->attr_string("rng_key", ""), kDropoutOut);
    EXPECT_EQ(att->attr_int("seed", -1), 0);
    auto feeds = feeds_for(v.spec);
    // outside a training run both are plain attention; in one, the same mask is dropped
    expect_close(run(after, feeds, "out"), run(before, feeds, "out"), 1e-5, v.name);
    for (uint64_t seed : {1ull, 99ull}) {
      Tensor a = run(after, feeds, "out", training_run(seed));
      expect_close(a, run(before, feeds, "out", training_run(seed)), 1e-5, v.name);
      Tensor plain = run(after, feeds, "out");
      bool differs = false;
      for (int64_t i = 0; i < a.numel(); i++)
        differs |= a.data<float>()[i] != plain.data<float>()[i];
      EXPECT_TRUE(differs) << "dropout active in a training run";
    }
  }
}

TEST(AttentionFusion, DropoutSeedAttributeAndInertDropouts) {
  // The Dropout's own seed attribute travels with it.
  {
    Spec s;
    s.dropout = 0.2f;
    ir::Graph before = unfused_attention(s);
    for (auto& n : before.nodes)
      if (n.op_type == "Dropout") n.attrs["seed"] = int_attr(17);
    ir::Graph after = before;
    EXPECT_EQ(fuse_only(after, {}), 1);
    EXPECT_EQ(find_op(after, "Attention")->attr_int("seed", 0), 17);
    auto feeds = feeds_for(s);
    expect_close(run(after, feeds, "out", training_run(4)),
                 run(before, feeds, "out", training_run(4)), 1e-5, "seed attribute");
  }
  // training_mode constant false: inert, fused without dropout.
  {
    Spec s;
    s.dropout = 0.2f;
    ir::Graph g = unfused_attention(s);
    g.initializers.at("attn_dropout_training") = Tensor::from_vector<uint8_t>(DType::Bool, {}, {0});
    EXPECT_EQ(fuse_only(g, {}), 1);
    EXPECT_FALSE(find_op(g, "Attention")->has_attr("dropout_ratio"));
  }
}

TEST(AttentionFusion, LeavesOtherDropoutsAlone) {
  // The Dropout's mask is read (returned).
  {
    Spec s;
    s.dropout = 0.1f;
    ir::Graph g = unfused_attention(s);
    for (auto& n : g.nodes)
      if (n.op_type == "Dropout") n.outputs.push_back("attn_dropout_mask");
    ir::ValueInfo vi;
    vi.name = "attn_dropout_mask";
    g.outputs.push_back(vi);
    EXPECT_EQ(fuse_only(g, {}), 0);
  }
  // ratio, or training_mode, known only at run time.
  for (const char* runtime_input : {"attn_dropout_ratio", "attn_dropout_training"}) {
    Spec s;
    s.dropout = 0.1f;
    ir::Graph g = unfused_attention(s);
    ir::ValueInfo vi;
    vi.name = runtime_input;
    vi.dtype = g.initializers.at(runtime_input).dtype();
    vi.shape = {};
    vi.has_shape = true;
    g.initializers.erase(runtime_input);
    g.inputs.push_back(vi);
    EXPECT_EQ(fuse_only(g, {}), 0) << runtime_input;
  }
}

// ---- the real exports -----------------------------------------------------------------------

namespace {

struct Export {
  const char* model;
  int attentions;
};

using test_exports::export_feeds;

}  // namespace

TEST(AttentionFusion, FiresOnRealExports) {
  for (Export e : {Export{"bert-mini", 4}, Export{"gpt2-tiny", 4}, Export{"vit-tiny", 6}}) {
    SCOPED_TRACE(e.model);
    std::string path = test_exports::real_export(e.model);
    if (path.empty()) GTEST_SKIP() << test_exports::real_export_missing(e.model);
    ir::Graph g = ir::load_onnx(path);
    auto feeds = export_feeds(g, 2);
    auto [fused, report, sig, vars] = onyx::test_exports::optimize_export(g, feeds);
    EXPECT_EQ(report.applied("attention_fusion"), e.attentions);
    EXPECT_EQ(count_ops(fused, "Attention", "onyx"), e.attentions);
    EXPECT_EQ(count_ops(fused, "Softmax"), 0);
    passes::OptimizeOptions plain;
    plain.fusions = false;
    ir::Graph unfused = passes::optimize_forward(g, sig, vars, plain, nullptr);
    EXPECT_EQ(count_ops(unfused, "Softmax"), e.attentions);
    std::string out = g.outputs[0].name;
    expect_close(run(fused, feeds, out), run(unfused, feeds, out), 1e-5, e.model);
  }
}
