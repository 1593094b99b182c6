// clip_text.cc — CLIP's text encoder as Transformers' CLIPTextModel (the text encoder of Stable
// Diffusion): learned token and position embeddings, pre-LayerNorm layers with causal
// self-attention (q/k/v/out projections with biases, scores * head_dim^-0.5, the causal mask and
// the padding mask added), an MLP (fc1, quick_gelu, fc2), a final LayerNorm; outputs
// last_hidden_state and pooler_output (the state at each row's first eos_token_id, or with the
// legacy eos_token_id 2 at the largest id, as Transformers picks it).
//
// Parameter names are Transformers 5's (embeddings.*, encoder.layers.N.*, final_layer_norm.*);
// a checkpoint whose names carry "text_model." (Stable Diffusion's text_encoder folders, saved by
// Transformers 4) loads too (hf_weights.cc strips the base-model prefix).
//
// B batch, T sequence, C hidden_size, nh heads, hs = C / nh, F intermediate_size.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct ClipText {
  GraphBuilder& b;
  const HfConfig& c;

  // Transformers' CLIPPreTrainedModel._init_weights, with initializer_factor f (kept in
  // initializer_range): embeddings N(0, 0.02 f); q/k/v and fc2 N(0, C^-0.5 (2L)^-0.5 f); out_proj
  // N(0, C^-0.5 f); fc1 N(0, (2C)^-0.5 f); biases zero, LayerNorms ones / zeros.
  double factor() const { return c.initializer_range; }
  Init in_proj_init() const {
    const double C = (double)c.hidden_size, L = (double)c.num_hidden_layers;
    return Init::normal(std::pow(C, -0.5) * std::pow(2.0 * L, -0.5) * factor());
  }
  Init out_proj_init() const {
    return Init::normal(std::pow((double)c.hidden_size, -0.5) * factor());
  }
  Init fc1_init() const {
    return Init::normal(std::pow(2.0 * (double)c.hidden_size, -0.5) * factor());
  }

  // token_embedding(ids) + position_embedding(0..T-1). ids (B,T) -> (B,T,C)
  std::string embeddings(const std::string& ids) {
    const int64_t C = c.hidden_size;
    std::string tok =
        b.embedding(ids, "embeddings.token_embedding", c.vocab_size, C, 0.02 * factor());
    std::string table = b.param("embeddings.position_embedding.weight",
                                {c.max_position_embeddings, C}, Init::normal(0.02 * factor()));
    b.set_scope("embeddings.position_embedding");
    return b.op("Add", {tok, b.leading_rows(table, ids, 1)});  // (B,T,C) + (T,C)
  }

  // (1,1,T,T) additive: 0 on and below the diagonal, finfo(float32).min above it.
  std::string causal_mask(const std::string& ids) {
    b.set_scope("causal_mask");
    std::string t = b.dim_of(ids, 1);
    std::string tt = b.op("Concat", {t, t}, {{"axis", Attr::of_int(0)}});
    Tensor min = Tensor::from_vector<float>(DType::Float32, {1}, {kMaskValue});
    std::string full = b.op("ConstantOfShape", {tt}, {{"value", Attr::of_tensor(min)}});
    return b.op("Trilu", {full, b.scalar_i64(1)}, {{"upper", Attr::of_int(1)}});
  }

  // CLIPAttention: h (B,T,C), mask (B,1,T,T) additive -> (B,T,C)
  std::string attention(const std::string& p, const std::string& h, const std::string& mask) {
    const int64_t C = c.hidden_size, nh = c.num_attention_heads, hs = C / nh;
    std::string q = b.linear(h, p + ".q_proj", C, C, in_proj_init());
    std::string k = b.linear(h, p + ".k_proj", C, C, in_proj_init());
    std::string v = b.linear(h, p + ".v_proj", C, C, in_proj_init());
    b.set_scope(p);
    std::string s = b.op("MatMul", {b.split_heads(q, nh, hs), b.split_heads_transposed(k, nh, hs)});
    s = b.op("Mul", {s, b.scalar_f32((float)std::pow((double)hs, -0.5))});
    s = b.op("Softmax", {b.op("Add", {s, mask})}, {{"axis", Attr::of_int(-1)}});
    s = b.dropout(s, c.attention_probs_dropout_prob);
    std::string y = b.merge_heads(b.op("MatMul", {s, b.split_heads(v, nh, hs)}), C);
    return b.linear(y, p + ".out_proj", C, C, out_proj_init());
  }

  // CLIPEncoderLayer: x + attn(ln1(x)), then x + mlp(ln2(x)).
  std::string layer(const std::string& p, const std::string& h, const std::string& mask) {
    const int64_t C = c.hidden_size, F = c.intermediate_size;
    std::string a =
        attention(p + ".self_attn", b.layer_norm(h, p + ".layer_norm1", C, c.layer_norm_eps), mask);
    b.set_scope(p);
    std::string x = b.op("Add", {h, a});
    std::string m = b.layer_norm(x, p + ".layer_norm2", C, c.layer_norm_eps);
    m = b.linear(m, p + ".mlp.fc1", C, F, fc1_init());
    m = b.activation(m, c.hidden_act);
    m = b.linear(m, p + ".mlp.fc2", F, C, in_proj_init());
    b.set_scope(p);
    return b.op("Add", {x, m});
  }

  // (B,T,C) h, (B,T) ids -> (B,C): each row's state at its pooled position.
  std::string pooled(const std::string& h, const std::string& ids) {
    b.set_scope("pooler");
    std::string key = ids;  // legacy eos_token_id 2: the largest id
    if (c.eos_token_id != 2)
      key = b.op("Cast", {b.op("Equal", {ids, b.scalar_i64(c.eos_token_id)})},
                 {{"to", Attr::of_int((int64_t)DType::Int32)}});
    else
      key = b.op("Cast", {ids}, {{"to", Attr::of_int((int64_t)DType::Int32)}});
    std::string at =
        b.op("ArgMax", {key}, {{"axis", Attr::of_int(1)}, {"keepdims", Attr::of_int(1)}});
    std::string shape = b.op("Concat", {b.dim_of(h, 0), b.const_i64({1}), b.dim_of(h, 2)},
                             {{"axis", Attr::of_int(0)}});  // (B, 1, C)
    std::string idx = b.op("Expand", {b.op("Unsqueeze", {at, b.const_i64({2})}), shape});
    std::string row = b.op("GatherElements", {h, idx}, {{"axis", Attr::of_int(1)}});
    return b.op("Squeeze", {row, b.const_i64({1})}, {}, "pooler_output");
  }
};

}  // namespace

BuiltModel build_clip_text(const HfConfig& c, Task task, int64_t seed) {
  require_task(c, task);
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  ClipText m{b, c};
  const int64_t C = c.hidden_size;
  std::string ids = token_input(b, "input_ids");
  std::string pad = additive_attention_mask(b, token_input(b, "attention_mask"));  // (B,1,1,T)
  std::string mask = b.op("Add", {m.causal_mask(ids), pad});                       // (B,1,T,T)
  std::string h = m.embeddings(ids);
  for (int64_t i = 0; i < c.num_hidden_layers; i++) h = m.layer(cat("encoder.layers.", i), h, mask);
  h = b.layer_norm(h, "final_layer_norm", C, c.layer_norm_eps);
  b.set_scope("");
  b.op("Identity", {h}, {}, "last_hidden_state");
  m.pooled(h, ids);
  b.output("last_hidden_state", DType::Float32, {-1, -1, C});
  b.output("pooler_output", DType::Float32, {-1, C});
  return finish_model(b, c, task);
}

}  // namespace onyx::models
