// tests/passes/test_llama_fusions.cc — rms_norm_fusion, swiglu_fusion, rotary_fusion and
// attention_fusion on the Llama-family graphs onyx builds (models/llama.cc): the forward pipeline
// fuses every RMSNorm (two per layer and the final one), every SwiGLU (one per layer), every
// rotary embedding (q and k of each layer) and every layer's grouped-query attention (one
// onyx.Attention at the model's key/value heads, causal, its rotary done in the (B,T,H,D) layout)
// and leaves none of the unfused ops behind; and a training step of the
// fused graph (train::TrainingSession, as the Trainer runs it) gives the loss and every
// parameter gradient of the unfused one (ONYX_PASSES=0), at sizes that are not multiples of the
// vector width (hidden 40, head_dim 10, intermediate 52), with grouped-query heads, Qwen2's
// q/k/v biases, Mistral's sliding window and packed position_ids.
// The op-table rows of tests/ops/cases_llama.inc check each kernel alone (float64 reference,
// finite differences, each pattern's variants).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "autodiff/gradient.h"
#include "models/hf_model.h"
#include "passes/pass.h"
#include "train/training_session.h"

using namespace onyx;

namespace {

constexpr int64_t B = 2, T = 9;

const char* kLlama = R"({"model_type": "llama", "vocab_size": 50, "hidden_size": 40,
  "intermediate_size": 52, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false})";
const char* kQwen2 = R"({"model_type": "qwen2", "vocab_size": 50, "hidden_size": 40,
  "intermediate_size": 52, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": true})";
const char* kMistral = R"({"model_type": "mistral", "vocab_size": 50, "hidden_size": 40,
  "intermediate_size": 52, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 4, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
  "sliding_window": 3, "tie_word_embeddings": false})";

std::map<std::string, Tensor> feeds(int64_t vocab) {
  std::mt19937 rng(11);
  std::vector<int64_t> ids(B * T), mask(B * T, 1), pos(B * T), labels(B * T);
  for (auto& v : ids) v = (int64_t)(rng() % vocab);
  for (int64_t t = 0; t < T; t++) {
    pos[t] = t;
    pos[T + t] = t < 5 ? t : t - 5;  // row 1: two packed samples
  }
  mask[2 * T - 1] = 0;  // one padded position
  for (int64_t i = 0; i < B * T; i++) labels[i] = mask[i] ? ids[i] : -100;
  auto i64 = [](const std::vector<int64_t>& v) {
    return Tensor::from_vector<int64_t>(DType::Int64, {B, T}, v);
  };
  return {{"input_ids", i64(ids)},
          {"attention_mask", i64(mask)},
          {"position_ids", i64(pos)},
          {"labels", i64(labels)}};
}

models::BuiltModel build(const char* config) {
  return models::build_hf_model(models::parse_hf_config(config, "test/config.json"),
                                models::Task::CausalLM, 3);
}

int count(const ir::Graph& g, const std::string& domain, const std::string& op) {
  int n = 0;
  for (auto& nd : g.nodes) n += nd.op_type == op && nd.domain == domain;
  return n;
}

struct Step {
  double loss;
  std::map<std::string, Tensor> grads;
};

Step train_step(const char* config, bool passes) {
  models::BuiltModel m = build(config);
  auto in = feeds(m.config.vocab_size);
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  if (!passes) setenv("ONYX_PASSES", "0", 1);
  train::TrainingSession ts(m.model.graph, opts);
  if (!passes) unsetenv("ONYX_PASSES");
  Step s;
  s.loss = ts.forward_backward(in, false, 1, true);
  for (auto& p : ts.parameters()) s.grads[p] = ts.grads().view(p).clone();
  return s;
}

void check_fusions(const char* config, int layers, int64_t kv_heads) {
  models::BuiltModel m = build(config);
  auto in = feeds(m.config.vocab_size);
  std::map<std::string, TensorMeta> sig;
  for (auto& [k, t] : in)
    if (k != "labels" || m.model.graph->find_input(k)) sig[k] = t.meta();
  auto params = autodiff::trainable_parameters(*m.model.graph, {});
  std::set<std::string> vars(params.begin(), params.end());
  passes::PassReport report;
  ir::Graph g = passes::optimize_forward(*m.model.graph, sig, vars, {}, &report);
  EXPECT_EQ(report.applied("rms_norm_fusion"), 2 * layers + 1);
  EXPECT_EQ(report.applied("swiglu_fusion"), layers);
  EXPECT_EQ(report.applied("rotary_fusion"), 2 * layers);
  EXPECT_EQ(count(g, "onyx", "RMSNorm"), 2 * layers + 1);
  EXPECT_EQ(count(g, "onyx", "SwiGLU"), layers);
  EXPECT_EQ(count(g, "onyx", "Rotary"), 2 * layers);
  EXPECT_EQ(report.applied("attention_fusion"), layers);
  EXPECT_EQ(count(g, "onyx", "Attention"), layers);
  for (auto& n : g.nodes) {
    if (n.op_type != "Attention") continue;
    EXPECT_EQ(n.attr_int("num_kv_heads", n.attr_int("num_heads", 0)), kv_heads) << n.name;
    EXPECT_EQ(n.attr_int("causal", 0), 1) << n.name;
  }
  // nothing of the unfused forms is left (no head transposes, no repeated K/V, no scores)
  for (const char* op : {"Sqrt", "Reciprocal", "ReduceMean", "Neg", "Split", "Sigmoid", "Softmax",
                         "MatMul", "Transpose", "Expand"})
    EXPECT_EQ(count(g, "", op), 0) << op;
  EXPECT_EQ(count(g, "onyx", "Silu"), 0);
}

void check_training(const char* config) {
  Step fused = train_step(config, true), plain = train_step(config, false);
  EXPECT_NEAR(fused.loss, plain.loss, 1e-5 * std::fabs(plain.loss));
  ASSERT_EQ(fused.grads.size(), plain.grads.size());
  for (auto& [p, gp] : plain.grads) {
    const Tensor& gf = fused.grads.at(p);
    ASSERT_EQ(gf.shape(), gp.shape()) << p;
    double scale = 0;
    for (int64_t i = 0; i < gp.numel(); i++)
      scale = std::max(scale, std::fabs(gp.get_as_double(i)));
    ASSERT_GT(scale, 0) << p << ": no gradient";
    for (int64_t i = 0; i < gp.numel(); i++)
      ASSERT_NEAR(gf.get_as_double(i), gp.get_as_double(i), 2e-5 * scale) << p << "[" << i << "]";
  }
}

}  // namespace

TEST(LlamaFusions, LlamaGraphFusesEveryNormSwiGLURotaryAndAttention) {
  check_fusions(kLlama, 2, 2);
}
TEST(LlamaFusions, Qwen2GraphFusesEveryNormSwiGLURotaryAndAttention) {
  check_fusions(kQwen2, 3, 1);
}
TEST(LlamaFusions, MistralGraphFusesEveryNormSwiGLURotaryAndAttention) {
  check_fusions(kMistral, 2, 4);
}
TEST(LlamaFusions, LlamaFusedStepEqualsUnfused) { check_training(kLlama); }
TEST(LlamaFusions, Qwen2FusedStepEqualsUnfused) { check_training(kQwen2); }
TEST(LlamaFusions, MistralFusedStepEqualsUnfused) { check_training(kMistral); }
