// tests/train/test_bf16_training.cc — mixed precision (TrainingArguments.bf16,
// train::TrainingSession::set_bf16_gemm): one training step of onyx's Llama (grouped-query,
// untied LM head), GPT-2 (tied LM head: LinearCrossEntropy's dW in bf16), BERT and ViT (the patch
// embedding's Conv) graphs with bf16 GEMM
// inputs against the same step in float32 — the numerics issue #13 asks for: the loss within
// 1e-3 relative, every parameter gradient within 2e-2 relative Frobenius error and cosine >=
// 0.999 (no per-element bound: single bf16-rounded products legitimately err by a few percent of
// the RMS). The graphs really take the bf16 path: the gradients differ from float32's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "autodiff/gradient.h"
#include "kernels/cpu/gemm.h"
#include "models/hf_model.h"
#include "passes/pass.h"
#include "train/optimizer.h"
#include "train/training_session.h"

using namespace onyx;

namespace {

constexpr int64_t B = 2, T = 24;

const char* kLlama = R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 64,
  "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": false})";
const char* kGpt2 = R"({"model_type": "gpt2", "vocab_size": 300, "n_embd": 64, "n_layer": 2,
  "n_head": 4, "n_positions": 64, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})";

// Post-LN (its LayerNorm outputs feed the residual stream too: Casts, not fused producers), with
// dropout (the same masks in both runs: same seed).
const char* kBert = R"({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 300,
  "max_position_embeddings": 64, "type_vocab_size": 2, "pad_token_id": 0})";

// Patch embedding: a 4x4-stride-4 Conv over 16x16 images.
const char* kVit = R"({"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2,
  "num_attention_heads": 4, "intermediate_size": 96, "image_size": 16, "patch_size": 4,
  "num_channels": 3, "num_labels": 5})";

std::map<std::string, Tensor> batch_for(const models::BuiltModel& m, uint32_t seed);

struct Step {
  double loss;
  std::map<std::string, Tensor> grads;
  double arena = 0;                  // planned activation bytes
  passes::MixedPrecisionStats pass;  // what the mixed_precision pass did
};

// One training step; bf16 = mixed precision, `store` = with the mixed_precision pass (bf16
// operands stored once) rather than float32 operands rounded per call.
Step step(const char* config, bool bf16, bool store = true,
          models::Task task = models::Task::CausalLM, bool outputs = true) {
  models::BuiltModel m =
      models::build_hf_model(models::parse_hf_config(config, "test/config.json"), task, 5);
  std::map<std::string, Tensor> in = batch_for(m, 3);
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  train::TrainingSession ts(m.model.graph, opts);
  ts.set_bf16_gemm(bf16, store);
  passes::OptimizeOptions po = ts.pass_options();
  po.bf16_outputs = outputs;
  ts.set_pass_options(po);
  Step s;
  s.loss = ts.forward_backward(in, false, 1, true);
  s.arena = ts.planned_activation_bytes(in);
  s.pass = ts.pass_report_for(in).mixed_precision;
  for (auto& p : ts.parameters()) s.grads[p] = ts.grads().view(p).clone();
  return s;
}

std::map<std::string, Tensor> batch_for(const models::BuiltModel& m, uint32_t seed) {
  std::mt19937 rng(seed);
  if (m.model.graph->find_input("pixel_values")) {  // ViT: images and class labels
    const auto& c = m.config;
    std::uniform_real_distribution<float> px(-1, 1);
    std::vector<float> pixels(B * c.num_channels * c.image_size * c.image_size);
    for (auto& v : pixels) v = px(rng);
    std::vector<int64_t> labels(B);
    for (auto& v : labels) v = (int64_t)(rng() % c.num_labels);
    return {{"pixel_values",
             Tensor::from_vector<float>(DType::Float32,
                                        {B, c.num_channels, c.image_size, c.image_size}, pixels)},
            {"labels", Tensor::from_vector<int64_t>(DType::Int64, {B}, labels)}};
  }
  std::vector<int64_t> ids(B * T);
  for (auto& v : ids) v = (int64_t)(rng() % m.config.vocab_size);
  auto t = Tensor::from_vector<int64_t>(DType::Int64, {B, T}, ids);
  std::map<std::string, Tensor> in{{"input_ids", t}, {"labels", t}};
  if (m.model.graph->find_input("attention_mask"))
    in["attention_mask"] =
        Tensor::from_vector<int64_t>(DType::Int64, {B, T}, std::vector<int64_t>(B * T, 1));
  if (m.model.graph->find_input("position_ids")) {
    std::vector<int64_t> pos(B * T);
    for (int64_t i = 0; i < B * T; i++) pos[i] = i % T;
    in["position_ids"] = Tensor::from_vector<int64_t>(DType::Int64, {B, T}, pos);
  }
  for (auto& vi : m.model.graph->inputs)  // token_type_ids and the like: zeros
    if (!in.count(vi.name))
      in[vi.name] =
          Tensor::from_vector<int64_t>(DType::Int64, {B, T}, std::vector<int64_t>(B * T, 0));
  return in;
}

// `got`'s gradients against `want`'s: each within `rel` relative Frobenius error and cosine >=
// `cos`; returns how many differ at all. Gradients that are zero in exact arithmetic
// (attention's key bias: softmax ignores a per-row constant) hold only rounding noise in both
// runs: no relative bound applies to them (RMS below 1e-6 of the largest gradient's).
int expect_gradients_near(const std::map<std::string, Tensor>& want,
                          const std::map<std::string, Tensor>& got, double rel, double cos) {
  double largest = 0;
  for (auto& [p, gf] : want) {
    double ff = 0;
    for (int64_t i = 0; i < gf.numel(); i++) ff += gf.get_as_double(i) * gf.get_as_double(i);
    largest = std::max(largest, std::sqrt(ff / std::max<int64_t>(1, gf.numel())));
  }
  int differing = 0;
  for (auto& [p, gf] : want) {
    const Tensor& gh = got.at(p);
    double dd = 0, ff = 0, hh = 0, fh = 0;
    for (int64_t i = 0; i < gf.numel(); i++) {
      double a = gf.get_as_double(i), b = gh.get_as_double(i);
      dd += (a - b) * (a - b), ff += a * a, hh += b * b, fh += a * b;
    }
    if (std::sqrt(ff / gf.numel()) < 1e-6 * largest) continue;  // zero but for rounding
    EXPECT_LE(std::sqrt(dd / ff), rel) << p;
    EXPECT_GE(fh / std::sqrt(ff * hh), cos) << p;
    differing += dd > 0;
  }
  return differing;
}

void check(const char* config, models::Task task = models::Task::CausalLM) {
  Step f = step(config, false, true, task), h = step(config, true, true, task);
  EXPECT_NEAR(h.loss, f.loss, 1e-3 * std::fabs(f.loss));
  // (The loss alone cannot show that the bf16 path ran: at initialization GPT-2's logits are so
  // small that its bf16 loss can round to the float32 one; the gradients below show it.)
  EXPECT_GT(expect_gradients_near(f.grads, h.grads, 2e-2, 0.999), (int)f.grads.size() / 2)
      << "most gradients should carry bf16 rounding";
}

}  // namespace

TEST(Bf16Training, LlamaStepMatchesFloat32WithinBf16Tolerances) { check(kLlama); }
TEST(Bf16Training, Gpt2TiedHeadStepMatchesFloat32WithinBf16Tolerances) { check(kGpt2); }

// The mixed_precision pass's first step (GEMM operands stored bf16) changes where the rounding
// happens, not what is rounded: losses and every gradient are bit-identical to the float32 graph
// whose GEMMs round per call, while the pass really ran (producers writing bf16, Casts) and the
// activation arena shrank. Its second step (GEMM outputs bf16 for the GELU and attention, norm
// gradients reading the forward's bf16 normalized input) shrinks the arena further; its numerics
// are check()'s.
void check_pass_exact(const char* config, models::Task task, bool want_fused, bool want_outputs,
                      bool biases, bool post_ln = false) {
  Step per_call = step(config, true, false, task),
       stored = step(config, true, true, task, /*outputs=*/false),
       full = step(config, true, true, task);
  EXPECT_EQ(per_call.pass.gemms, 0);
  EXPECT_EQ(per_call.pass.weights, 0);
  EXPECT_GT(stored.pass.gemms, 0);
  EXPECT_GT(stored.pass.weights, 0);  // the weights read through the bf16 shadow
  if (want_fused) {
    EXPECT_GT(stored.pass.fused, 0);
  }
  // a linear layer's output gradient: its BiasGrad writes the bf16 copy (biases), else a Cast
  if (biases) {
    EXPECT_GT(stored.pass.bias_grads, 0);
  } else {
    EXPECT_EQ(stored.pass.bias_grads, 0);
    EXPECT_GT(stored.pass.casts, 0);
  }
  // post-LN: a LayerNorm output read by the residual stream and by GEMMs gets its bf16 copy
  // from the LayerNorm (output 4), not from a Cast
  if (post_ln) {
    EXPECT_GT(stored.pass.norm_copies, 0);
  } else {
    EXPECT_EQ(stored.pass.norm_copies, 0);
  }
  EXPECT_EQ(stored.pass.outputs, 0);
  EXPECT_EQ(stored.pass.normalized, 0);
  EXPECT_LT(stored.arena, per_call.arena);
  if (want_outputs) {
    EXPECT_GT(full.pass.outputs, 0);
    EXPECT_GT(full.pass.normalized, 0);  // the norms' gradients read their bf16 xhat
    EXPECT_LT(full.arena, stored.arena);
  }
  EXPECT_EQ(stored.loss, per_call.loss);
  for (auto& [p, g] : per_call.grads) {
    const Tensor& h = stored.grads.at(p);
    int64_t diff = 0;
    for (int64_t i = 0; i < g.numel(); i++) diff += g.get_as_double(i) != h.get_as_double(i);
    EXPECT_EQ(diff, 0) << p << ": " << diff << " of " << g.numel() << " elements differ";
  }
}

TEST(Bf16Training, StoredBf16OperandsBitIdenticalToPerCallRoundingGpt2) {
  // pre-LN: LayerNorm, Gelu and Attention outputs are written bf16 by their producers
  check_pass_exact(kGpt2, models::Task::CausalLM, true, true, true);
}
TEST(Bf16Training, StoredBf16OperandsBitIdenticalToPerCallRoundingBert) {
  check_pass_exact(kBert, models::Task::MaskedLM, true, true, true, /*post_ln=*/true);
}
TEST(Bf16Training, StoredBf16OperandsBitIdenticalToPerCallRoundingLlama) {
  // RMSNorm and SwiGLU outputs written bf16 by their producers
  check_pass_exact(kLlama, models::Task::CausalLM, true, true, false);
}
TEST(Bf16Training, BertStepMatchesFloat32WithinBf16Tolerances) {
  check(kBert, models::Task::MaskedLM);  // post-LN; GELU and attention inputs in bf16
}
TEST(Bf16Training, VitStepMatchesFloat32WithinBf16Tolerances) {
  // the patch embedding's Conv and ConvGradWeight take bf16 operands too
  check(kVit, models::Task::ImageClassification);
}

// Several optimizer steps: the bf16 shadow the fused AdamW writes in its update pass (as the
// Trainer passes it) gives the same losses and weights, bit for bit, as rounding every weight per
// GEMM call; weights changed between steps through params() or load_weights are rounded again
// before the next run, not read stale from the shadow.
std::pair<std::vector<double>, Tensor> train_steps(const char* config, models::Task task,
                                                   bool store) {
  models::BuiltModel m =
      models::build_hf_model(models::parse_hf_config(config, "test/config.json"), task, 5);
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  train::TrainingSession ts(m.model.graph, opts);
  ts.set_bf16_gemm(true, store);
  passes::OptimizeOptions po = ts.pass_options();
  po.bf16_outputs = false;  // the pass's bit-exact first step (and the weights)
  ts.set_pass_options(po);
  train::OptimizerConfig oc;
  oc.lr = 1e-2;
  auto opt = train::make_optimizer(oc, ts.params().layout(), {});
  std::vector<double> losses;
  for (int s = 0; s < 4; s++) {
    losses.push_back(ts.forward_backward(batch_for(m, 10 + s), false, 1 + s, true));
    if (store) {
      EXPECT_NE(ts.bf16_shadow(), nullptr);
    }
    train::FlatBuffer* shadow = ts.bf16_shadow();
    opt->step(ts.params(), ts.grads(), oc.lr, shadow);
    if (shadow) ts.bf16_shadow_written();
    if (s == 1) {  // the weights changed outside the optimizer: scaled through params()
      float* p = ts.params().flat().data<float>();
      for (int64_t i = 0; i < ts.params().layout().numel; i++) p[i] *= 0.75f;
    }
    if (s == 2) {  // ... and loaded
      std::map<std::string, Tensor> w;
      for (auto& p : ts.parameters()) {
        Tensor t = ts.params().view(p).clone();
        float* x = t.data<float>();
        for (int64_t i = 0; i < t.numel(); i++) x[i] = -x[i];
        w[p] = t;
      }
      ts.load_weights(w, "test weights");
    }
  }
  losses.push_back(ts.forward_backward(batch_for(m, 20), false, 9, true));
  return {losses, ts.params().flat().clone()};
}

TEST(Bf16Training, OptimizerWrittenWeightShadowBitIdenticalToPerCallRounding) {
  for (auto [config, task] :
       {std::pair{kGpt2, models::Task::CausalLM}, std::pair{kLlama, models::Task::CausalLM}}) {
    auto [l_call, w_call] = train_steps(config, task, false);
    auto [l_shadow, w_shadow] = train_steps(config, task, true);
    ASSERT_EQ(l_call.size(), l_shadow.size());
    for (size_t i = 0; i < l_call.size(); i++) EXPECT_EQ(l_call[i], l_shadow[i]) << "step " << i;
    EXPECT_EQ(std::memcmp(w_call.raw(), w_shadow.raw(), w_call.nbytes()), 0);
  }
}

// Evaluation under bf16 runs what the training step's forward runs (the mixed_precision pass on
// the evaluation graph too, as autocast wraps every forward: GEMM outputs read by the GELU and
// attention stored bf16, weights read through the shadow): the evaluation loss on a batch is the
// training step's loss on it, bit for bit, as in float32 (no dropout in these configs) — within
// 1e-6 where the evaluation graph computes the logits it returns for metrics with a MatMulT the
// training step fuses into LinearCrossEntropy (BERT's MLM head, ViT's classifier: the same bf16
// products summed in another order). Rounding per call instead (the pass on the training graph
// only) puts them 3e-6 (BERT) and 4e-4 (ViT) apart, and GPT-2 and Llama 1e-5.
TEST(Bf16Training, EvaluationLossIsTheTrainingForwardsLoss) {
  const std::string bert = std::string(kBert).replace(
      std::string(kBert).rfind('}'), 1,
      R"(, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})");
  const struct {
    const char* name;
    const char* config;
    models::Task task;
    double rtol;
  } cases[] = {{"gpt2", kGpt2, models::Task::CausalLM, 0},
               {"llama", kLlama, models::Task::CausalLM, 0},
               {"bert (post-LN)", bert.c_str(), models::Task::MaskedLM, 1e-6},
               {"vit", kVit, models::Task::ImageClassification, 1e-6}};
  for (const auto& c : cases) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message() << c.name << " bf16 " << bf16);
      models::BuiltModel m =
          models::build_hf_model(models::parse_hf_config(c.config, "test/config.json"), c.task, 5);
      std::map<std::string, Tensor> in = batch_for(m, 3);
      autodiff::GradientOptions opts;
      opts.loss = m.model.loss;
      train::TrainingSession ts(m.model.graph, opts);
      ts.set_bf16_gemm(bf16);
      const double train = ts.forward_backward(in, false, 1, true);
      const double eval = ts.forward(in).at("loss").get_as_double(0);
#if defined(__x86_64__)
      const bool exact = c.rtol == 0 || !bf16;
#else
      // (aarch64: the ViT's float32 forwards differ in the last bits, the Conv's side not yet
      // pinned down; equal within c.rtol there)
      const bool exact = c.rtol == 0 || (!bf16 && std::string(c.name) != "vit");
#endif
      if (exact)
        EXPECT_EQ(train, eval);
      else
        EXPECT_LE(std::fabs(train - eval), c.rtol * std::fabs(train)) << train << " vs " << eval;
    }
  }
}

// TrainingArguments.fp16 (TrainingSession::set_fp16_gemm, emulated: float16-rounded GEMM operands,
// float32 GEMMs): one step against float32 within float16's tolerances, tighter than bf16's (10
// mantissa bits against 7): the loss within 1e-4 relative, every gradient within 5e-3 relative
// Frobenius error and cosine >= 0.99999; and it really rounds: most gradients differ from
// float32's and from bf16's.
TEST(Fp16Training, StepMatchesFloat32WithinFloat16Tolerances) {
  const struct {
    const char* name;
    const char* config;
    models::Task task;
  } cases[] = {{"gpt2", kGpt2, models::Task::CausalLM},
               {"llama", kLlama, models::Task::CausalLM},
               {"vit", kVit, models::Task::ImageClassification}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    models::BuiltModel m =
        models::build_hf_model(models::parse_hf_config(c.config, "test/config.json"), c.task, 5);
    std::map<std::string, Tensor> in = batch_for(m, 3);
    autodiff::GradientOptions opts;
    opts.loss = m.model.loss;
    auto run = [&](int mode) {  // 0 float32, 1 fp16, 2 bf16
      train::TrainingSession ts(m.model.graph, opts);
      ts.set_fp16_gemm(mode == 1);
      ts.set_bf16_gemm(mode == 2);
      Step s;
      s.loss = ts.forward_backward(in, false, 1, true);
      for (auto& p : ts.parameters()) s.grads[p] = ts.grads().view(p).clone();
      return s;
    };
    Step f = run(0), h = run(1), b = run(2);
    EXPECT_NEAR(h.loss, f.loss, 1e-4 * std::fabs(f.loss));
    const int vs_f32 = expect_gradients_near(f.grads, h.grads, 5e-3, 0.99999);
    int vs_bf16 = 0;
    for (auto& [p, g] : h.grads)
      vs_bf16 += std::memcmp(g.raw(), b.grads.at(p).raw(), g.nbytes()) != 0;
    EXPECT_GT(vs_f32, (int)f.grads.size() / 2) << "most gradients should carry float16 rounding";
    EXPECT_GT(vs_bf16, (int)f.grads.size() / 2) << "float16 is not bf16";
  }
}

// x -> Linear -> Tanh -> Linear -> mean(y^2), the Linears as exported: bias-free plain MatMuls
// (w1 (32, 48), w2 (48, 32)), or Gemms with 1-D biases, the first with transB = 1 as torch
// exports nn.Linear (w1 (48, 32), b1, w2 (48, 16), b2).
static std::shared_ptr<ir::Graph> two_linear_graph(bool gemm, std::mt19937& rng) {
  auto g = std::make_shared<ir::Graph>();
  g->opsets[""] = 17;
  ir::ValueInfo x;
  x.name = "x";
  x.dtype = DType::Float32;
  g->inputs.push_back(x);
  std::normal_distribution<float> d(0.0f, 0.5f);
  auto init = [&](const std::string& name, Shape s) {
    Tensor t(DType::Float32, s);
    for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = d(rng);
    g->add_initializer(name, t);
  };
  auto add = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    ir::Node n;
    n.name = op + "_" + out;
    n.op_type = op;
    n.inputs = std::move(in);
    n.outputs = {out};
    g->nodes.push_back(n);
  };
  if (gemm) {
    init("w1", {48, 32});
    init("b1", {48});
    init("w2", {48, 16});
    init("b2", {16});
    add("Gemm", {"x", "w1", "b1"}, "h");
    g->nodes.back().attrs["transB"] = autodiff::attr_i(1);
    add("Tanh", {"h"}, "a");
    add("Gemm", {"a", "w2", "b2"}, "y");
  } else {
    init("w1", {32, 48});
    init("w2", {48, 32});
    add("MatMul", {"x", "w1"}, "h");
    add("Tanh", {"h"}, "a");
    add("MatMul", {"a", "w2"}, "y");
  }
  add("Mul", {"y", "y"}, "y2");
  add("ReduceMean", {"y2"}, "loss");
  g->nodes.back().attrs["keepdims"] = autodiff::attr_i(0);
  ir::ValueInfo l;
  l.name = "loss";
  l.dtype = DType::Float32;
  g->outputs.push_back(l);
  return g;
}

// One bf16 step of two_linear_graph on x: per-call rounding (store = false) or with the
// mixed_precision pass (store = true); the loss, the gradients, the training graph's nodes and
// how many weights the pass read through the shadow.
struct ShadowRun {
  double loss = 0;
  std::map<std::string, Tensor> grads;
  std::vector<ir::Node> nodes;
  int weights = 0;
};
static ShadowRun shadow_run(const std::shared_ptr<ir::Graph>& g, const Tensor& x, bool store) {
  std::map<std::string, Tensor> in{{"x", x}};
  autodiff::GradientOptions opts;
  opts.loss.output = "loss";
  train::TrainingSession ts(g, opts);
  ts.set_bf16_gemm(true, store);
  ShadowRun r;
  r.loss = ts.forward_backward(in, false, 1, true);
  for (auto& p : ts.parameters()) r.grads[p] = ts.grads().view(p).clone();
  r.nodes = ts.training_graph_for(in).graph->nodes;
  r.weights = ts.pass_report_for(in).mixed_precision.weights;
  return r;
}

// A bias-free Linear as exported (plain MatMul(X, W): linear_fusion leaves it) under bf16: the
// mixed_precision pass makes it a MatMulT read through the weight shadow, bit-identical to the
// per-call rounding (which the plain MatMul kernel does too).
TEST(Bf16Training, BiasFreeMatMulReadsTheWeightShadow) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 0.5f);
  auto g = two_linear_graph(false, rng);
  Tensor xt(DType::Float32, {4, 6, 32});
  for (int64_t i = 0; i < xt.numel(); i++) xt.data<float>()[i] = d(rng);
  ShadowRun r[2] = {shadow_run(g, xt, false), shadow_run(g, xt, true)};
  for (int store = 0; store < 2; store++) {
    int plain = 0;
    for (auto& n : r[store].nodes) plain += n.op_type == "MatMul";
    EXPECT_EQ(plain, store ? 0 : 2);
  }
  EXPECT_EQ(r[1].weights, 2);
  EXPECT_EQ(r[0].loss, r[1].loss);
  for (auto& [p, t] : r[0].grads)
    EXPECT_EQ(std::memcmp(t.raw(), r[1].grads.at(p).raw(), t.nbytes()), 0) << p;
}

// A Linear exported as the standard Gemm (2-D input, 1-D bias; one with transB = 1 as torch
// exports nn.Linear, one without): the mixed_precision pass makes it a MatMulT read through the
// weight shadow. The operands are the per-call rounding's bf16 values and the products exact in
// float32, so only the GEMM's accumulation order may differ (bf16 dot products where the CPU has
// them, sgemm on the widened values otherwise).
TEST(Bf16Training, GemmLinearReadsTheWeightShadow) {
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 0.5f);
  auto g = two_linear_graph(true, rng);
  Tensor xt(DType::Float32, {24, 32});
  for (int64_t i = 0; i < xt.numel(); i++) xt.data<float>()[i] = d(rng);
  ShadowRun r[2] = {shadow_run(g, xt, false), shadow_run(g, xt, true)};
  int weight_gemms[2] = {0, 0};  // the forward's two Gemms (the backward's dA may be a Gemm too)
  for (int store = 0; store < 2; store++)
    for (auto& n : r[store].nodes)
      weight_gemms[store] += n.op_type == "Gemm" && (n.outputs[0] == "h" || n.outputs[0] == "y");
  EXPECT_EQ(r[1].weights, 2);
  EXPECT_EQ(weight_gemms[0], 2);
  EXPECT_EQ(weight_gemms[1], 0);
  EXPECT_NEAR(r[1].loss, r[0].loss, 1e-6 * std::abs(r[0].loss));
  for (auto& [p, t] : r[0].grads) {
    double err = 0, ref = 0;
    for (int64_t i = 0; i < t.numel(); i++) {
      const double a = t.get_as_double(i), b = r[1].grads.at(p).get_as_double(i);
      err += (a - b) * (a - b);
      ref += a * a;
    }
    EXPECT_LE(std::sqrt(err / ref), 1e-5) << p;
  }
}

// Prediction on a batch without labels (Trainer.predict on unlabelled data) runs the model's
// forward through the same passes as the evaluation graph with a loss (fusions; under bf16 the
// mixed_precision rewrite reading the weight shadow), so its outputs are the evaluation's
// outputs on the same batch, bit for bit, in float32 and in bf16 — it ran the unfused graph with
// every weight rounded per call before: 1.4e-3 (BERT) and 8.8e-4 (ViT) from evaluation's logits
// in bf16, 1.5e-7 and 4.5e-8 in float32.
TEST(Bf16Training, PredictionWithoutLabelsIsTheEvaluationForward) {
  const struct {
    const char* name;
    const char* config;
    models::Task task;
  } cases[] = {{"bert", kBert, models::Task::MaskedLM},
               {"vit", kVit, models::Task::ImageClassification}};
  // (onyx's causal LMs compute their loss in the graph from a labels input, as Transformers'
  // do: their evaluation always has labels.)
  for (const auto& c : cases) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message() << c.name << " bf16 " << bf16);
      models::BuiltModel m =
          models::build_hf_model(models::parse_hf_config(c.config, "test/config.json"), c.task, 5);
      std::map<std::string, Tensor> in = batch_for(m, 3);
      autodiff::GradientOptions opts;
      opts.loss = m.model.loss;
      train::TrainingSession ts(m.model.graph, opts);
      ts.set_bf16_gemm(bf16);
      ts.forward_backward(in, false, 1, true);  // (dropout off in evaluation either way)
      auto with = ts.forward(in);
      std::map<std::string, Tensor> unlabelled = in;
      unlabelled.erase(opts.loss.labels);
      auto without = ts.forward(unlabelled);
      EXPECT_FALSE(without.count("loss"));
      int compared = 0;
      for (auto& o : m.model.graph->outputs) {
        ASSERT_TRUE(with.count(o.name) && without.count(o.name)) << o.name;
        const Tensor &a = with.at(o.name), &b = without.at(o.name);
        ASSERT_EQ(a.meta(), b.meta()) << o.name;
        double worst = 0;
        for (int64_t i = 0; i < a.numel(); i++)
          worst = std::max(worst, std::fabs(a.get_as_double(i) - b.get_as_double(i)));
        EXPECT_EQ(worst, 0) << o.name;
        compared++;
      }
      EXPECT_GT(compared, 0);
    }
  }
}

// bf16_full_eval evaluates what Transformers' model.to(torch.bfloat16) holds, and that casts the
// rotary embeddings' inv_freq buffer too (LlamaRotaryEmbedding widens it again to multiply the
// positions: its angles use the rounded frequencies, up to 2^-9 of the angle away, which grows
// with the position). onyx's Llama under bf16_full_eval equals, bit for bit at positions from
// 1000 on, the same model with its weights and inv_freq rounded beforehand; with inv_freq left
// float32 (what it evaluated before) the loss differs. Evaluation without the flag keeps the
// float32 frequencies. rope_type dynamic reads the buffer up to max_position_embeddings (here
// 2048: positions 1000.. stay below it), so the same holds there.
void check_full_eval_rounds_frequencies(const char* config) {
  models::BuiltModel m = models::build_hf_model(models::parse_hf_config(config, "test/config.json"),
                                                models::Task::CausalLM, 5);
  std::map<std::string, Tensor> in = batch_for(m, 3);
  ASSERT_TRUE(in.count("position_ids"));
  std::vector<int64_t> pos(B * T);
  for (int64_t i = 0; i < B * T; i++) pos[i] = 1000 + i % T;
  in["position_ids"] = Tensor::from_vector<int64_t>(DType::Int64, {B, T}, pos);
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  train::TrainingSession ts(m.model.graph, opts);
  auto loss = [&](train::TrainingSession& s) { return s.forward(in).at("loss").get_as_double(0); };
  const double f32 = loss(ts);
  ts.set_bf16_full_eval(true);
  const double full = loss(ts);
  ts.set_bf16_full_eval(false);
  EXPECT_EQ(loss(ts), f32) << "evaluation without bf16_full_eval after a full one";

  // The reference: the same model with its weights rounded beforehand and its frequencies
  // rounded or not, under bf16_full_eval (idempotent on rounded weights) with the Constant
  // renamed so that the session does not recognise (and round) it.
  auto reference = [&](bool round_frequencies) {
    auto r = std::make_shared<ir::Graph>(*m.model.graph);
    auto rounded = [&](const Tensor& t) {
      Tensor c = t.clone();
      kernels::round_to_bf16(c.data<float>(), c.data<float>(), c.numel());
      return c;
    };
    for (auto& p : ts.parameters()) r->initializers[p] = rounded(ts.params().view(p));
    const std::string freq = "model.rotary_emb.inv_freq", renamed = "rotary_frequencies";
    int found = 0;
    for (auto& n : r->nodes) {
      for (auto& x : n.inputs)
        if (x == freq) x = renamed;
      if (n.op_type == "Constant" && n.outputs[0] == freq) {
        found++;
        n.outputs[0] = renamed;
        if (round_frequencies)
          n.attrs["value"] = ir::Attribute::of_tensor(rounded(*n.attr_tensor("value")));
      }
    }
    EXPECT_EQ(found, 1) << "models/llama.cc names its inv_freq Constant as Transformers' buffer";
    train::TrainingSession rs(r, opts);
    rs.set_bf16_full_eval(true);
    return loss(rs);
  };
  EXPECT_EQ(full, reference(true));
  const double unrounded = reference(false);
  EXPECT_NE(full, unrounded) << "inv_freq left float32 gives the same loss: the test shows nothing";
  EXPECT_NE(full, f32);
  std::printf(
      "Llama at positions 1000..%lld: eval loss float32 %.7f, bf16_full_eval %.7f, with "
      "float32 frequencies %.7f\n",
      (long long)(1000 + T - 1), f32, full, unrounded);
}

TEST(Bf16Training, FullEvalRoundsTheRotaryFrequenciesAsTransformersCastsTheBuffer) {
  check_full_eval_rounds_frequencies(kLlama);
}

TEST(Bf16Training, FullEvalRoundsDynamicRopesBufferBelowMaxPositionEmbeddings) {
  check_full_eval_rounds_frequencies(
      R"({"model_type": "llama", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 2048, "tie_word_embeddings": false,
      "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})");
}
