// tests/models/test_hf_models.cc — Hugging Face architectures built from config.json: config
// parsing (aliases, defaults, errors naming key and file), every (model type, task) graph running
// at batch 2 and two sequence lengths and training (finite loss, a gradient for every weight),
// checkpoint folders (round trip bit-identical, F16/BF16, shards, legacy names, prefixes, tied
// copies, missing / unexpected tensors) and the errors for bad folders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/safetensors.h"
#include "models/hf_model.h"
#include "models/hf_weights.h"
#include "passes/inference_export.h"
#include "runtime/session.h"
#include "train/training_session.h"

using namespace onyx;
using namespace onyx::models;
namespace fs = std::filesystem;

namespace {

const char* kBert = R"({"model_type": "bert", "architectures": ["BertForSequenceClassification"],
  "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 24,
  "vocab_size": 50, "max_position_embeddings": 32, "type_vocab_size": 2, "pad_token_id": 0,
  "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
  "id2label": {"0": "NEG", "1": "POS", "2": "NEUTRAL"}, "some_unknown_key": [1, 2]})";
const char* kRoberta = R"({"model_type": "roberta", "hidden_size": 16, "num_hidden_layers": 1,
  "num_attention_heads": 2, "intermediate_size": 20, "vocab_size": 40, "max_position_embeddings": 40,
  "type_vocab_size": 1, "pad_token_id": 1, "layer_norm_eps": 1e-5, "num_labels": 4})";
const char* kDistil = R"({"model_type": "distilbert", "dim": 16, "n_layers": 2, "n_heads": 2,
  "hidden_dim": 32, "vocab_size": 45, "max_position_embeddings": 32, "activation": "gelu"})";
const char* kGpt2 = R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 16,
  "n_layer": 2, "n_head": 4, "vocab_size": 60, "n_positions": 32, "activation_function": "gelu_new"})";
const char* kVit = R"({"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2,
  "num_attention_heads": 2, "intermediate_size": 32, "image_size": 8, "patch_size": 4,
  "num_channels": 3, "hidden_dropout_prob": 0.1, "num_labels": 5})";

HfConfig cfg(const char* text) { return parse_hf_config(text, "test/config.json"); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

fs::path temp_dir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("onyx_hf_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

Tensor ids_tensor(int64_t b, int64_t t, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor x(DType::Int64, {b, t});
  for (int64_t i = 0; i < x.numel(); i++) x.data<int64_t>()[i] = 2 + rng() % (vocab - 2);
  return x;
}

// Inputs for a model: token ids with the last row padded at the end, or images; labels for the
// task.
std::map<std::string, Tensor> make_inputs(const BuiltModel& m, int64_t b, int64_t t, bool labels) {
  std::map<std::string, Tensor> in;
  const HfConfig& c = m.config;
  std::mt19937 rng(7 + t);
  if (c.model_type == "vit") {
    Tensor px(DType::Float32, {b, c.num_channels, c.image_size, c.image_size});
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < px.numel(); i++) px.data<float>()[i] = nd(rng);
    in["pixel_values"] = px;
  } else {
    in["input_ids"] = ids_tensor(b, t, c.vocab_size, 3 + (uint32_t)t);
    Tensor mask(DType::Int64, {b, t});
    for (int64_t i = 0; i < b * t; i++)
      mask.data<int64_t>()[i] = (i / t == b - 1 && i % t >= t - 2) ? 0 : 1;
    in["attention_mask"] = mask;
    if (m.model.graph->find_input("token_type_ids")) {
      Tensor tt = Tensor::zeros(DType::Int64, {b, t});
      for (int64_t i = 0; i < b * t; i++) tt.data<int64_t>()[i] = (i % t) >= t / 2;
      in["token_type_ids"] = tt;
    }
  }
  if (labels) {
    Shape ls = m.task == Task::SequenceClassification || m.task == Task::ImageClassification
                   ? Shape{b}
                   : Shape{b, t};
    int64_t n = m.task == Task::MaskedLM || m.task == Task::CausalLM ? c.vocab_size : c.num_labels;
    Tensor l(DType::Int64, ls);
    for (int64_t i = 0; i < l.numel(); i++)
      l.data<int64_t>()[i] = i == 1 ? -100 : (int64_t)(rng() % n);
    in["labels"] = l;
  }
  return in;
}

bool all_finite(const Tensor& t) {
  for (double v : t.to_double_vector())
    if (!std::isfinite(v)) return false;
  return true;
}

struct Case {
  const char* config;
  Task task;
};
const Case kCases[] = {
    {kBert, Task::SequenceClassification},
    {kBert, Task::TokenClassification},
    {kBert, Task::MaskedLM},
    {kBert, Task::Base},
    {kRoberta, Task::SequenceClassification},
    {kRoberta, Task::TokenClassification},
    {kRoberta, Task::MaskedLM},
    {kDistil, Task::SequenceClassification},
    {kDistil, Task::TokenClassification},
    {kDistil, Task::MaskedLM},
    {kDistil, Task::Base},
    {kGpt2, Task::CausalLM},
    {kGpt2, Task::Base},
    {kVit, Task::ImageClassification},
    {kVit, Task::Base},
};

std::string case_name(const Case& c) {
  HfConfig h = cfg(c.config);
  return architecture_name(h.model_type, c.task);
}

}  // namespace

// ---- config.json ------------------------------------------------------------------------------

TEST(HfConfig, ParsesAliasesAndDefaults) {
  HfConfig b = cfg(kBert);
  EXPECT_EQ(b.hidden_size, 16);
  EXPECT_EQ(b.num_labels, 3);
  EXPECT_EQ(b.id2label[2], "NEUTRAL");
  EXPECT_EQ(b.hidden_act, "gelu");
  EXPECT_DOUBLE_EQ(b.layer_norm_eps, 1e-12);
  HfConfig g = cfg(kGpt2);
  EXPECT_EQ(g.hidden_size, 16);
  EXPECT_EQ(g.num_hidden_layers, 2);
  EXPECT_EQ(g.intermediate_size, 64);  // n_inner default 4 * n_embd
  EXPECT_EQ(g.max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(g.layer_norm_eps, 1e-5);
  HfConfig d = cfg(kDistil);
  EXPECT_EQ(d.intermediate_size, 32);
  EXPECT_EQ(d.num_labels, 2);  // Transformers' default
  EXPECT_EQ(cfg(kRoberta).num_labels, 4);
  EXPECT_EQ(cfg(kRoberta).pad_token_id, 1);
  EXPECT_EQ(cfg(kVit).image_size, 8);
}

TEST(HfConfig, ErrorsNameTheKeyAndTheFile) {
  std::string e = error_of(
      [] { parse_hf_config(R"({"model_type": "bert", "hidden_size": 8})", "dir/config.json"); });
  EXPECT_NE(e.find("dir/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("'num_hidden_layers'"), std::string::npos) << e;
  e = error_of(
      [] { parse_hf_config(R"({"model_type": "gpt2", "n_embd": "big"})", "dir/config.json"); });
  EXPECT_NE(e.find("'n_embd'"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
  e = error_of([] { parse_hf_config(R"({"hidden_size": 8})", "dir/config.json"); });
  EXPECT_NE(e.find("'model_type'"), std::string::npos) << e;
  e = error_of([] { parse_hf_config(R"({"model_type": "mamba"})", "dir/config.json"); });
  EXPECT_NE(e.find("'mamba'"), std::string::npos) << e;
  e = error_of([] { parse_hf_config(R"({"model_type": "bert", )", "dir/config.json"); });
  EXPECT_NE(e.find("dir/config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("JSON"), std::string::npos) << e;
  std::string bad_act = kGpt2;
  bad_act.replace(bad_act.find("gelu_new"), 8, "swishy");
  e = error_of([&] { parse_hf_config(bad_act, "dir/config.json"); });
  EXPECT_NE(e.find("swishy"), std::string::npos) << e;
}

TEST(HfConfig, IntegersPastInt64AreErrorsNotCasts) {
  // A float like 1e124 used to be cast to int64 (undefined behaviour, found by fuzz_config).
  for (const char* n_head : {"1e124", "-1e30", "18446744073709551615", "4.5"}) {
    std::string text = kGpt2;
    text.replace(text.find("\"n_head\": 4"), 11, std::string("\"n_head\": ") + n_head);
    std::string e = error_of([&] { parse_hf_config(text, "dir/config.json"); });
    EXPECT_NE(e.find("'num_attention_heads' must be an integer"), std::string::npos)
        << n_head << ": " << e;
  }
  // a layer count past any model's is refused before layer_types is sized by it (fuzz_config: a
  // 2.2e10-layer Llama config allocated 4 GiB)
  std::string e = error_of([] {
    parse_hf_config(R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 22147483647, "num_attention_heads": 8, "vocab_size": 211,
      "max_position_embeddings": 256})",
                    "dir/config.json");
  });
  EXPECT_NE(e.find("'num_hidden_layers' is 22147483647, past the 65536 layers"), std::string::npos)
      << e;
  std::string whole_float = kGpt2;
  whole_float.replace(whole_float.find("\"n_head\": 4"), 11, "\"n_head\": 4.0");
  EXPECT_EQ(cfg(whole_float.c_str()).num_attention_heads, 4);
}

TEST(HfConfig, TaskFromArchitecture) {
  EXPECT_EQ(task_from_architecture("BertForSequenceClassification"), Task::SequenceClassification);
  EXPECT_EQ(task_from_architecture("GPT2LMHeadModel"), Task::CausalLM);
  EXPECT_EQ(task_from_architecture("ViTModel"), Task::Base);
  EXPECT_EQ(task_from_architecture("DistilBertForMaskedLM"), Task::MaskedLM);
  EXPECT_FALSE(task_from_architecture("Florb"));
  EXPECT_EQ(architecture_name("gpt2", Task::CausalLM), "GPT2LMHeadModel");
  EXPECT_EQ(architecture_name("vit", Task::ImageClassification), "ViTForImageClassification");
}

// One list of what the builders make (built_model_types): each builds, the rest is refused
// naming the heads the type has, and the Python package reads the same names.
TEST(HfModel, BuiltArchitecturesAreTheBuildersOwnList) {
  auto archs = built_architectures();
  EXPECT_NE(std::find(archs.begin(), archs.end(), "Qwen2ForSequenceClassification"), archs.end());
  EXPECT_EQ(std::find(archs.begin(), archs.end(), "GPT2ForSequenceClassification"), archs.end());
  for (const char* text : {kBert, kRoberta, kDistil, kGpt2, kVit}) {
    HfConfig c = cfg(text);
    for (auto& [type, tasks] : built_model_types()) {
      if (type != c.model_type) continue;
      for (Task t : tasks) {
        EXPECT_NO_THROW(build_hf_model(c, t, 1)) << type << " " << task_name(t);
      }
    }
  }
  std::string e = error_of([] { build_hf_model(cfg(kGpt2), Task::SequenceClassification, 1); });
  EXPECT_NE(e.find("has no SequenceClassification head in onyx (CausalLM, Base)"),
            std::string::npos)
      << e;
}

// ---- graphs -------------------------------------------------------------------------------------

TEST(HfModel, TransformersParameterNames) {
  auto has = [](const BuiltModel& m, const std::string& n) {
    return m.model.graph->initializers.count(n) == 1;
  };
  BuiltModel b = build_hf_model(cfg(kBert), Task::SequenceClassification, 0);
  for (auto n :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
        "bert.encoder.layer.1.attention.self.query.weight",
        "bert.encoder.layer.0.attention.output.dense.bias",
        "bert.encoder.layer.0.attention.output.LayerNorm.weight",
        "bert.encoder.layer.0.intermediate.dense.weight",
        "bert.encoder.layer.0.output.dense.weight", "bert.encoder.layer.0.output.LayerNorm.bias",
        "bert.pooler.dense.weight", "classifier.weight", "classifier.bias"})
    EXPECT_TRUE(has(b, n)) << n;
  EXPECT_EQ(b.model.graph->initializers.at("classifier.weight").shape(), (Shape{3, 16}));
  // padding_idx row is zero; Linear weights are N(0, 0.02)
  const Tensor& we = b.model.graph->initializers.at("bert.embeddings.word_embeddings.weight");
  for (int i = 0; i < 16; i++) EXPECT_EQ(we.data<float>()[i], 0.0f);
  double s = 0;
  const Tensor& q =
      b.model.graph->initializers.at("bert.encoder.layer.0.intermediate.dense.weight");
  for (double v : q.to_double_vector()) s += v * v;
  EXPECT_NEAR(std::sqrt(s / q.numel()), 0.02, 0.004);
  EXPECT_EQ(b.model.graph->initializers.at("bert.embeddings.LayerNorm.weight").data<float>()[3],
            1.0f);

  BuiltModel g = build_hf_model(cfg(kGpt2), Task::CausalLM, 0);
  for (auto n : {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
                 "transformer.h.1.attn.c_attn.weight", "transformer.h.0.attn.c_proj.bias",
                 "transformer.h.0.ln_2.bias", "transformer.h.0.mlp.c_fc.weight",
                 "transformer.h.0.mlp.c_proj.weight", "transformer.ln_f.weight"})
    EXPECT_TRUE(has(g, n)) << n;
  EXPECT_FALSE(has(g, "lm_head.weight"));
  EXPECT_EQ(g.model.graph->initializers.at("transformer.h.0.attn.c_attn.weight").shape(),
            (Shape{16, 48}));

  BuiltModel d = build_hf_model(cfg(kDistil), Task::SequenceClassification, 0);
  for (auto n : {"distilbert.embeddings.word_embeddings.weight",
                 "distilbert.transformer.layer.0.attention.q_lin.weight",
                 "distilbert.transformer.layer.1.attention.out_lin.bias",
                 "distilbert.transformer.layer.0.sa_layer_norm.weight",
                 "distilbert.transformer.layer.0.ffn.lin1.weight",
                 "distilbert.transformer.layer.0.ffn.lin2.bias",
                 "distilbert.transformer.layer.0.output_layer_norm.weight", "pre_classifier.weight",
                 "classifier.bias"})
    EXPECT_TRUE(has(d, n)) << n;

  BuiltModel r = build_hf_model(cfg(kRoberta), Task::SequenceClassification, 0);
  for (auto n : {"roberta.embeddings.position_embeddings.weight", "classifier.dense.weight",
                 "classifier.out_proj.bias"})
    EXPECT_TRUE(has(r, n)) << n;

  BuiltModel v = build_hf_model(cfg(kVit), Task::ImageClassification, 0);
  for (auto n :
       {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings",
        "vit.embeddings.patch_embeddings.projection.weight",
        "vit.encoder.layer.0.layernorm_before.weight",
        "vit.encoder.layer.1.attention.attention.query.weight",
        "vit.encoder.layer.0.attention.output.dense.bias",
        "vit.encoder.layer.0.layernorm_after.bias", "vit.encoder.layer.0.intermediate.dense.weight",
        "vit.encoder.layer.0.output.dense.weight", "vit.layernorm.weight", "classifier.weight"})
    EXPECT_TRUE(has(v, n)) << n;
  EXPECT_EQ(v.model.graph->initializers.at("vit.embeddings.position_embeddings").shape(),
            (Shape{1, 5, 16}));

  BuiltModel mlm = build_hf_model(cfg(kBert), Task::MaskedLM, 0);
  EXPECT_TRUE(has(mlm, "cls.predictions.bias"));
  EXPECT_TRUE(has(mlm, "cls.predictions.transform.LayerNorm.weight"));
  EXPECT_FALSE(has(mlm, "cls.predictions.decoder.weight"));
  EXPECT_FALSE(has(mlm, "bert.pooler.dense.weight"));

  // The same seed gives the same weights; another seed others.
  BuiltModel b2 = build_hf_model(cfg(kBert), Task::SequenceClassification, 0);
  BuiltModel b3 = build_hf_model(cfg(kBert), Task::SequenceClassification, 1);
  auto w = [](const BuiltModel& m) {
    return m.model.graph->initializers.at("classifier.weight").to_double_vector();
  };
  EXPECT_EQ(w(b), w(b2));
  EXPECT_NE(w(b), w(b3));
}

TEST(HfModel, GraphsUseStandardOpsOnly) {
  for (const Case& c : kCases) {
    BuiltModel m = build_hf_model(cfg(c.config), c.task, 0);
    EXPECT_EQ(m.model.graph->opset(""), 17);
    for (auto& n : m.model.graph->nodes)
      EXPECT_EQ(n.domain, "") << case_name(c) << " " << n.describe();
  }
}

TEST(HfModel, RunsAtBatch2AndTwoSequenceLengths) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(case_name(c));
    BuiltModel m = build_hf_model(cfg(c.config), c.task, 0);
    passes::InferenceExportOptions io;
    if (c.task == Task::CausalLM) io.loss_output = "loss";
    auto g = std::make_shared<ir::Graph>(passes::make_inference_graph(*m.model.graph, io));
    runtime::Session s(g);
    s.check_supported();
    for (int64_t t : {5, 9}) {
      auto in = make_inputs(m, 2, t, false);
      auto out = s.run(in);
      std::string key = c.task == Task::Base ? "last_hidden_state" : "logits";
      ASSERT_TRUE(out.count(key));
      const Tensor& y = out.at(key);
      int64_t seq = m.config.model_type == "vit" ? 5 : t;
      Shape want = c.task == Task::SequenceClassification || c.task == Task::ImageClassification
                       ? Shape{2, m.config.num_labels}
                   : c.task == Task::TokenClassification ? Shape{2, t, m.config.num_labels}
                   : c.task == Task::Base                ? Shape{2, seq, m.config.hidden_size}
                                                         : Shape{2, t, m.config.vocab_size};
      EXPECT_EQ(y.shape(), want);
      EXPECT_TRUE(all_finite(y));
    }
    EXPECT_EQ(s.cached_plans(), m.config.model_type == "vit" ? 1u : 2u);
  }
}

TEST(HfModel, TrainsEveryWeight) {
  for (const Case& c : kCases) {
    if (c.task == Task::Base) continue;
    SCOPED_TRACE(case_name(c));
    BuiltModel m = build_hf_model(cfg(c.config), c.task, 0);
    autodiff::GradientOptions opts;
    opts.loss = m.model.loss;
    train::TrainingSession ts(m.model.graph, opts);
    EXPECT_EQ(ts.parameters().size(), m.model.graph->initializer_order.size());
    auto in = make_inputs(m, 2, 6, true);
    double loss = ts.forward_backward(in, false, 1, true);
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_GT(loss, 0);
    for (auto& p : ts.parameters()) {
      Tensor gr = ts.grads().view(p);
      EXPECT_TRUE(all_finite(gr)) << p;
      double s = 0;
      for (double v : gr.to_double_vector()) s += std::abs(v);
      EXPECT_GT(s, 0) << p;
    }
  }
}

TEST(HfModel, CausalLmLossShiftsLabels) {
  // With dropout off, the in-graph loss equals cross entropy of logits[:, :-1] vs labels[:, 1:].
  HfConfig c = cfg(kGpt2);
  c.hidden_dropout_prob = c.attention_probs_dropout_prob = c.embd_pdrop = 0;
  BuiltModel m = build_hf_model(c, Task::CausalLM, 3);
  auto in = make_inputs(m, 2, 5, true);
  runtime::Session s(m.model.graph);
  auto out = s.run(in);
  const Tensor& logits = out.at("logits");
  const int64_t* lab = in.at("labels").data<int64_t>();
  int64_t V = c.vocab_size;
  double total = 0;
  int n = 0;
  for (int64_t b = 0; b < 2; b++)
    for (int64_t t = 0; t < 4; t++) {
      int64_t y = lab[b * 5 + t + 1];
      if (y == -100) continue;
      const float* row = logits.data<float>() + (b * 5 + t) * V;
      double mx = -1e30, z = 0;
      for (int64_t v = 0; v < V; v++) mx = std::max(mx, (double)row[v]);
      for (int64_t v = 0; v < V; v++) z += std::exp(row[v] - mx);
      total += std::log(z) + mx - row[y];
      n++;
    }
  EXPECT_NEAR(out.at("loss").get_as_double(0), total / n, 1e-5);
}

// ---- checkpoint folders
// --------------------------------------------------------------------------

namespace {

// A folder holding `m`'s weights (under their own names) and `config_text`.
fs::path write_folder(const std::string& name, const char* config_text,
                      const std::map<std::string, Tensor>& w) {
  fs::path d = temp_dir(name);
  write(d / "config.json", config_text);
  io::save_safetensors((d / "model.safetensors").string(), w, {{"format", "pt"}});
  return d;
}

void expect_same_weights(const BuiltModel& a, const std::map<std::string, Tensor>& w) {
  EXPECT_EQ(a.model.graph->initializers.size(), w.size());
  for (auto& [k, t] : w) {
    ASSERT_TRUE(a.model.graph->initializers.count(k)) << k;
    const Tensor& x = a.model.graph->initializers.at(k);
    ASSERT_EQ(x.shape(), t.shape()) << k;
    EXPECT_EQ(std::memcmp(x.raw(), t.raw(), t.nbytes()), 0) << k;
  }
}

}  // namespace

TEST(HfWeights, LoadSaveLoadIsBitIdentical) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(case_name(c));
    BuiltModel src = build_hf_model(cfg(c.config), c.task, 11);
    auto w = hf_weights(src);
    fs::path d1 = write_folder("rt1", c.config, w);
    BuiltModel a = load_hf_folder(d1.string(), c.task);
    EXPECT_TRUE(a.missing_keys.empty());
    EXPECT_TRUE(a.unexpected_keys.empty());
    expect_same_weights(a, w);
    fs::path d2 = temp_dir("rt2");
    save_hf_folder(a, {}, d2.string());
    auto f = io::load_safetensors((d2 / "model.safetensors").string());
    EXPECT_EQ(f.metadata["format"], "pt");
    EXPECT_EQ(f.tensors.size(), w.size());
    BuiltModel b = load_hf_folder(d2.string());  // task from the saved "architectures"
    EXPECT_EQ(b.task, c.task);
    EXPECT_EQ(b.config.num_labels, a.config.num_labels);
    expect_same_weights(b, w);
    // Saving again writes the same bytes.
    fs::path d3 = temp_dir("rt3");
    save_hf_folder(b, {}, d3.string());
    EXPECT_EQ(read(d2 / "model.safetensors"), read(d3 / "model.safetensors"));
    EXPECT_EQ(read(d2 / "config.json"), read(d3 / "config.json"));
    fs::remove_all(d1);
    fs::remove_all(d2);
    fs::remove_all(d3);
  }
}

TEST(HfWeights, SaveTakesTrainedWeightsAndChecksThem) {
  BuiltModel m = build_hf_model(cfg(kBert), Task::SequenceClassification, 0);
  Tensor cw = Tensor::zeros(DType::Float32, {3, 16});
  cw.data<float>()[5] = 2.5f;
  fs::path d = temp_dir("save");
  save_hf_folder(m, {{"classifier.weight", cw}}, d.string());
  BuiltModel b = load_hf_folder(d.string());
  EXPECT_EQ(b.model.graph->initializers.at("classifier.weight").data<float>()[5], 2.5f);
  std::string config = read(d / "config.json");
  EXPECT_NE(config.find("\"BertForSequenceClassification\""), std::string::npos);
  EXPECT_NE(config.find("\"NEUTRAL\""), std::string::npos);
  EXPECT_NE(config.find("some_unknown_key"), std::string::npos);  // unknown keys kept
  std::string e = error_of([&] {
    save_hf_folder(m, {{"classifier.weight", Tensor::zeros(DType::Float32, {2, 16})}}, d.string());
  });
  EXPECT_NE(e.find("classifier.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 16]"), std::string::npos) << e;
  e = error_of([&] { save_hf_folder(m, {{"classifer.weight", cw}}, d.string()); });
  EXPECT_NE(e.find("classifer.weight"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(HfWeights, HalfPrecisionLegacyNamesBuffersAndTiedCopies) {
  BuiltModel src = build_hf_model(cfg(kGpt2), Task::CausalLM, 5);
  auto w = hf_weights(src);
  std::map<std::string, Tensor> file;
  for (auto& [k, t] : w) {  // F16 for some, BF16 for others
    Tensor h(k.find("ln_") != std::string::npos ? DType::BFloat16 : DType::Float16, t.shape());
    for (int64_t i = 0; i < t.numel(); i++)
      h.data<uint16_t>()[i] = h.dtype() == DType::Float16 ? float_to_half(t.data<float>()[i])
                                                          : float_to_bf16(t.data<float>()[i]);
    std::string name = k;
    if (name.size() > 7 && name.substr(name.size() - 7) == ".weight" &&
        name.find("ln_") != std::string::npos)
      name = name.substr(0, name.size() - 7) + ".gamma";
    file[name] = h;
  }
  file["transformer.h.0.attn.bias"] =
      Tensor::zeros(DType::Float32, {1, 1, 32, 32});  // causal buffer
  file["lm_head.weight"] = file["transformer.wte.weight"];
  fs::path d = write_folder("half", kGpt2, file);
  BuiltModel m = load_hf_folder(d.string());
  EXPECT_EQ(m.task, Task::CausalLM);
  EXPECT_TRUE(m.missing_keys.empty());
  EXPECT_TRUE(m.unexpected_keys.empty());
  const Tensor& wte = m.model.graph->initializers.at("transformer.wte.weight");
  EXPECT_EQ(wte.dtype(), DType::Float32);
  EXPECT_EQ(wte.data<float>()[7],
            half_to_float(float_to_half(w.at("transformer.wte.weight").data<float>()[7])));
  const Tensor& ln = m.model.graph->initializers.at("transformer.h.1.ln_2.weight");
  EXPECT_EQ(ln.data<float>()[0], 1.0f);
  fs::remove_all(d);
}

TEST(HfWeights, BaseCheckpointIntoHeadModelAndBack) {
  // A bare BertModel checkpoint (no "bert." prefix, with pooler) into
  // BertForSequenceClassification: the prefix is added, the classifier is missing (newly
  // initialized), nothing is unexpected.
  BuiltModel base = build_hf_model(cfg(kBert), Task::Base, 2);
  auto w = hf_weights(base);
  EXPECT_TRUE(w.count("embeddings.word_embeddings.weight"));
  fs::path d = write_folder("base", kBert, w);
  BuiltModel m = load_hf_folder(d.string(), Task::SequenceClassification);
  EXPECT_EQ(m.missing_keys, (std::vector<std::string>{"classifier.weight", "classifier.bias"}));
  EXPECT_TRUE(m.unexpected_keys.empty());
  EXPECT_EQ(m.model.graph->initializers.at("bert.pooler.dense.weight").to_double_vector(),
            w.at("pooler.dense.weight").to_double_vector());
  // ... and into the token classifier, which has no pooler: Transformers drops it silently.
  BuiltModel tok = load_hf_folder(d.string(), Task::TokenClassification);
  EXPECT_TRUE(tok.unexpected_keys.empty());
  // A head checkpoint into the bare model: the prefix is stripped, the head is unexpected.
  BuiltModel head = build_hf_model(cfg(kBert), Task::SequenceClassification, 3);
  fs::path d2 = write_folder("head", kBert, hf_weights(head));
  BuiltModel b = load_hf_folder(d2.string(), Task::Base);
  EXPECT_TRUE(b.missing_keys.empty());
  EXPECT_EQ(b.unexpected_keys, (std::vector<std::string>{"classifier.bias", "classifier.weight"}));
  fs::remove_all(d);
  fs::remove_all(d2);
}

TEST(HfWeights, MissingAndUnexpectedTensorsAreListed) {
  BuiltModel src = build_hf_model(cfg(kVit), Task::ImageClassification, 2);
  auto w = hf_weights(src);
  w.erase("vit.encoder.layer.1.output.dense.bias");
  w["vit.encoder.layer.7.extra"] = Tensor::zeros(DType::Float32, {2});
  fs::path d = write_folder("missing", kVit, w);
  BuiltModel m = load_hf_folder(d.string(), Task::ImageClassification);
  EXPECT_EQ(m.missing_keys, (std::vector<std::string>{"vit.encoder.layer.1.output.dense.bias"}));
  EXPECT_EQ(m.unexpected_keys, (std::vector<std::string>{"vit.encoder.layer.7.extra"}));
  fs::remove_all(d);
}

TEST(HfWeights, ShardedCheckpoint) {
  BuiltModel src = build_hf_model(cfg(kDistil), Task::MaskedLM, 4);
  auto w = hf_weights(src);
  fs::path d = temp_dir("shards");
  write(d / "config.json", kDistil);
  std::map<std::string, Tensor> s1, s2;
  std::string index = R"({"metadata": {"total_size": 0}, "weight_map": {)";
  int i = 0;
  for (auto& [k, t] : w) {
    bool first = i++ % 2 == 0;
    (first ? s1 : s2)[k] = t;
    index +=
        cat(i > 1 ? ", " : "", "\"", k, "\": \"",
            first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors", "\"");
  }
  index += "}}";
  io::save_safetensors((d / "model-00001-of-00002.safetensors").string(), s1);
  io::save_safetensors((d / "model-00002-of-00002.safetensors").string(), s2);
  write(d / "model.safetensors.index.json", index);
  BuiltModel m = load_hf_folder(d.string(), Task::MaskedLM);
  EXPECT_TRUE(m.missing_keys.empty());
  expect_same_weights(m, w);
  // Saving into the same folder replaces the shards with one file.
  save_hf_folder(m, {}, d.string());
  EXPECT_FALSE(fs::exists(d / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(d / "model-00001-of-00002.safetensors"));
  expect_same_weights(load_hf_folder(d.string(), Task::MaskedLM), w);
  fs::remove_all(d);
  // An index naming a tensor its shard lacks.
  fs::path d2 = temp_dir("badshard");
  write(d2 / "config.json", kDistil);
  io::save_safetensors((d2 / "a.safetensors").string(),
                       {{"x", Tensor::zeros(DType::Float32, {1})}});
  write(d2 / "model.safetensors.index.json",
        R"({"weight_map": {"distilbert.embeddings.LayerNorm.weight": "a.safetensors"}})");
  std::string e = error_of([&] { load_hf_folder(d2.string(), Task::MaskedLM); });
  EXPECT_NE(e.find("distilbert.embeddings.LayerNorm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("a.safetensors"), std::string::npos) << e;
  fs::remove_all(d2);
}

TEST(HfWeights, BadFoldersGiveErrorsNamingTheProblem) {
  BuiltModel src = build_hf_model(cfg(kBert), Task::SequenceClassification, 0);
  auto w = hf_weights(src);
  // Wrong shape: names the tensor, its shape and the expected one.
  auto bad = w;
  bad["bert.encoder.layer.0.attention.self.key.weight"] = Tensor::zeros(DType::Float32, {16, 15});
  fs::path d = write_folder("shape", kBert, bad);
  std::string e = error_of([&] { load_hf_folder(d.string()); });
  EXPECT_NE(e.find("bert.encoder.layer.0.attention.self.key.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[16, 15]"), std::string::npos) << e;
  EXPECT_NE(e.find("[16, 16]"), std::string::npos) << e;
  // Truncated safetensors: names the file.
  std::string bytes = read(d / "model.safetensors");
  write(d / "model.safetensors", bytes.substr(0, bytes.size() / 2));
  e = error_of([&] { load_hf_folder(d.string()); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  // Integer weights.
  auto ints = w;
  ints["classifier.bias"] = Tensor::zeros(DType::Int64, {3});
  io::save_safetensors((d / "model.safetensors").string(), ints);
  e = error_of([&] { load_hf_folder(d.string()); });
  EXPECT_NE(e.find("classifier.bias"), std::string::npos) << e;
  // Bad JSON in config.json: names the file.
  write(d / "config.json", "{\"model_type\": \"bert\",,}");
  e = error_of([&] { load_hf_folder(d.string()); });
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  // A required key missing: names it.
  write(d / "config.json", R"({"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 50, "max_position_embeddings": 32})");
  e = error_of([&] { load_hf_folder(d.string()); });
  EXPECT_NE(e.find("'intermediate_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  // No weights at all; no config at all.
  write(d / "config.json", kBert);
  fs::remove(d / "model.safetensors");
  e = error_of([&] { load_hf_folder(d.string()); });
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  fs::remove(d / "config.json");
  e = error_of([&] { load_hf_folder(d.string()); });
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  // A task the model type has no head for.
  e = error_of([&] { build_hf_model(cfg(kGpt2), Task::TokenClassification, 0); });
  EXPECT_NE(e.find("TokenClassification"), std::string::npos) << e;
  fs::remove_all(d);
}

TEST(HfWeights, FillDefaultInputs) {
  BuiltModel m = build_hf_model(cfg(kBert), Task::SequenceClassification, 0);
  std::map<std::string, Tensor> in{{"input_ids", ids_tensor(2, 4, 50, 1)}};
  fill_default_inputs(m, in);
  ASSERT_TRUE(in.count("attention_mask") && in.count("token_type_ids"));
  EXPECT_EQ(in.at("attention_mask").shape(), (Shape{2, 4}));
  EXPECT_EQ(in.at("attention_mask").data<int64_t>()[7], 1);
  EXPECT_EQ(in.at("token_type_ids").data<int64_t>()[7], 0);
}
