// tests/passes/test_dropout_add_fusion.cc — passes/dropout_add_fusion.cc: Add(Dropout(y), residual)
// in either operand order becomes one onyx.DropoutAdd carrying the Dropout's rng identity — op
// counts before and after, outputs bit-identical in training and inference runs, training-graph
// loss and gradients bit-identical — and chains it must leave alone stay. Then Hugging Face BERT,
// GPT-2 and ViT built with dropout 0.1 (hidden and attention): attention_fusion and
// dropout_add_fusion both fire in the forward pipeline, no Dropout is left, training with all
// fusions (token pruning off, which draws the read-out token's masks differently) gives the
// unfused graph's loss and gradients (the same masks everywhere), bit-identically on a repeat.
// token_pruning selects through onyx.DropoutAdd.
// Hand-written test scaffolding.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "autodiff/gradient.h"
#include "models/hf_model.h"
#include "passes/pass.h"
#include "runtime/session.h"
#include "train/training_session.h"

using namespace onyx;

namespace {

int count_ops(const ir::Graph& g, const std::string& op, const std::string& domain = "") {
  int n = 0;
  for (auto& nd : g.nodes)
    if (nd.op_type == op && nd.domain == domain) n++;
  return n;
}

Tensor random_tensor(const Shape& s, uint32_t seed) {
  Tensor t(DType::Float32, s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); i++) t.data<float>()[i] = u(rng);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

runtime::RunOptions run_opts(bool training, uint64_t seed) {
  runtime::RunOptions ro;
  ro.training = training;
  ro.seed = seed;
  return ro;
}

// x (B,T,C) → y = x·W + b → d = Dropout(y, 0.1, true) → out = Add(d, x) (or Add(x, d)) → "out".
struct Block {
  int64_t B = 2, T = 5, C = 8;
  bool residual_first = false;
  Shape residual_shape;  // empty: x itself; else a separate input "res" of this shape
};

ir::Graph block_graph(const Block& k) {
  ir::Graph g;
  g.opsets[""] = 14;
  auto input = [&](const std::string& name, Shape s) {
    ir::ValueInfo vi;
    vi.name = name;
    vi.dtype = DType::Float32;
    vi.shape = s;
    vi.has_shape = true;
    g.inputs.push_back(vi);
  };
  input("x", {k.B, k.T, k.C});
  std::string res = "x";
  if (!k.residual_shape.empty()) {
    input("res", k.residual_shape);
    res = "res";
  }
  g.add_initializer("W", random_tensor({k.C, k.C}, 1));
  g.add_initializer("b", random_tensor({k.C}, 2));
  g.add_initializer("ratio", Tensor::scalar_f32(0.1f));
  g.add_initializer("training", Tensor::from_vector<uint8_t>(DType::Bool, {}, {1}));
  auto node = [&](const std::string& name, const std::string& op, std::vector<std::string> in,
                  std::vector<std::string> out) {
    ir::Node n;
    n.name = name, n.op_type = op, n.inputs = std::move(in), n.outputs = std::move(out);
    g.nodes.push_back(n);
  };
  node("mm", "MatMul", {"x", "W"}, {"xw"});
  node("bias", "Add", {"xw", "b"}, {"y"});
  node("drop", "Dropout", {"y", "ratio", "training"}, {"d"});
  node("residual", "Add",
       k.residual_first ? std::vector<std::string>{res, "d"} : std::vector<std::string>{"d", res},
       {"sum"});
  node("to_out", "Identity", {"sum"}, {"out"});
  ir::ValueInfo vo;
  vo.name = "out";
  vo.dtype = DType::Float32;
  g.outputs.push_back(vo);
  return g;
}

std::map<std::string, TensorMeta> signature_of(const ir::Graph& g) {
  std::map<std::string, TensorMeta> sig;
  for (auto& in : g.inputs) sig[in.name] = {in.dtype, in.shape};
  return sig;
}

int fuse_only(ir::Graph& g) {
  passes::PassContext ctx;
  ctx.signature = signature_of(g);
  ctx.variables = {"W", "b"};
  ctx.refresh(g);
  int n = passes::fuse_dropout_add(g, ctx);
  passes::eliminate_dead_nodes(g);
  return n;
}

std::map<std::string, Tensor> feeds_of(const ir::Graph& g) {
  std::map<std::string, Tensor> f;
  uint32_t seed = 10;
  for (auto& in : g.inputs) f[in.name] = random_tensor(in.shape, seed++);
  return f;
}

Tensor run(const ir::Graph& g, const std::map<std::string, Tensor>& feeds,
           const runtime::RunOptions& ro) {
  runtime::Session s(std::make_shared<ir::Graph>(g));
  return s.run(feeds, ro).at("out");
}

}  // namespace

TEST(DropoutAddFusion, FusesEitherOperandOrderBitIdentically) {
  for (bool residual_first : {false, true}) {
    SCOPED_TRACE(residual_first ? "Add(residual, dropout)" : "Add(dropout, residual)");
    Block k;
    k.residual_first = residual_first;
    ir::Graph before = block_graph(k);
    ir::Graph after = before;
    EXPECT_EQ(fuse_only(after), 1);
    EXPECT_EQ(count_ops(before, "Dropout"), 1);
    EXPECT_EQ(count_ops(before, "Add"), 2);
    EXPECT_EQ(count_ops(after, "Dropout"), 0);
    EXPECT_EQ(count_ops(after, "Add"), 1);  // the bias add (linear_fusion's business)
    EXPECT_EQ(count_ops(after, "DropoutAdd", "onyx"), 1);
    for (auto& n : after.nodes)
      if (n.op_type == "DropoutAdd") {
        EXPECT_EQ(n.attr_string("rng_key", ""), "d");  // the Dropout's output name
        EXPECT_EQ(n.inputs[0], "y");
        EXPECT_EQ(n.inputs[1], "x");
      }
    auto feeds = feeds_of(before);
    for (bool training : {true, false})
      for (uint64_t seed : {0ull, 5ull})
        EXPECT_TRUE(same_bits(run(after, feeds, run_opts(training, seed)),
                              run(before, feeds, run_opts(training, seed))))
            << "training " << training << " seed " << seed;
  }
}

TEST(DropoutAddFusion, TrainingGraphIsBitIdentical) {
  Block k;
  ir::Graph before = block_graph(k);
  ir::Graph after = before;
  ASSERT_EQ(fuse_only(after), 1);
  // loss = sum(out²) with x an initializer too
  double loss[2];
  std::map<std::string, Tensor> grads[2];
  auto feeds = feeds_of(before);
  for (int fused = 0; fused < 2; fused++) {
    ir::Graph g = fused ? after : before;
    g.inputs.clear();
    g.add_initializer("x", feeds.at("x"));
    ir::Node sq, sum;
    sq.name = "sq", sq.op_type = "Mul", sq.inputs = {"out", "out"}, sq.outputs = {"out2"};
    sum.name = "sum_loss", sum.op_type = "ReduceSum", sum.inputs = {"out2"}, sum.outputs = {"loss"};
    sum.attrs["keepdims"] = autodiff::attr_i(0);
    g.nodes.push_back(sq);
    g.nodes.push_back(sum);
    g.outputs[0].name = "loss";
    autodiff::GradientOptions opts;
    opts.trainable = {"x", "W", "b"};
    auto tg = autodiff::build_training_graph(g, {}, opts);
    runtime::Session s(tg.graph, {"x", "W", "b"});
    auto res = s.run({}, run_opts(true, 3));
    loss[fused] = res.at("loss").get_as_double(0);
    for (auto& [p, gname] : tg.gradients) grads[fused][p] = res.at(gname);
  }
  EXPECT_EQ(loss[0], loss[1]);
  for (auto& [p, t] : grads[0]) EXPECT_TRUE(same_bits(t, grads[1].at(p))) << p;
}

TEST(DropoutAddFusion, LeavesOtherChainsAlone) {
  // residual broadcast along tokens: not one shape
  {
    Block k;
    k.residual_shape = {k.B, 1, k.C};
    ir::Graph g = block_graph(k);
    EXPECT_EQ(fuse_only(g), 0);
  }
  // the dropped value read twice, or its mask read
  {
    ir::Graph g = block_graph(Block());
    ir::ValueInfo vi;
    vi.name = "d";
    g.outputs.push_back(vi);
    EXPECT_EQ(fuse_only(g), 0);
  }
  {
    ir::Graph g = block_graph(Block());
    for (auto& n : g.nodes)
      if (n.op_type == "Dropout") n.outputs.push_back("d_mask");
    ir::ValueInfo vi;
    vi.name = "d_mask";
    g.outputs.push_back(vi);
    EXPECT_EQ(fuse_only(g), 0);
  }
}

// ---- Hugging Face models with dropout on ------------------------------------------------------

namespace {

struct HfCase {
  const char* name;
  const char* config;
  models::Task task;
  bool image;
  int layers;
};

std::map<std::string, Tensor> hf_batch(const models::BuiltModel& m, const HfCase& c) {
  std::mt19937 rng(5);
  std::map<std::string, Tensor> batch;
  const int64_t B = 3, T = 10;
  auto ids = [&](Shape s, int64_t vocab) {
    Tensor t(DType::Int64, s);
    for (int64_t i = 0; i < t.numel(); i++) t.data<int64_t>()[i] = (int64_t)(rng() % vocab);
    return t;
  };
  if (c.image) {
    Tensor px(DType::Float32, {B, 3, 8, 8});
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < px.numel(); i++) px.data<float>()[i] = nd(rng);
    batch["pixel_values"] = px;
    batch["labels"] = ids({B}, m.config.num_labels);
  } else {
    batch["input_ids"] = ids({B, T}, m.config.vocab_size);
    batch["labels"] =
        c.task == models::Task::CausalLM ? batch["input_ids"] : ids({B}, m.config.num_labels);
  }
  for (auto& in : m.model.graph->inputs)
    if (!batch.count(in.name)) {  // attention_mask / token_type_ids
      Tensor t = Tensor::zeros(DType::Int64, {B, T});
      if (in.name == "attention_mask")
        for (int64_t i = 0; i < B * T; i++) t.data<int64_t>()[i] = (i % T) < T - (i / T) ? 1 : 0;
      batch[in.name] = t;
    }
  return batch;
}

struct Trained {
  double loss;
  std::map<std::string, std::vector<double>> grads;
  const passes::PassReport* report = nullptr;
  int dropouts = 0, attentions = 0, dropout_adds = 0;
};

Trained train_step(const models::BuiltModel& m, const std::map<std::string, Tensor>& batch,
                   bool fusions, uint64_t seed, std::unique_ptr<train::TrainingSession>& ts) {
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  ts = std::make_unique<train::TrainingSession>(m.model.graph, opts);
  passes::OptimizeOptions po;
  po.fusions = fusions;
  po.token_pruning = false;
  ts->set_pass_options(po);
  Trained t;
  t.loss = ts->forward_backward(batch, false, seed, /*training=*/true);
  for (auto& p : ts->parameters()) t.grads[p] = ts->grads().view(p).to_double_vector();
  t.report = &ts->pass_report_for(batch);
  const ir::Graph& g = *ts->training_graph_for(batch).graph;
  t.dropouts = count_ops(g, "Dropout");
  t.attentions = count_ops(g, "Attention", "onyx");
  t.dropout_adds = count_ops(g, "DropoutAdd", "onyx");
  return t;
}

}  // namespace

TEST(DropoutAddFusion, HuggingFaceModelsWithDropoutFuseAndTrainAlike) {
  const HfCase cases[] = {
      {"bert",
       R"({"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "vocab_size": 50, "max_position_embeddings": 32, "type_vocab_size": 2,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "num_labels": 3})",
       models::Task::SequenceClassification, false, 2},
      {"gpt2", R"({"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 4, "vocab_size": 60,
        "n_positions": 32, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1})",
       models::Task::CausalLM, false, 2},
      {"vit",
       R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "image_size": 8, "patch_size": 4, "num_channels": 3, "num_labels": 5,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1})",
       models::Task::ImageClassification, true, 2},
  };
  for (const HfCase& c : cases) {
    SCOPED_TRACE(c.name);
    models::BuiltModel m =
        models::build_hf_model(models::parse_hf_config(c.config, "config.json"), c.task, 3);
    auto batch = hf_batch(m, c);
    std::unique_ptr<train::TrainingSession> s1, s2, s3, s4;
    Trained fused = train_step(m, batch, true, 7, s1);
    Trained again = train_step(m, batch, true, 7, s2);
    Trained plain = train_step(m, batch, false, 7, s3);
    Trained other_seed = train_step(m, batch, true, 8, s4);
    EXPECT_EQ(fused.report->applied("attention_fusion"), c.layers);
    EXPECT_EQ(fused.attentions, c.layers);
    // two residual dropouts per layer; GPT-2's embedding dropout feeds a LayerNorm and the
    // residual, so it stays a Dropout
    EXPECT_EQ(fused.report->applied("dropout_add_fusion"), 2 * c.layers);
    EXPECT_EQ(fused.dropout_adds, 2 * c.layers);
    EXPECT_LE(fused.dropouts, 2) << "embedding / classifier dropouts only";
    EXPECT_GT(plain.dropouts, fused.dropouts);
    // same masks: the fused step equals the unfused one up to float rounding ...
    EXPECT_NEAR(fused.loss, plain.loss, 1e-5 * std::fabs(plain.loss));
    double worst = 0;
    std::string worst_p;
    // relative, with a floor at 1e-4 of the largest gradient of the model (some gradients are
    // zero in exact arithmetic — the key bias's — and only rounding noise is left)
    double big = 0;
    for (auto& [p, g] : plain.grads)
      for (double v : g) big = std::max(big, std::fabs(v));
    for (auto& [p, g] : plain.grads) {
      const auto& f = fused.grads.at(p);
      for (size_t i = 0; i < g.size(); i++) {
        double e = std::fabs(f[i] - g[i]) / (1e-4 * big + std::fabs(g[i]));
        if (e > worst) worst = e, worst_p = cat(p, "[", i, "] ", f[i], " vs ", g[i]);
      }
    }
    EXPECT_LT(worst, 1e-3) << "largest relative gradient difference fused vs unfused: " << worst_p;
    // ... bit-identically on a repeat, and another run seed draws other masks
    EXPECT_EQ(fused.loss, again.loss);
    for (auto& [p, g] : fused.grads) EXPECT_EQ(g, again.grads.at(p)) << p;
    EXPECT_NE(fused.loss, other_seed.loss);
  }
}

// token_pruning moves a [CLS] selection through onyx.DropoutAdd like through Add: both y and the
// residual are selected, the ratio / training_mode scalars kept. Outside a training run the
// result is exact; in one, the selected tokens draw masks alike (not the same bits, as for
// Dropout).
TEST(DropoutAddFusion, TokenPruningSelectsThroughDropoutAdd) {
  Block k;
  ir::Graph g = block_graph(k);
  ASSERT_EQ(fuse_only(g), 1);
  g.add_initializer("cls", Tensor::scalar_i64(0));
  for (auto& n : g.nodes)
    if (n.op_type == "Identity") {
      n.op_type = "Gather";
      n.inputs = {"sum", "cls"};
      n.attrs["axis"] = autodiff::attr_i(1);
    }
  ir::Graph pruned = g;
  passes::PassContext ctx;
  ctx.signature = signature_of(pruned);
  ctx.variables = {"W", "b"};
  ctx.refresh(pruned);
  EXPECT_EQ(passes::prune_tokens(pruned, ctx), 1);
  passes::eliminate_dead_nodes(pruned);
  int gathers_into_dropout_add = 0;
  for (auto& n : pruned.nodes)
    if (n.op_type == "DropoutAdd") {
      EXPECT_EQ(n.attr_string("rng_key", ""), "d");
      for (int i = 0; i < 2; i++)
        for (auto& p : pruned.nodes)
          if (p.op_type == "Gather" && p.outputs[0] == n.inputs[i]) gathers_into_dropout_add++;
    }
  EXPECT_EQ(gathers_into_dropout_add, 2);
  auto feeds = feeds_of(g);
  Tensor want = run(g, feeds, run_opts(false, 0)), got = run(pruned, feeds, run_opts(false, 0));
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); i++)
    EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i],
                1e-5 * (1 + std::fabs(want.data<float>()[i])));
  EXPECT_EQ(run(pruned, feeds, run_opts(true, 2)).shape(), want.shape());
}
