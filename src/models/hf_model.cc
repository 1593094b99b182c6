// hf_model.cc — build_hf_model's dispatch by model type, Transformers' class names per task, and
// the pieces the family builders share (inputs, masks, heads, loss).
#include <algorithm>
#include <climits>

#include "autodiff/gradient.h"
#include "models/builders.h"

namespace onyx::models {

const char* task_name(Task t) {
  switch (t) {
    case Task::SequenceClassification:
      return "SequenceClassification";
    case Task::TokenClassification:
      return "TokenClassification";
    case Task::MaskedLM:
      return "MaskedLM";
    case Task::CausalLM:
      return "CausalLM";
    case Task::ImageClassification:
      return "ImageClassification";
    case Task::Seq2SeqLM:
      return "Seq2SeqLM";
    case Task::Base:
      return "Base";
  }
  return "?";
}

std::string base_model_prefix(const std::string& model_type) {
  if (model_type == "gpt2") return "transformer";
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2" ||
      model_type == "whisper" || model_type == "bart")
    return "model";
  if (model_type == "t5" || model_type == "mt5") return "transformer";
  if (model_type == "clip_text_model") return "text_model";  // (Transformers 4's names carry it)
  return model_type;  // "bert", "roberta", "distilbert", "vit"
}

std::string architecture_name(const std::string& model_type, Task t) {
  std::string stem = model_type == "bert"              ? "Bert"
                     : model_type == "roberta"         ? "Roberta"
                     : model_type == "distilbert"      ? "DistilBert"
                     : model_type == "gpt2"            ? "GPT2"
                     : model_type == "vit"             ? "ViT"
                     : model_type == "llama"           ? "Llama"
                     : model_type == "mistral"         ? "Mistral"
                     : model_type == "qwen2"           ? "Qwen2"
                     : model_type == "whisper"         ? "Whisper"
                     : model_type == "bart"            ? "Bart"
                     : model_type == "t5"              ? "T5"
                     : model_type == "mt5"             ? "MT5"
                     : model_type == "clip_text_model" ? "CLIPText"
                                                       : model_type;
  switch (t) {
    case Task::SequenceClassification:
      return stem + "ForSequenceClassification";
    case Task::TokenClassification:
      return stem + "ForTokenClassification";
    case Task::MaskedLM:
      return stem + "ForMaskedLM";
    case Task::CausalLM:
      return model_type == "gpt2" ? "GPT2LMHeadModel" : stem + "ForCausalLM";
    case Task::ImageClassification:
      return stem + "ForImageClassification";
    case Task::Seq2SeqLM:
      return stem + "ForConditionalGeneration";
    case Task::Base:
      return stem + "Model";
  }
  return stem;
}

const std::vector<std::pair<std::string, std::vector<Task>>>& built_model_types() {
  using T = Task;
  static const std::vector<Task> encoder = {T::SequenceClassification, T::TokenClassification,
                                            T::MaskedLM, T::Base};
  static const std::vector<Task> llama = {T::CausalLM, T::SequenceClassification, T::Base};
  static const std::vector<std::pair<std::string, std::vector<Task>>> types = {
      {"bert", encoder},
      {"roberta", encoder},
      {"distilbert", encoder},
      {"gpt2", {T::CausalLM, T::Base}},
      {"vit", {T::ImageClassification, T::Base}},
      {"llama", llama},
      {"mistral", llama},
      {"qwen2", llama},
      {"whisper", {T::Seq2SeqLM}},
      {"bart", {T::Seq2SeqLM}},
      {"t5", {T::Seq2SeqLM}},
      {"mt5", {T::Seq2SeqLM}},
      {"clip_text_model", {T::Base}}};
  return types;
}

std::vector<std::string> built_architectures() {
  std::vector<std::string> out;
  for (auto& [type, tasks] : built_model_types())
    for (Task t : tasks) out.push_back(architecture_name(type, t));
  return out;
}

void require_task(const HfConfig& c, Task task) {
  for (auto& [type, tasks] : built_model_types()) {
    if (type != c.model_type) continue;
    if (std::find(tasks.begin(), tasks.end(), task) != tasks.end()) return;
    std::string heads;
    for (Task t : tasks) heads += (heads.empty() ? "" : ", ") + std::string(task_name(t));
    throw Error(cat("model_type '", c.model_type, "' has no ", task_name(task), " head in onyx (",
                    heads, ")"));
  }
  throw Error(cat("model_type '", c.model_type, "' is not one onyx builds"));
}

std::optional<Task> task_from_architecture(const std::string& arch) {
  auto ends = [&](const std::string& s) {
    return arch.size() >= s.size() && arch.compare(arch.size() - s.size(), s.size(), s) == 0;
  };
  if (ends("ForSequenceClassification")) return Task::SequenceClassification;
  if (ends("ForTokenClassification")) return Task::TokenClassification;
  if (ends("ForMaskedLM") || ends("ForPreTraining")) return Task::MaskedLM;
  if (ends("LMHeadModel") || ends("ForCausalLM")) return Task::CausalLM;
  if (ends("ForImageClassification")) return Task::ImageClassification;
  if (ends("ForConditionalGeneration")) return Task::Seq2SeqLM;
  if (ends("Model")) return Task::Base;
  return std::nullopt;
}

std::string token_input(GraphBuilder& b, const std::string& name) {
  return b.input(name, DType::Int64, {-1, -1}, {"batch_size", "sequence_length"});
}

std::string additive_attention_mask(GraphBuilder& b, const std::string& mask) {
  // (B,T) int64 -> (B,1,1,T) float32: 0 where kept, finfo(float32).min where padded
  b.set_scope("extended_attention_mask");
  std::string m = b.op("Cast", {mask}, {{"to", Attr::of_int((int64_t)DType::Float32)}});
  m = b.op("Unsqueeze", {m, b.const_i64({1, 2})});
  m = b.op("Sub", {b.scalar_f32(1.0f), m});
  return b.op("Mul", {m, b.scalar_f32(kMaskValue)});
}

std::string first_token(GraphBuilder& b, const std::string& h) {
  // (B,T,C) -> (B,C)
  return b.op("Gather", {h, b.scalar_i64(0)}, {{"axis", Attr::of_int(1)}});
}

std::string tied_projection(GraphBuilder& b, const std::string& h, const std::string& table,
                            const std::string& bias, const std::string& out) {
  // h (..., C) @ table^T (C, V) [+ bias (V)] -> (..., V)
  std::string t = b.op("Transpose", {table}, {{"perm", Attr::of_ints({1, 0})}});
  if (bias.empty()) return b.op("MatMul", {h, t}, {}, out);
  return b.op("Add", {b.op("MatMul", {h, t}), bias}, {}, out);
}

void cross_kv_outputs(GraphBuilder& b, int64_t layer, const std::string& kt, const std::string& v,
                      int64_t heads, int64_t head_dim) {
  const std::string kn = cat("cross_keys.", layer), vn = cat("cross_values.", layer);
  b.op("Identity", {kt}, {}, kn);
  b.op("Identity", {v}, {}, vn);
  b.output(kn, DType::Float32, {-1, heads, head_dim, -1});
  b.output(vn, DType::Float32, {-1, heads, -1, head_dim});
}

BuiltModel finish_encoder(GraphBuilder& b, const HfConfig& c) {
  BuiltModel out = finish_model(b, c, Task::Base);
  out.model.predictions.clear();
  return out;
}

void seq2seq_lm_head(GraphBuilder& b, const HfConfig& c, const std::string& h,
                     const std::string& table, const std::string& bias) {
  const int64_t V = c.vocab_size;
  b.set_scope(c.model_type == "whisper" ? "proj_out" : "lm_head");
  std::string logits = tied_projection(b, h, table, bias, "logits");  // (B,T,V)
  std::string labels = token_input(b, "labels");
  b.set_scope("loss");
  b.op("SoftmaxCrossEntropyLoss",
       {b.op("Reshape", {logits, b.const_i64({-1, V})}),
        b.op("Reshape", {labels, b.const_i64({-1})})},
       {{"reduction", Attr::of_string("mean")}, {"ignore_index", Attr::of_int(-100)}}, "loss");
  b.output("loss", DType::Float32, {});
  b.output("logits", DType::Float32, {-1, -1, V});
}

BuiltModel finish_model(GraphBuilder& b, const HfConfig& c, Task task) {
  BuiltModel m;
  m.config = c;
  m.task = task;
  auto g = std::make_shared<ir::Graph>(b.take());
  for (auto& in : g->inputs) m.input_names.push_back(in.name);
  m.model.graph = g;
  m.model.generic_onnx = false;  // Transformers' rule: no weight decay on biases and LayerNorms
  m.model.predictions = task == Task::Base ? "last_hidden_state" : "logits";
  switch (task) {
    case Task::Base:
      break;  // no loss: the bare model is a feature extractor
    case Task::CausalLM:
    case Task::Seq2SeqLM:
      m.model.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
      m.model.loss.output = "loss";
      if (task == Task::Seq2SeqLM) {  // a mean per micro-batch, summed (as Transformers)
        m.model.sums_micro_batch_means = true;
        break;
      }
      m.model.items_labels = "labels";  // the loss's targets: labels[:, 1:] != -100
      m.model.items_shifted = true;
      break;
    default:
      m.model.loss.kind = task == Task::SequenceClassification && c.num_labels == 1
                              ? autodiff::LossSpec::Kind::MSE  // regression, as Transformers
                              : autodiff::LossSpec::Kind::CrossEntropy;
      m.model.loss.output = "logits";
      m.model.loss.labels = "labels";
      m.model.loss.ignore_index = -100;
  }
  return m;
}

void causal_lm_head(GraphBuilder& b, const std::string& h, const std::string& table, int64_t V) {
  b.set_scope("lm_head");
  std::string logits = tied_projection(b, h, table, "", "logits");  // (B,T,V)
  std::string labels = token_input(b, "labels");
  b.set_scope("loss");
  std::string shift_logits =
      b.op("Slice", {logits, b.const_i64({0}), b.const_i64({-1}), b.const_i64({1})});
  std::string shift_labels =
      b.op("Slice", {labels, b.const_i64({1}), b.const_i64({INT64_MAX}), b.const_i64({1})});
  std::string flat_logits = b.op("Reshape", {shift_logits, b.const_i64({-1, V})});  // (B*(T-1),V)
  std::string flat_labels = b.op("Reshape", {shift_labels, b.const_i64({-1})});     // (B*(T-1))
  b.op("SoftmaxCrossEntropyLoss", {flat_logits, flat_labels},
       {{"reduction", Attr::of_string("mean")}, {"ignore_index", Attr::of_int(-100)}}, "loss");
  b.output("loss", DType::Float32, {});
  b.output("logits", DType::Float32, {-1, -1, V});
}

std::string cached_attention(GraphBuilder& b, int64_t layer, const std::string& q,
                             const std::string& k, const std::string& v, int64_t nh, int64_t nkv,
                             int64_t hd, bool divide, const std::string& causal,
                             const std::string& pad) {
  // past keys stored transposed, (B,nkv,hd,P): q @ past_k needs no transpose per step
  std::string pk = b.input(cat("past_keys.", layer), DType::Float32, {-1, nkv, hd, -1},
                           {"batch_size", "", "", "past_length"});
  std::string pv = b.input(cat("past_values.", layer), DType::Float32, {-1, nkv, -1, hd},
                           {"batch_size", "", "past_length", ""});
  new_kv_outputs(b, layer, k, v, nkv, hd);
  const int64_t g = nh / nkv;
  std::string bdim = b.dim_of(q, 0), sdim = b.dim_of(q, 2), pdim = b.dim_of(pv, 2);
  // the g query heads of one key/value head as one block of rows: (B,nkv,g*S,hd)
  std::string qg = b.op("Reshape", {q, b.const_i64({0, nkv, -1, hd})});
  std::string kt = b.op("Transpose", {k}, {{"perm", Attr::of_ints({0, 1, 3, 2})}});  // (B,nkv,hd,S)
  std::string s = b.op("Concat", {b.op("MatMul", {qg, pk}), b.op("MatMul", {qg, kt})},
                       {{"axis", Attr::of_int(-1)}});  // (B,nkv,g*S,P+S)
  const double scale = std::sqrt((double)hd);
  s = divide ? b.op("Div", {s, b.scalar_f32((float)scale)})
             : b.op("Mul", {s, b.scalar_f32((float)(1.0 / scale))});
  // (B,nkv,g,S,P+S): the masks broadcast over the heads
  std::string s5 =
      b.op("Reshape", {s, b.op("Concat", {bdim, b.const_i64({nkv, g}), sdim, b.const_i64({-1})},
                               {{"axis", Attr::of_int(0)}})});
  s5 = b.op("Where", {causal, s5, b.scalar_f32(kMaskValue)});
  s5 = b.op("Add", {s5, b.op("Unsqueeze", {pad, b.const_i64({1})})});
  s5 = b.op("Softmax", {s5}, {{"axis", Attr::of_int(-1)}});
  std::string pr =
      b.op("Reshape", {s5, b.op("Concat", {bdim, b.const_i64({nkv, -1}), b.dim_of(s, 3)},
                                {{"axis", Attr::of_int(0)}})});
  auto parts = b.op_n("Split", {pr, b.op("Concat", {pdim, sdim}, {{"axis", Attr::of_int(0)}})},
                      {{"axis", Attr::of_int(-1)}}, 2);
  std::string y = b.op("Add", {b.op("MatMul", {parts[0], pv}), b.op("MatMul", {parts[1], v})});
  return b.op("Reshape", {y, b.op("Concat", {bdim, b.const_i64({nh}), sdim, b.const_i64({hd})},
                                  {{"axis", Attr::of_int(0)}})});  // (B,nh,S,hd)
}

std::string cached_causal_mask(GraphBuilder& b, const std::string& past_value,
                               const std::string& cache_position, int64_t window) {
  b.set_scope(window > 0 ? "model.sliding_cache_mask" : "model.cache_mask");
  std::string p = b.op("Squeeze", {b.dim_of(past_value, 2), b.const_i64({0})});
  std::string past_slots = b.op("Range", {b.scalar_i64(0), p, b.scalar_i64(1)});  // (P)
  std::string slots =
      b.op("Concat", {past_slots, cache_position}, {{"axis", Attr::of_int(0)}});  // (P+S)
  std::string qi = b.op("Unsqueeze", {cache_position, b.const_i64({1})});         // (S,1)
  std::string kj = b.op("Unsqueeze", {slots, b.const_i64({0})});                  // (1,P+S)
  std::string mask = b.op("GreaterOrEqual", {qi, kj});
  if (window > 0)
    mask = b.op("And", {mask, b.op("Less", {b.op("Sub", {qi, kj}), b.scalar_i64(window)})});
  return mask;
}

void new_kv_outputs(GraphBuilder& b, int64_t layer, const std::string& k, const std::string& v,
                    int64_t kv_heads, int64_t head_dim) {
  std::string kn = cat("new_keys.", layer), vn = cat("new_values.", layer);
  b.op("Identity", {k}, {}, kn);
  b.op("Identity", {v}, {}, vn);
  b.output(kn, DType::Float32, {-1, kv_heads, -1, head_dim});
  b.output(vn, DType::Float32, {-1, kv_heads, -1, head_dim});
}

std::string cached_attention_mask_input(GraphBuilder& b) {
  return b.input("attention_mask", DType::Int64, {-1, -1},
                 {"batch_size", "past_length + sequence_length"});
}

std::string lm_head_table(GraphBuilder& b, const HfConfig& c, const std::string& embed_table,
                          const Init& head_init) {
  if (c.tie_word_embeddings) return embed_table;
  return b.param("lm_head.weight", {c.vocab_size, c.hidden_size}, head_init);
}

// The BuiltModel of a causal LM (training graph or decoder with past): tied heads recorded.
static BuiltModel finish_lm(GraphBuilder& b, const HfConfig& c, const std::string& embed_table) {
  BuiltModel out = finish_model(b, c, Task::CausalLM);
  if (c.tie_word_embeddings) out.tied.push_back({"lm_head.weight", embed_table});
  return out;
}

BuiltModel finish_causal_lm(GraphBuilder& b, const HfConfig& c, const std::string& h,
                            const std::string& embed_table, const Init& head_init) {
  causal_lm_head(b, h, lm_head_table(b, c, embed_table, head_init), c.vocab_size);
  return finish_lm(b, c, embed_table);
}

BuiltModel finish_decoder_with_past(GraphBuilder& b, const HfConfig& c, const std::string& h,
                                    const std::string& embed_table, const Init& head_init) {
  const int64_t V = c.vocab_size;
  std::string table = lm_head_table(b, c, embed_table, head_init);
  b.set_scope("lm_head");
  std::string s = b.op("Squeeze", {b.dim_of(h, 1), b.const_i64({0})});
  std::string last =
      b.op("Gather", {h, b.op("Sub", {s, b.scalar_i64(1)})}, {{"axis", Attr::of_int(1)}});
  tied_projection(b, last, table, "", "logits");  // (B,V)
  b.output("logits", DType::Float32, {-1, V});
  BuiltModel out = finish_lm(b, c, embed_table);
  out.model.loss = {};  // generation: no loss, no labels
  out.model.items_labels.clear();
  return out;
}

BuiltModel build_hf_decoder_with_past(const HfConfig& c, int64_t seed) {
  const std::string& t = c.model_type;
  if (t == "gpt2") return build_gpt2_with_past(c, seed);
  if (t == "llama" || t == "mistral" || t == "qwen2") return build_llama_with_past(c, seed);
  if (t == "t5" || t == "mt5") return build_t5_with_past(c, seed);
  if (is_encoder_decoder(t)) return build_seq2seq_with_past(c, seed);
  throw Error(cat("model_type '", t,
                  "' is not a decoder onyx generates with (gpt2, llama, mistral, qwen2, whisper, "
                  "bart, t5, mt5)"));
}

bool is_encoder_decoder(const std::string& model_type) {
  return model_type == "whisper" || model_type == "bart" || model_type == "t5" ||
         model_type == "mt5";
}

BuiltModel build_hf_encoder(const HfConfig& c, int64_t seed) {
  ONYX_CHECK(is_encoder_decoder(c.model_type), "model_type '", c.model_type,
             "' is not an encoder–decoder (whisper, bart, t5, mt5)");
  if (c.model_type == "t5" || c.model_type == "mt5") return build_t5_encoder(c, seed);
  return build_seq2seq_encoder(c, seed);
}

BuiltModel build_hf_cross_attentions(const HfConfig& c,
                                     const std::vector<std::pair<int64_t, int64_t>>& heads) {
  ONYX_CHECK(c.model_type == "whisper" || c.model_type == "bart", "model_type '", c.model_type,
             "': cross-attention weights are built for whisper and bart");
  return build_seq2seq_cross_attentions(c, heads);
}

BuiltModel build_hf_model(const HfConfig& c, Task task, int64_t seed) {
  const std::string& t = c.model_type;
  if (t == "bert" || t == "roberta") return build_bert(c, task, seed);
  if (t == "distilbert") return build_distilbert(c, task, seed);
  if (t == "gpt2") return build_gpt2(c, task, seed);
  if (t == "vit") return build_vit(c, task, seed);
  if (t == "llama" || t == "mistral" || t == "qwen2") return build_llama(c, task, seed);
  if (t == "t5" || t == "mt5") return build_t5(c, task, seed);
  if (t == "clip_text_model") return build_clip_text(c, task, seed);
  if (is_encoder_decoder(t)) return build_seq2seq(c, task, seed);
  throw Error(
      cat("model_type '", t,
          "' is not supported (bert, roberta, distilbert, gpt2, vit, llama, mistral, qwen2, "
          "whisper, bart, t5, mt5, clip_text_model)"));
}

}  // namespace onyx::models
