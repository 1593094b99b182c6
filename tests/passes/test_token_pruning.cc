// tests/passes/test_token_pruning.cc — token_pruning.cc: a [CLS] read-out (Gather(h, 0, axis=1))
// is moved up through the last layer's per-token ops. Graph before/after on a small hand-built
// chain (every supported op kind, the selection ends at the attention's queries), then training
// BERT and ViT classifiers (Hugging Face builders) with and without the pass: the same loss and
// gradients, fewer FLOPs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/hf_model.h"
#include "passes/pass.h"
#include "runtime/plan_stats.h"
#include "runtime/session.h"
#include "train/training_session.h"

using namespace onyx;

namespace {

Tensor randn(Shape s, std::mt19937& rng, float scale = 1.0f) {
  Tensor t(DType::Float32, s);
  std::normal_distribution<float> nd(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = nd(rng);
  return t;
}

ir::Node node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out,
              const std::string& domain = "") {
  ir::Node n;
  n.op_type = op;
  n.domain = domain;
  n.name = out[0] + "_node";
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

std::map<std::string, int> histogram(const ir::Graph& g) {
  std::map<std::string, int> h;
  for (auto& n : g.nodes) h[n.op_type]++;
  return h;
}

}  // namespace

// x → Attention(q = x·Wqᵀ, k, v) → + x → LayerNorm → MatMulT(+b) → Gelu → Dropout(0) → Add →
// Gather(·, 0, axis 1): after the pass only the queries and the per-token tail are pruned.
TEST(TokenPruning, MovesTheSelectionUpToTheAttentionQueries) {
  const int64_t B = 2, T = 5, C = 8;
  std::mt19937 rng(3);
  ir::Graph g;
  g.opsets[""] = 17;
  g.opsets["onyx"] = 1;
  g.inputs.push_back({"x", DType::Float32, {B, T, C}, {"", "", ""}, true});
  for (const char* w : {"wq", "wk", "wv", "w1"}) g.add_initializer(w, randn({C, C}, rng, 0.3f));
  g.add_initializer("b1", randn({C}, rng));
  g.add_initializer("gamma", randn({C}, rng));
  g.add_initializer("beta", randn({C}, rng));
  g.add_initializer("idx", Tensor::scalar_i64(0));
  g.add_initializer("ratio", Tensor::scalar_f32(0.0f));
  auto mmt = [&](const char* a, const char* w, const char* out) {
    ir::Node n = node("MatMulT", {a, w}, {out}, "onyx");
    n.attrs["transB"].kind = ir::Attribute::Kind::Int;
    n.attrs["transB"].i = 1;
    return n;
  };
  g.nodes.push_back(mmt("x", "wq", "q"));
  g.nodes.push_back(mmt("x", "wk", "k"));
  g.nodes.push_back(mmt("x", "wv", "v"));
  ir::Node att = node("Attention", {"q", "k", "v"}, {"a"}, "onyx");
  att.attrs["num_heads"].kind = ir::Attribute::Kind::Int;
  att.attrs["num_heads"].i = 2;
  att.attrs["scale"].kind = ir::Attribute::Kind::Float;
  att.attrs["scale"].f = 0.5f;
  g.nodes.push_back(att);
  g.nodes.push_back(node("Add", {"a", "x"}, {"r1"}));
  g.nodes.push_back(node("LayerNormalization", {"r1", "gamma", "beta"}, {"ln"}));
  ir::Node lin = mmt("ln", "w1", "h");
  lin.inputs.push_back("b1");
  g.nodes.push_back(lin);
  g.nodes.push_back(node("Gelu", {"h"}, {"gl"}));
  g.nodes.push_back(node("Dropout", {"gl", "ratio"}, {"dr"}));
  g.nodes.push_back(node("Add", {"dr", "ln"}, {"r2"}));
  ir::Node gather = node("Gather", {"r2", "idx"}, {"cls"});
  gather.attrs["axis"].kind = ir::Attribute::Kind::Int;
  gather.attrs["axis"].i = 1;
  g.nodes.push_back(gather);
  g.outputs.push_back({"cls", DType::Float32, {}, {}, false});

  std::map<std::string, TensorMeta> sig = {{"x", {DType::Float32, {B, T, C}}}};
  passes::OptimizeOptions off;
  off.token_pruning = false;
  passes::PassReport rep_on, rep_off;
  ir::Graph plain = passes::optimize_forward(g, sig, {}, off, &rep_off);
  ir::Graph pruned = passes::optimize_forward(g, sig, {}, {}, &rep_on);
  EXPECT_EQ(rep_off.applied("token_pruning"), 0);
  // Add, Dropout (ratio 0: removed before), Gelu, MatMulT, LayerNorm, Add, Attention
  EXPECT_GE(rep_on.applied("token_pruning"), 5);
  auto h = histogram(pruned);
  // The selection now sits at the inputs: x (for the residual and the queries) only.
  int gathers_of_x = 0;
  for (auto& n : pruned.nodes)
    if (n.op_type == "Gather" && n.inputs[0] == "x") gathers_of_x++;
  EXPECT_EQ(gathers_of_x, 1);
  EXPECT_EQ(h["Gather"], 1);
  EXPECT_EQ(h["Attention"], 1);

  Tensor x = randn({B, T, C}, rng);
  auto run = [&](const ir::Graph& gr) {
    runtime::Session s(std::make_shared<ir::Graph>(gr));
    return s.run({{"x", x}}).at("cls");
  };
  Tensor want = run(g), got = run(pruned);
  ASSERT_EQ(want.shape(), got.shape());
  for (int64_t i = 0; i < want.numel(); i++)
    EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5) << i;
  (void)plain;
}

namespace {

void train_both(const char* config, models::Task task, bool image) {
  models::BuiltModel m =
      models::build_hf_model(models::parse_hf_config(config, "config.json"), task, 4);
  std::mt19937 rng(9);
  std::map<std::string, Tensor> batch;
  const int64_t B = 3, T = 10;
  if (image) {
    batch["pixel_values"] = randn({B, 3, 8, 8}, rng);
  } else {
    Tensor ids(DType::Int64, {B, T});
    for (int64_t i = 0; i < B * T; i++)
      ids.data<int64_t>()[i] = (int64_t)(rng() % m.config.vocab_size);
    batch["input_ids"] = ids;
    for (auto& in : m.model.graph->inputs)
      if (in.name != "input_ids" && in.name != "labels") {
        Tensor t = Tensor::zeros(DType::Int64, {B, T});
        if (in.name == "attention_mask")
          for (int64_t i = 0; i < B * T; i++) t.data<int64_t>()[i] = (i % T) < T - (i / T) ? 1 : 0;
        batch[in.name] = t;
      }
  }
  Tensor labels(DType::Int64, {B});
  for (int64_t i = 0; i < B; i++)
    labels.data<int64_t>()[i] = (int64_t)(rng() % m.config.num_labels);
  batch["labels"] = labels;

  double loss[2], flops[2];
  std::map<std::string, std::vector<double>> grads[2];
  int applied[2];
  for (int on = 0; on < 2; on++) {
    autodiff::GradientOptions opts;
    opts.loss = m.model.loss;
    train::TrainingSession ts(m.model.graph, opts);
    passes::OptimizeOptions po;
    po.token_pruning = on == 1;
    ts.set_pass_options(po);
    loss[on] = ts.forward_backward(batch, false, 1, /*training=*/false);
    for (auto& p : ts.parameters()) grads[on][p] = ts.grads().view(p).to_double_vector();
    flops[on] = runtime::count_flops(*ts.training_graph_for(batch).graph, ts.plan_for(batch)).total;
    applied[on] = ts.pass_report_for(batch).applied("token_pruning");
  }
  EXPECT_EQ(applied[0], 0);
  EXPECT_GT(applied[1], 3);
  EXPECT_LT(flops[1], flops[0]);
  EXPECT_NEAR(loss[1], loss[0], 1e-6 * std::abs(loss[0]));
  for (auto& [p, g0] : grads[0]) {
    const auto& g1 = grads[1].at(p);
    double scale = 0;
    for (double v : g0) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < g0.size(); i++)
      ASSERT_NEAR(g1[i], g0[i], 1e-5 * scale + 1e-9) << p << "[" << i << "]";
  }
}

}  // namespace

TEST(TokenPruning, BertClassifierTrainsTheSame) {
  train_both(
      R"({"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "vocab_size": 50, "max_position_embeddings": 32, "type_vocab_size": 2,
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "num_labels": 3})",
      models::Task::SequenceClassification, false);
}

TEST(TokenPruning, VitClassifierTrainsTheSame) {
  train_both(
      R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "image_size": 8, "patch_size": 4, "num_channels": 3, "num_labels": 5})",
      models::Task::ImageClassification, true);
}
