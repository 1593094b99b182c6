// llama.cc — the Llama family as Transformers' LlamaModel / MistralModel / Qwen2Model and their
// ...ForCausalLM and ...ForSequenceClassification heads: pre-RMSNorm decoder layers, rotary
// position embeddings (rope types default, linear, dynamic, llama3), grouped-query attention
// (num_key_value_heads, keys and values repeated per query group), the SwiGLU MLP
// down(silu(gate(x)) * up(x)), optional biases (Llama's attention_bias / mlp_bias, Qwen2's q/k/v
// biases), causal masks with an optional sliding window (Mistral; Qwen2 per layer_types), tied or
// separate lm_head. Weight names are Transformers' (model.embed_tokens, model.layers.N.self_attn.
// q_proj, ..., model.norm, lm_head / score).
//
// B batch, T sequence, C hidden_size, nh heads, nkv key/value heads, hd head_dim, F
// intermediate_size, V vocabulary.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct Llama {
  GraphBuilder& b;
  const HfConfig& c;
  int64_t nh, nkv, hd;
  bool with_past = false;  // build_llama_with_past: keys/values of earlier tokens come as inputs

  Init weight_init() const { return Init::normal(c.initializer_range); }

  // LlamaRMSNorm (float32 throughout).
  std::string rms_norm(const std::string& x, const std::string& name) {
    return b.rms_norm(x, name, c.hidden_size, c.layer_norm_eps);
  }

  // The rotary tables (B,1,T,hd): cos and sin of position_ids times the inverse frequencies of
  // the config's rope type (Transformers' ROPE_INIT_FUNCTIONS, in float32 as Transformers).
  std::pair<std::string, std::string> rotary(const std::string& pos_ids) {
    b.set_scope("model.rotary_emb");
    const auto& r = c.rope;
    const int64_t half = hd / 2;
    std::vector<float> exps(half);  // arange(0, hd, 2) / hd
    for (int64_t i = 0; i < half; i++) exps[i] = (float)(2 * i) / (float)hd;
    std::string pos =
        b.op("Cast", {pos_ids}, {{"to", Attr::of_int((int64_t)DType::Float32)}});  // (B,T)
    // The frequencies of rope types default, linear and llama3 (and dynamic's up to
    // max_position_embeddings): float32 constants computed as Transformers' rope_init_fn.
    std::vector<float> f(half);
    for (int64_t i = 0; i < half; i++) {
      float v = 1.0f / std::pow((float)r.theta, exps[i]);  // float32, as torch
      if (r.type == "linear") v = v / (float)r.factor;
      if (r.type == "llama3") {
        const double old =
            (double)(r.original_max_position_embeddings ? r.original_max_position_embeddings
                                                        : c.max_position_embeddings);
        const double low_wl = old / r.low_freq_factor, high_wl = old / r.high_freq_factor;
        const double wl = 2 * M_PI / (double)v;
        double out = wl > low_wl ? (double)v / r.factor : (double)v;
        if (!(wl < high_wl) && !(wl > low_wl)) {
          double smooth = (old / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          out = (1 - smooth) * out / r.factor + smooth * out;
        }
        v = (float)out;
      }
      f[i] = v;
    }
    // Named as Transformers' buffer: bf16_full_eval rounds it as model.to(torch.bfloat16)
    // does (train/training_session.cc, with_rounded_rotary_frequencies).
    std::string inv_freq =
        b.op("Constant", {},
             {{"value", Attr::of_tensor(Tensor::from_vector<float>(DType::Float32, {half}, f))}},
             "model.rotary_emb.inv_freq");
    if (r.type == "dynamic") {
      // Transformers' dynamic_rope_update: for a sequence length L = max(position_ids) + 1
      // (over the batch; with a cache, the length so far) above M = max_position_embeddings,
      // frequencies recomputed in float32 from the NTK-scaled base
      //   base * (factor * L / M - (factor - 1)) ^ (hd / (hd - 2)),
      // else the buffer above (original_inv_freq).
      const float M = (float)c.max_position_embeddings;
      std::string L = b.op("Add", {b.op("ReduceMax", {pos}, {{"keepdims", Attr::of_int(0)}}),
                                   b.scalar_f32(1.0f)});  // () float32
      std::string q = b.op("Sub", {b.op("Mul", {L, b.scalar_f32((float)(r.factor / M))}),
                                   b.scalar_f32((float)(r.factor - 1))});
      std::string base = b.op("Mul", {b.scalar_f32((float)r.theta),
                                      b.op("Pow", {q, b.scalar_f32((float)hd / (float)(hd - 2))})});
      Tensor e = Tensor::from_vector<float>(DType::Float32, {half}, exps);
      std::string scaled = b.op("Reciprocal", {b.op("Pow", {base, b.const_tensor(e)})});
      inv_freq = b.op("Where", {b.op("Greater", {L, b.scalar_f32(M)}), scaled, inv_freq});
    }
    std::string freqs = b.op("Mul", {b.op("Unsqueeze", {pos, b.const_i64({2})}), inv_freq});
    std::string emb = b.op("Concat", {freqs, freqs}, {{"axis", Attr::of_int(-1)}});  // (B,T,hd)
    emb = b.op("Unsqueeze", {emb, b.const_i64({1})});  // (B,1,T,hd): broadcast over heads
    return {b.op("Cos", {emb}), b.op("Sin", {emb})};
  }

  // x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1). x (B,h,T,hd)
  std::string apply_rotary(const std::string& x, const std::string& cos, const std::string& sin) {
    auto halves =
        b.op_n("Split", {x, b.const_i64({hd / 2, hd / 2})}, {{"axis", Attr::of_int(-1)}}, 2);
    std::string rot =
        b.op("Concat", {b.op("Neg", {halves[1]}), halves[0]}, {{"axis", Attr::of_int(-1)}});
    return b.op("Add", {b.op("Mul", {x, cos}), b.op("Mul", {rot, sin})});
  }

  // (B,T,h*hd) -> (B,h,T,hd)
  std::string heads(const std::string& x, int64_t h) {
    std::string r = b.op("Reshape", {x, b.const_i64({0, 0, h, hd})});
    return b.op("Transpose", {r}, {{"perm", Attr::of_ints({0, 2, 1, 3})}});
  }

  // repeat_kv: (B,nkv,T,hd) -> (B,nh,T,hd), each key/value head serving nh/nkv query heads.
  std::string repeat_kv(const std::string& x, const std::string& shape5,
                        const std::string& shape4) {
    if (nkv == nh) return x;
    std::string e = b.op("Unsqueeze", {x, b.const_i64({2})});  // (B,nkv,1,T,hd)
    return b.op("Reshape", {b.op("Expand", {e, shape5}), shape4});
  }

  // (B,1,T,T) bool: key j visible to query i when j <= i, both in the same packed sample (a
  // sample starts where position_ids is 0, as Transformers' find_packed_sequence_indices), and
  // i - j < window for sliding layers.
  std::string causal_mask(const std::string& ids, const std::string& segments, int64_t window) {
    b.set_scope("model.causal_mask");
    std::string t = b.dim_of(ids, 1);
    std::string t_scalar = b.op("Squeeze", {t, b.const_i64({0})});
    std::string r = b.op("Range", {b.scalar_i64(0), t_scalar, b.scalar_i64(1)});  // (T)
    std::string qi = b.op("Unsqueeze", {r, b.const_i64({1})});                    // (T,1)
    std::string kj = b.op("Unsqueeze", {r, b.const_i64({0})});                    // (1,T)
    std::string mask = b.op("GreaterOrEqual", {qi, kj});
    if (window > 0)
      mask = b.op("And", {mask, b.op("Less", {b.op("Sub", {qi, kj}), b.scalar_i64(window)})});
    std::string same = b.op("Equal", {b.op("Unsqueeze", {segments, b.const_i64({2})}),
                                      b.op("Unsqueeze", {segments, b.const_i64({1})})});  // (B,T,T)
    return b.op("Unsqueeze", {b.op("And", {same, mask}), b.const_i64({1})});  // (B,1,T,T)
  }

  // LlamaAttention (eager): softmax(mask(q k^T / sqrt(hd))) v, o_proj.
  // With a cache (with_past), keys and values are the layer's past ones followed by the new ones.
  std::string attention(const std::string& p, const std::string& x, const std::string& cos,
                        const std::string& sin, const std::string& causal, const std::string& pad,
                        int64_t layer) {
    int64_t C = c.hidden_size;
    std::string q = b.linear(x, p + ".q_proj", C, nh * hd, weight_init(), c.attention_bias);
    std::string k = b.linear(x, p + ".k_proj", C, nkv * hd, weight_init(), c.attention_bias);
    std::string v = b.linear(x, p + ".v_proj", C, nkv * hd, weight_init(), c.attention_bias);
    b.set_scope(p);
    q = apply_rotary(heads(q, nh), cos, sin);   // (B,nh,T,hd)
    k = apply_rotary(heads(k, nkv), cos, sin);  // (B,nkv,T,hd)
    v = heads(v, nkv);
    if (with_past) {  // over the cache and the new tokens
      std::string y = cached_attention(b, layer, q, k, v, nh, nkv, hd, false, causal, pad);
      b.set_scope(p);
      y = b.op("Reshape", {b.op("Transpose", {y}, {{"perm", Attr::of_ints({0, 2, 1, 3})}}),
                           b.const_i64({0, 0, nh * hd})});
      return b.linear(y, p + ".o_proj", nh * hd, C, weight_init(), c.o_proj_bias);
    }
    // target shapes for repeat_kv: [B, nkv, nh/nkv, Tk, hd] and [B, nh, Tk, hd]
    std::string bdim = b.dim_of(x, 0), tdim = b.dim_of(k, 2);
    std::string shape5 =
        b.op("Concat", {bdim, b.const_i64({nkv, nh / nkv}), tdim, b.const_i64({hd})},
             {{"axis", Attr::of_int(0)}});
    std::string shape4 = b.op("Concat", {bdim, b.const_i64({nh}), tdim, b.const_i64({hd})},
                              {{"axis", Attr::of_int(0)}});
    k = repeat_kv(k, shape5, shape4);
    v = repeat_kv(v, shape5, shape4);
    std::string kt = b.op("Transpose", {k}, {{"perm", Attr::of_ints({0, 1, 3, 2})}});
    std::string att = b.op("MatMul", {q, kt});  // (B,nh,T,T)
    att = b.op("Mul", {att, b.scalar_f32((float)(1.0 / std::sqrt((double)hd)))});
    att = b.op("Where", {causal, att, b.scalar_f32(kMaskValue)});
    att = b.op("Add", {att, pad});
    att = b.op("Softmax", {att}, {{"axis", Attr::of_int(-1)}});
    att = b.dropout(att, c.attention_probs_dropout_prob);
    std::string y = b.op("MatMul", {att, v});  // (B,nh,T,hd)
    y = b.op("Reshape", {b.op("Transpose", {y}, {{"perm", Attr::of_ints({0, 2, 1, 3})}}),
                         b.const_i64({0, 0, nh * hd})});
    return b.linear(y, p + ".o_proj", nh * hd, C, weight_init(), c.o_proj_bias);
  }

  // LlamaMLP: down(silu(gate(x)) * up(x)).
  std::string mlp(const std::string& p, const std::string& x) {
    int64_t C = c.hidden_size, F = c.intermediate_size;
    std::string g = b.linear(x, p + ".gate_proj", C, F, weight_init(), c.mlp_bias);
    std::string u = b.linear(x, p + ".up_proj", C, F, weight_init(), c.mlp_bias);
    b.set_scope(p);
    std::string act = b.op("Mul", {g, b.op("Sigmoid", {g})});  // SiLU (silu_fusion fuses it)
    return b.linear(b.op("Mul", {act, u}), p + ".down_proj", F, C, weight_init(), c.mlp_bias);
  }

  std::string decode(const std::string& ids, const std::string& mask) {
    std::string h =
        b.embedding(ids, "model.embed_tokens", c.vocab_size, c.hidden_size, c.initializer_range,
                    c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size ? c.pad_token_id : -1);
    // position_ids (B,T): 0..T-1 per row unless given (packed samples restart at 0)
    std::string pos_ids = token_input(b, "position_ids");
    auto [cos, sin] = rotary(pos_ids);
    std::string full, sliding;
    if (with_past) {  // masks over the cache slots and the new tokens (no packed samples)
      std::string cache_pos = b.input("cache_position", DType::Int64, {-1}, {"sequence_length"});
      std::string past_k0 = cat("past_values.", 0);  // declared by layer 0's attention
      full = cached_causal_mask(b, past_k0, cache_pos, 0);
      sliding =
          c.sliding_window > 0 ? cached_causal_mask(b, past_k0, cache_pos, c.sliding_window) : full;
    } else {
      b.set_scope("model.packed_segments");
      std::string starts = b.op("Cast", {b.op("Equal", {pos_ids, b.scalar_i64(0)})},
                                {{"to", Attr::of_int((int64_t)DType::Int64)}});
      std::string segments = b.op("CumSum", {starts, b.scalar_i64(1)});  // (B,T): sample index
      full = causal_mask(ids, segments, 0);
      sliding = c.sliding_window > 0 ? causal_mask(ids, segments, c.sliding_window) : full;
    }
    std::string pad = additive_attention_mask(b, mask);
    for (int64_t i = 0; i < c.num_hidden_layers; i++) {
      std::string p = cat("model.layers.", i);
      bool slide = i < (int64_t)c.layer_types.size() && c.layer_types[i] == "sliding_attention";
      std::string a = attention(p + ".self_attn", rms_norm(h, p + ".input_layernorm"), cos, sin,
                                slide ? sliding : full, pad, i);
      b.set_scope(p);
      h = b.op("Add", {h, a});
      std::string m = mlp(p + ".mlp", rms_norm(h, p + ".post_attention_layernorm"));
      b.set_scope(p);
      h = b.op("Add", {h, m});
    }
    return rms_norm(h, "model.norm");
  }
};

Llama make_llama(GraphBuilder& b, const HfConfig& c) {
  ONYX_CHECK(c.hidden_act == "silu", "model_type '", c.model_type, "': hidden_act '", c.hidden_act,
             "' is not supported (silu)");
  const int64_t nh = c.num_attention_heads;
  const int64_t nkv = c.num_key_value_heads ? c.num_key_value_heads : nh;
  const int64_t hd = c.head_dim ? c.head_dim : c.hidden_size / nh;
  ONYX_CHECK(hd % 2 == 0, "model_type '", c.model_type, "': head_dim ", hd,
             " must be even (rotary embeddings rotate pairs)");
  return Llama{b, c, nh, nkv, hd};
}

}  // namespace

BuiltModel build_llama_with_past(const HfConfig& c, int64_t seed) {
  GraphBuilder b(architecture_name(c.model_type, Task::CausalLM) + "WithPast", (uint64_t)seed);
  b.set_quantization(c.quantization);  // a 4-bit folder generates from its 4-bit weights
  Llama m = make_llama(b, c);
  m.with_past = true;
  std::string ids = token_input(b, "input_ids");
  std::string mask = cached_attention_mask_input(b);
  std::string h = m.decode(ids, mask);  // (B,S,C)
  return finish_decoder_with_past(b, c, h, "model.embed_tokens.weight", m.weight_init());
}

BuiltModel build_llama(const HfConfig& c, Task task, int64_t seed) {
  require_task(c, task);
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  b.set_quantization(c.quantization);  // QLoRA: 4-bit linear weights from the start
  b.set_bf16_linears(c.bf16_linears);  // LoRA over a bf16 base: bf16 from the start
  Llama m = make_llama(b, c);
  const int64_t C = c.hidden_size;

  std::string ids = token_input(b, "input_ids");
  std::string mask = token_input(b, "attention_mask");
  std::string h = m.decode(ids, mask);  // (B,T,C)

  if (task == Task::Base) {
    b.set_scope("");
    b.op("Identity", {h}, {}, "last_hidden_state");
    b.output("last_hidden_state", DType::Float32, {-1, -1, C});
    return finish_model(b, c, task);
  }
  if (task == Task::SequenceClassification) {
    // score on the last non-padding token: the last position whose input_ids != pad_token_id
    // (Transformers 5: argmax of position * non_pad), every last position without a pad id.
    std::string logits_all =
        b.linear(h, "score", C, c.num_labels, m.weight_init(), false);  // (B,T,L)
    b.set_scope("score");
    std::string idx;
    if (c.pad_token_id >= 0) {
      std::string t = b.op("Squeeze", {b.dim_of(ids, 1), b.const_i64({0})});
      std::string r = b.op("Range", {b.scalar_i64(0), t, b.scalar_i64(1)});  // (T)
      std::string keep =
          b.op("Cast", {b.op("Not", {b.op("Equal", {ids, b.scalar_i64(c.pad_token_id)})})},
               {{"to", Attr::of_int((int64_t)DType::Int64)}});
      idx = b.op("ArgMax", {b.op("Mul", {keep, r})},
                 {{"axis", Attr::of_int(1)}, {"keepdims", Attr::of_int(1)}});  // (B,1)
    } else {
      std::string t = b.dim_of(ids, 1);
      idx =
          b.op("Unsqueeze", {b.op("Sub", {b.op("Squeeze", {t, b.const_i64({0})}), b.scalar_i64(1)}),
                             b.const_i64({0, 1})});  // (1,1): T-1 for every row
      idx = b.op("Expand", {idx, b.op("Concat", {b.dim_of(ids, 0), b.const_i64({1})},
                                      {{"axis", Attr::of_int(0)}})});
    }
    // (B,1) -> (B,1,L) indices for GatherElements along T
    std::string idx3 =
        b.op("Expand", {b.op("Unsqueeze", {idx, b.const_i64({2})}),
                        b.op("Concat", {b.dim_of(ids, 0), b.const_i64({1, c.num_labels})},
                             {{"axis", Attr::of_int(0)}})});
    std::string pooled = b.op("GatherElements", {logits_all, idx3}, {{"axis", Attr::of_int(1)}});
    b.op("Reshape", {pooled, b.const_i64({-1, c.num_labels})}, {}, "logits");
    b.output("logits", DType::Float32, {-1, c.num_labels});
    return finish_model(b, c, task);
  }
  return finish_causal_lm(b, c, h, "model.embed_tokens.weight",
                          m.weight_init());  // logits, the shifted loss
}

}  // namespace onyx::models
