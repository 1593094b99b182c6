// tests/passes/test_gradient_into_buffer.cc — passes/gradient_into_buffer.cc: on BERT, GPT-2
// (tied embedding / LM head) and ViT (patch Conv) graphs built by the Hugging Face builders, the
// training graph loses its onyx.AccumulateGrad nodes wherever the producer can write the bound
// gradient itself (op counts before and after), the tied weight's two contributions (LM head and
// embedding) both add into the buffer, and the gradients in the flat buffer are bit-identical
// with and without the pass — for a plain step and for a second micro-batch accumulated onto the
// first (the tied weight's to rounding: (P + g1) + g2 against P + (g1 + g2)). A small
// hand-built graph shows what stays (shared and constant gradients). The real opset-14 exports in
// <build>/bench-exports keep only a handful of AccumulateGrads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <tuple>

#include "../real_exports.h"
#include "decomposed_graphs.h"
#include "ir/onnx_io.h"
#include "models/hf_model.h"
#include "train/training_session.h"

using namespace onyx;
using namespace onyx::fusion_test;

namespace {

Tensor ids(Shape s, int64_t vocab, std::mt19937& rng) {
  Tensor t(DType::Int64, s);
  for (int64_t i = 0; i < t.numel(); i++) t.data<int64_t>()[i] = (int64_t)(rng() % vocab);
  return t;
}

std::map<std::string, Tensor> make_batch(const models::BuiltModel& m, bool image, uint32_t seed) {
  std::mt19937 rng(seed);
  std::map<std::string, Tensor> batch;
  const int64_t B = 4, T = 12;
  if (image) {
    Tensor px(DType::Float32, {B, 3, 8, 8});
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < px.numel(); i++) px.data<float>()[i] = nd(rng);
    batch["pixel_values"] = px;
    batch["labels"] = ids({B}, m.config.num_labels, rng);
    return batch;
  }
  batch["input_ids"] = ids({B, T}, m.config.vocab_size, rng);
  batch["labels"] =
      m.task == models::Task::CausalLM ? batch["input_ids"] : ids({B}, m.config.num_labels, rng);
  for (auto& in : m.model.graph->inputs)
    if (!batch.count(in.name)) {  // attention_mask / token_type_ids
      Tensor t = Tensor::zeros(DType::Int64, {B, T});
      if (in.name == "attention_mask")
        for (int64_t i = 0; i < B * T; i++) t.data<int64_t>()[i] = (i % T) < T - (i / T) ? 1 : 0;
      batch[in.name] = t;
    }
  return batch;
}

struct Result {
  double loss1 = 0, loss2 = 0;
  std::map<std::string, std::vector<float>> step1, step2;  // after one batch, after accumulating
  std::map<std::string, int> ops;                          // training graph histogram
  int rewrites = 0;
  std::set<std::string> tied;  // tied weights whose two contributions add into the buffer
};

Result train(const models::BuiltModel& m, bool image, bool into_buffer) {
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  train::TrainingSession ts(m.model.graph, opts);
  passes::OptimizeOptions po;
  po.gradient_into_buffer = into_buffer;
  ts.set_pass_options(po);
  auto b1 = make_batch(m, image, 5), b2 = make_batch(m, image, 6);
  auto grads = [&] {
    std::map<std::string, std::vector<float>> g;
    for (auto& p : ts.parameters()) {
      Tensor v = ts.grads().view(p);
      g[p].assign(v.data<float>(), v.data<float>() + v.numel());
    }
    return g;
  };
  Result r;
  r.loss1 = ts.forward_backward(b1, /*accumulate=*/false, 7, true);
  r.step1 = grads();
  r.loss2 = ts.forward_backward(b2, /*accumulate=*/true, 7, true);
  r.step2 = grads();
  for (auto& n : ts.training_graph_for(b1).graph->nodes)
    r.ops[(n.domain.empty() ? "" : n.domain + ".") + n.op_type]++;
  r.rewrites = ts.pass_report_for(b1).applied("gradient_into_buffer");
  const auto& tg = ts.training_graph_for(b1);
  for (auto& [p, g] : tg.gradients)
    for (auto& o : tg.graph->outputs)
      if (o.name == passes::tied_gradient_output(g)) r.tied.insert(p);
  return r;
}

// Trains one step plus one accumulated micro-batch with and without the pass; returns the number
// of AccumulateGrad nodes (without, with) and of tied weights written by both contributions.
std::tuple<int, int, int> check(const char* config, models::Task task, bool image) {
  models::BuiltModel m =
      models::build_hf_model(models::parse_hf_config(config, "config.json"), task, 3);
  Result off = train(m, image, false), on = train(m, image, true);
  const int n_params = (int)off.step1.size();
  EXPECT_EQ(off.rewrites, 0);
  EXPECT_EQ(off.ops["onyx.AccumulateGrad"], n_params) << "autodiff ends every gradient with one";
  EXPECT_EQ(on.ops["onyx.AccumulateGrad"], n_params - on.rewrites);
  // Only AccumulateGrad nodes go; every other op count stays.
  // Only AccumulateGrad nodes go, and the Sum of each tied weight's two contributions; every
  // other op count stays.
  for (auto& [op, n] : off.ops) {
    if (op != "onyx.AccumulateGrad") {
      EXPECT_EQ(on.ops[op], n - (op == "Sum" ? (int)on.tied.size() : 0)) << op;
    }
  }
  // Bit-identical: the loss, each gradient after one step and after accumulating a second batch.
  EXPECT_EQ(on.loss1, off.loss1);
  EXPECT_EQ(on.loss2, off.loss2);
  for (auto& [p, g] : off.step1) EXPECT_TRUE(g == on.step1.at(p)) << p << " (first micro-batch)";
  // Accumulated: a tied weight's buffer gets (P + g1) + g2 instead of P + (g1 + g2), the same
  // to rounding; every other gradient is bit-identical.
  for (auto& [p, g] : off.step2) {
    if (!on.tied.count(p)) {
      EXPECT_TRUE(g == on.step2.at(p)) << p << " (accumulated)";
      continue;
    }
    double worst = 0, big = 0;
    for (size_t i = 0; i < g.size(); i++) {
      big = std::max(big, (double)std::fabs(g[i]));
      worst = std::max(worst, (double)std::fabs(g[i] - on.step2.at(p)[i]));
    }
    EXPECT_LE(worst, 1e-6 * big) << p << " (accumulated, tied)";
  }
  EXPECT_TRUE(off.tied.empty());
  std::printf("  %d parameters: AccumulateGrad %d -> %d\n", n_params,
              off.ops["onyx.AccumulateGrad"], on.ops["onyx.AccumulateGrad"]);
  return {off.ops["onyx.AccumulateGrad"], on.ops["onyx.AccumulateGrad"], (int)on.tied.size()};
}

}  // namespace

TEST(GradientIntoBuffer, BertBitIdentical) {
  auto [before, after, tied] = check(
      R"({"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "vocab_size": 50, "max_position_embeddings": 32, "type_vocab_size": 2,
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "num_labels": 3})",
      models::Task::SequenceClassification, false);
  EXPECT_LE(after, before / 4) << "linear, LayerNorm and embedding gradients write directly";
}

TEST(GradientIntoBuffer, Gpt2TiedEmbeddingAddsBothContributionsIntoTheBuffer) {
  auto [before, after, tied] = check(
      R"({"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 4, "vocab_size": 60,
    "n_positions": 32, "resid_pdrop": 0.1, "embd_pdrop": 0.0, "attn_pdrop": 0.1})",
      models::Task::CausalLM, false);
  EXPECT_LE(after, before / 4);
  EXPECT_EQ(tied, 1) << "wte: the embedding's and the LM head's contributions add into the buffer";
}

TEST(GradientIntoBuffer, LlamaUntiedHeadBitIdentical) {
  // the untied LM head's dW is LinearCrossEntropy's, written (and accumulated) in place
  auto [before, after, tied] = check(
      R"({"model_type": "llama", "vocab_size": 70, "hidden_size": 16, "intermediate_size": 24,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "max_position_embeddings": 32, "tie_word_embeddings": false})",
      models::Task::CausalLM, false);
  EXPECT_EQ(after, 0) << "every Llama gradient, the LM head's too, is written by its producer";
}

TEST(GradientIntoBuffer, VitBitIdentical) {
  auto [before, after, tied] = check(
      R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "image_size": 8, "patch_size": 4, "num_channels": 3, "num_labels": 5})",
      models::Task::ImageClassification, true);
  EXPECT_LE(after, before / 4);
}

// A gradient read by another node, or computable from constants, keeps its AccumulateGrad.
TEST(GradientIntoBuffer, LeavesSharedAndConstantGradients) {
  ir::Graph g;
  g.opsets[""] = 14;
  g.opsets["onyx"] = 1;
  auto input = [&](const std::string& n, Shape s) {
    ir::ValueInfo vi;
    vi.name = n;
    vi.dtype = DType::Float32;
    vi.shape = s;
    vi.has_shape = true;
    g.inputs.push_back(vi);
  };
  input("a", {6, 4});
  input("dy", {6, 5});
  g.add_initializer("ca", random_tensor({6, 4}, 1));
  g.add_initializer("cdy", random_tensor({6, 5}, 2));
  auto node = [&](const std::string& op, const std::string& dom, std::vector<std::string> in,
                  std::string out) {
    ir::Node n;
    n.name = op + "_" + out;
    n.op_type = op;
    n.domain = dom;
    n.inputs = std::move(in);
    n.outputs = {std::move(out)};
    g.nodes.push_back(n);
  };
  node("MatMulGradB", "onyx", {"a", "dy"}, "g_direct");  // rewritten
  node("MatMulGradB", "onyx", {"a", "dy"}, "g_shared");  // also read by Neg: kept
  node("Neg", "", {"g_shared"}, "neg");
  node("MatMulGradB", "onyx", {"ca", "cdy"}, "g_const");  // constant: kept
  node("BiasGrad", "onyx", {"dy"}, "g_bias");             // rewritten
  for (auto& [gv, out] : std::vector<std::pair<std::string, std::string>>{{"g_direct", "w1_grad"},
                                                                          {"g_shared", "w2_grad"},
                                                                          {"g_const", "w3_grad"},
                                                                          {"g_bias", "b_grad"}})
    node("AccumulateGrad", "onyx", {gv}, out);
  for (auto o : {"w1_grad", "w2_grad", "w3_grad", "b_grad", "neg"}) {
    ir::ValueInfo vi;
    vi.name = o;
    vi.dtype = DType::Float32;
    g.outputs.push_back(vi);
  }
  std::map<std::string, Tensor> feeds{{"a", random_tensor({6, 4}, 3)},
                                      {"dy", random_tensor({6, 5}, 4)}};
  ir::Graph f = g;
  EXPECT_EQ(count_ops(f, "AccumulateGrad", "onyx"), 4);
  EXPECT_EQ(run_pass(f, passes::write_gradients_into_buffer, {}), 2);
  EXPECT_EQ(count_ops(f, "AccumulateGrad", "onyx"), 2);
  EXPECT_EQ(count_ops(f, "MatMulGradB", "onyx"), 3);
  EXPECT_EQ(count_ops(f, "BiasGrad", "onyx"), 1);
  for (auto o : {"w1_grad", "w2_grad", "w3_grad", "b_grad", "neg"})
    expect_close(run(f, feeds, o), run(g, feeds, o), 0, o);
}

// The real opset-14 exports: nearly every parameter gradient is written by its producer.
TEST(GradientIntoBuffer, RealExports) {
  bool any = false;
  for (const char* name : {"bert-mini", "gpt2-tiny", "vit-tiny"}) {
    std::string path = test_exports::real_export(name);
    if (path.empty()) continue;
    any = true;
    SCOPED_TRACE(name);
    auto graph = std::make_shared<ir::Graph>(ir::load_onnx(path));
    std::map<std::string, Tensor> batch = export_feeds(*graph, 2);
    autodiff::GradientOptions opts;
    opts.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
    opts.loss.output = "loss";
    train::TrainingSession ts(graph, opts);
    const auto& tg = ts.training_graph_for(batch);
    int acc = count_ops(*tg.graph, "AccumulateGrad", "onyx");
    int rewrites = ts.pass_report_for(batch).applied("gradient_into_buffer");
    std::printf("  %s: %d parameter gradients, %d written directly, %d AccumulateGrad left\n", name,
                (int)tg.gradients.size(), rewrites, acc);
    passes::GraphIndex index(*tg.graph);
    for (auto& n : tg.graph->nodes)  // what still goes through AccumulateGrad, and why
      if (n.op_type == "AccumulateGrad") {
        int p = index.producer(n.inputs[0]);
        std::printf("    kept: %s <- %s\n", n.outputs[0].c_str(),
                    p < 0 ? "(constant)" : tg.graph->nodes[p].op_type.c_str());
      }
    EXPECT_EQ(acc + rewrites, (int)tg.gradients.size());
    EXPECT_LE(acc, 5);
  }
  if (!any) GTEST_SKIP() << test_exports::real_export_missing("bert-mini");
}
