// gpt2.cc — GPT-2 as Transformers' GPT2Model (pre-LayerNorm causal decoder with Conv1D
// projections) and GPT2LMHeadModel (lm_head tied to wte; the loss shifts labels inside the graph:
// logits[:, :-1] against labels[:, 1:], as Transformers does).
//
// B batch, T sequence, C n_embd, nh n_head, hs = C / nh, F n_inner, V vocabulary.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct Gpt2 {
  GraphBuilder& b;
  const HfConfig& c;
  std::string prefix;      // "transformer." or "" for the bare model
  bool with_past = false;  // build_gpt2_with_past: keys/values of earlier tokens come as inputs

  Init weight_init() const { return Init::normal(c.initializer_range); }
  // GPT-2 scales c_proj weights by 1/sqrt(2 * n_layer) (residual-path init).
  Init proj_init() const {
    return Init::normal(c.initializer_range / std::sqrt(2.0 * (double)c.num_hidden_layers));
  }

  // wte(ids) + wpe(0..T-1) (with a cache: wpe(position_ids)), dropout. ids (B,T) -> (B,T,C)
  std::string embeddings(const std::string& ids) {
    int64_t C = c.hidden_size;
    std::string tok = b.embedding(ids, prefix + "wte", c.vocab_size, C, c.initializer_range);
    std::string wpe = b.param(prefix + "wpe.weight", {c.max_position_embeddings, C},
                              Init::normal(c.initializer_range));
    b.set_scope(prefix + "wpe");
    std::string pos = with_past ? b.gather_rows(wpe, token_input(b, "position_ids"))  // (B,T,C)
                                : b.leading_rows(wpe, ids, 1);  // rows 0..T-1: (T,C)
    b.set_scope(prefix + "drop");
    return b.dropout(b.op("Add", {tok, pos}), c.embd_pdrop);  // (B,T,C) + (T,C)
  }

  // The causal mask: (T,T) bool, true on and below the diagonal. Folds at plan time.
  std::string causal_mask(const std::string& ids) {
    b.set_scope(prefix + "causal_mask");
    std::string t = b.dim_of(ids, 1);
    std::string tt = b.op("Concat", {t, t}, {{"axis", Attr::of_int(0)}});
    Tensor one = Tensor::from_vector<float>(DType::Float32, {1}, {1.0f});
    std::string ones = b.op("ConstantOfShape", {tt}, {{"value", Attr::of_tensor(one)}});
    std::string lower = b.op("Trilu", {ones}, {{"upper", Attr::of_int(0)}});
    return b.op("Cast", {lower}, {{"to", Attr::of_int((int64_t)DType::Bool)}});
  }

  // GPT2Attention: c_attn -> q, k, v; softmax(mask(q k^T / sqrt(hs))) v; c_proj.
  // h (B,T,C), causal (T,T) bool, pad (B,1,1,T) additive -> (B,T,C)
  // With a cache (with_past), keys and values are the layer's past ones followed by the new ones.
  std::string attention(const std::string& p, const std::string& h, const std::string& causal,
                        const std::string& pad, int64_t layer) {
    int64_t C = c.hidden_size, nh = c.num_attention_heads, hs = C / nh;
    std::string qkv = b.conv1d(h, p + ".c_attn", C, 3 * C, weight_init());  // (B,T,3C)
    b.set_scope(p);
    auto parts = b.op_n("Split", {qkv, b.const_i64({C, C, C})}, {{"axis", Attr::of_int(2)}}, 3);
    std::string q = b.split_heads(parts[0], nh, hs);  // (B,nh,T,hs)
    if (with_past) {                                  // over the cache and the new tokens
      std::string y =
          cached_attention(b, layer, q, b.split_heads(parts[1], nh, hs),
                           b.split_heads(parts[2], nh, hs), nh, nh, hs, true, causal, pad);
      b.set_scope(p);
      return b.conv1d(b.merge_heads(y, C), p + ".c_proj", C, C, proj_init());
    }
    std::string k = b.split_heads_transposed(parts[1], nh, hs);  // (B,nh,hs,T)
    std::string v = b.split_heads(parts[2], nh, hs);             // (B,nh,T,hs)
    std::string att = b.op("MatMul", {q, k});                    // (B,nh,T,T)
    att = b.op("Div", {att, b.scalar_f32((float)std::sqrt((double)hs))});
    att = b.op("Where", {causal, att, b.scalar_f32(kMaskValue)});
    att = b.op("Add", {att, pad});
    att = b.op("Softmax", {att}, {{"axis", Attr::of_int(-1)}});
    att = b.dropout(att, c.attention_probs_dropout_prob);
    std::string y = b.merge_heads(b.op("MatMul", {att, v}), C);  // (B,T,C)
    y = b.conv1d(y, p + ".c_proj", C, C, proj_init());
    return b.dropout(y, c.hidden_dropout_prob);
  }

  // GPT2MLP: c_fc -> act -> c_proj -> dropout. (B,T,C) -> (B,T,C)
  std::string mlp(const std::string& p, const std::string& h) {
    int64_t C = c.hidden_size, F = c.intermediate_size;
    std::string x = b.conv1d(h, p + ".c_fc", C, F, weight_init());  // (B,T,F)
    x = b.activation(x, c.hidden_act);
    x = b.conv1d(x, p + ".c_proj", F, C, proj_init());  // (B,T,C)
    return b.dropout(x, c.hidden_dropout_prob);
  }

  // GPT2Block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). (B,T,C) -> (B,T,C)
  std::string block(const std::string& p, const std::string& h, const std::string& causal,
                    const std::string& pad, int64_t layer) {
    int64_t C = c.hidden_size;
    std::string a = attention(p + ".attn", b.layer_norm(h, p + ".ln_1", C, c.layer_norm_eps),
                              causal, pad, layer);
    b.set_scope(p);
    std::string x = b.op("Add", {a, h});
    std::string m = mlp(p + ".mlp", b.layer_norm(x, p + ".ln_2", C, c.layer_norm_eps));
    b.set_scope(p);
    return b.op("Add", {x, m});
  }

  std::string encode(const std::string& ids, const std::string& mask) {
    std::string h = embeddings(ids);
    std::string causal =
        with_past ? cached_causal_mask(
                        b, "past_values.0",  // declared by layer 0's attention
                        b.input("cache_position", DType::Int64, {-1}, {"sequence_length"}), 0)
                  : causal_mask(ids);
    std::string pad = additive_attention_mask(b, mask);
    for (int64_t i = 0; i < c.num_hidden_layers; i++)
      h = block(cat(prefix, "h.", i), h, causal, pad, i);
    return b.layer_norm(h, prefix + "ln_f", c.hidden_size, c.layer_norm_eps);
  }
};

}  // namespace

BuiltModel build_gpt2_with_past(const HfConfig& c, int64_t seed) {
  GraphBuilder b("GPT2LMHeadModelWithPast", (uint64_t)seed);
  Gpt2 m{b, c, "transformer.", true};
  std::string ids = token_input(b, "input_ids");
  std::string mask = cached_attention_mask_input(b);
  std::string h = m.encode(ids, mask);  // (B,S,C)
  return finish_decoder_with_past(b, c, h, "transformer.wte.weight", m.weight_init());
}

BuiltModel build_gpt2(const HfConfig& c, Task task, int64_t seed) {
  require_task(c, task);
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  Gpt2 m{b, c, task == Task::Base ? "" : "transformer."};
  int64_t C = c.hidden_size;

  std::string ids = token_input(b, "input_ids");
  std::string mask = token_input(b, "attention_mask");
  std::string h = m.encode(ids, mask);  // (B,T,C)

  if (task == Task::Base) {
    b.set_scope("");
    b.op("Identity", {h}, {}, "last_hidden_state");
    b.output("last_hidden_state", DType::Float32, {-1, -1, C});
    return finish_model(b, c, task);
  }
  // lm_head: h @ wte^T (no bias), or its own weight when embeddings are not tied.
  return finish_causal_lm(b, c, h, "transformer.wte.weight",
                          m.weight_init());  // logits, the shifted loss
}

}  // namespace onyx::models
