// t5.cc — T5ForConditionalGeneration (t5, and mt5 / T5 v1.1's gated-GELU feed-forward) as
// Transformers 5 builds it: pre-norm blocks with T5LayerNorm (x * rsqrt(mean(x^2) + eps) * weight:
// no mean, no bias), attention without biases and without score scaling, a learned relative
// position bias (buckets of key - query distance, log-spaced past num_buckets / 2; bidirectional
// in the encoder, causal in the decoder) computed by each stack's first block and added to every
// block's scores; one token table (shared.weight) for both stacks and the LM head (Transformers 5
// ties them always), the decoder output scaled by d_model^-0.5 unless the config says otherwise
// (scale_decoder_outputs, else tie_word_embeddings: false). Labels shift into decoder_input_ids
// with decoder_start_token_id (= pad) as build_seq2seq's models; the loss is the mean cross
// entropy.
//
// The position bias is trained, and onyx.Attention gives its additive mask no gradient, so the
// scores take the bias and the padding / causal mask as two Adds, which attention_fusion leaves
// alone (cross-attention, mask only, fuses).
//
// B batch, S encoder positions, T decoder positions, C d_model, H heads, D d_kv, F d_ff.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct T5 {
  GraphBuilder& b;
  const HfConfig& c;

  int64_t heads() const { return c.num_attention_heads; }
  int64_t inner() const { return c.num_attention_heads * c.head_dim; }
  Init normal(double std) const { return Init::normal(c.initializer_range * std); }

  // T5LayerNorm: RMS, no bias. (..., C) -> (..., C)
  std::string norm(const std::string& x, const std::string& name) {
    return b.rms_norm(x, name, c.hidden_size, c.layer_norm_eps);
  }

  // T5Attention: queries from x (B,T,C), keys and values from kv (B,S,C); scores + bias (the
  // position bias, or "") + mask (additive, or ""), no scaling. -> (B,T,C)
  std::string attention(const std::string& p, const std::string& x, const std::string& kv,
                        const std::string& bias, const std::string& mask) {
    std::string q = queries(p, x);
    auto [kt, v] = keys_values(p, kv);
    return out(p, attend(q, kt, v, bias, mask));
  }

  // q of x (B,T,C) as heads (B,H,T,D).
  std::string queries(const std::string& p, const std::string& x) {
    const int64_t C = c.hidden_size, D = c.head_dim;
    std::string q = b.linear(x, p + ".q", C, inner(), normal(std::pow((double)C * D, -0.5)), false);
    b.set_scope(p);
    return b.split_heads(q, heads(), D);
  }

  // softmax(q kt + bias + mask) v, dropout on the probabilities: q (B,H,T,D), kt (B,H,D,S),
  // v (B,H,S,D) -> (B,H,T,D)
  std::string attend(const std::string& q, const std::string& kt, const std::string& v,
                     const std::string& bias, const std::string& mask) {
    std::string s = b.op("MatMul", {q, kt});
    if (!bias.empty()) s = b.op("Add", {s, bias});
    if (!mask.empty()) s = b.op("Add", {s, mask});
    s = b.op("Softmax", {s}, {{"axis", Attr::of_int(-1)}});
    return b.op("MatMul", {b.dropout(s, c.hidden_dropout_prob), v});
  }

  // heads (B,H,T,D) merged, through o. -> (B,T,C)
  std::string out(const std::string& p, const std::string& y) {
    return b.linear(b.merge_heads(y, inner()), p + ".o", inner(), c.hidden_size,
                    normal(std::pow((double)inner(), -0.5)), false);
  }

  // k and v of x (B,S,C) as heads: keys transposed (B,H,D,S), values (B,H,S,D).
  std::pair<std::string, std::string> keys_values(const std::string& p, const std::string& x) {
    const int64_t C = c.hidden_size, H = heads(), D = c.head_dim;
    std::string k = b.linear(x, p + ".k", C, inner(), normal(std::pow((double)C, -0.5)), false);
    std::string v = b.linear(x, p + ".v", C, inner(), normal(std::pow((double)C, -0.5)), false);
    b.set_scope(p);
    return {b.split_heads_transposed(k, H, D), b.split_heads(v, H, D)};
  }

  // T5DenseActDense / T5DenseGatedActDense. (B,T,C) -> (B,T,C)
  std::string ffn(const std::string& p, const std::string& x) {
    const int64_t C = c.hidden_size, F = c.intermediate_size;
    const Init in = normal(std::pow((double)C, -0.5)), out = normal(std::pow((double)F, -0.5));
    std::string h;
    if (c.s2s.gated_ffn) {
      std::string g = b.activation(b.linear(x, p + ".wi_0", C, F, in, false), c.hidden_act);
      std::string l = b.linear(x, p + ".wi_1", C, F, in, false);
      b.set_scope(p);
      h = b.op("Mul", {g, l});
    } else {
      h = b.activation(b.linear(x, p + ".wi", C, F, in, false), c.hidden_act);
    }
    return b.linear(b.dropout(h, c.hidden_dropout_prob), p + ".wo", F, C, out, false);
  }

  // x + dropout(f(norm(x))): every T5 sub-layer.
  template <class Fn>
  std::string sublayer(const std::string& p, const std::string& x, Fn f) {
    std::string y = b.dropout(f(norm(x, p + ".layer_norm")), c.hidden_dropout_prob);
    b.set_scope(p);
    return b.op("Add", {x, y});
  }

  // 0..n-1 (1-D int64), n = like.shape[axis]. Folds at plan time.
  std::string positions(const std::string& like, int64_t axis) {
    std::string n = b.op("Squeeze", {b.dim_of(like, axis), b.const_i64({0})});
    return b.op("Range", {b.scalar_i64(0), n, b.scalar_i64(1)});
  }

  // T5Attention._relative_position_bucket of key position - query position over the 1-D
  // positions (T) and (S) -> (T,S), in int64 with the large distances' log in float32 as there.
  std::string buckets(const std::string& queries, const std::string& keys, bool bidirectional) {
    std::string rel = b.op("Sub", {b.op("Unsqueeze", {keys, b.const_i64({0})}),
                                   b.op("Unsqueeze", {queries, b.const_i64({1})})});
    int64_t n = c.s2s.relative_buckets;
    std::string out = b.scalar_i64(0);
    if (bidirectional) {
      n /= 2;
      std::string after = b.op("Cast", {b.op("Greater", {rel, b.scalar_i64(0)})},
                               {{"to", Attr::of_int((int64_t)DType::Int64)}});
      out = b.op("Mul", {after, b.scalar_i64(n)});
      rel = b.op("Abs", {rel});
    } else {
      rel = b.op("Neg", {b.op("Min", {rel, b.scalar_i64(0)})});
    }
    const int64_t exact = n / 2;
    std::string f = b.op("Cast", {b.op("Max", {rel, b.scalar_i64(1)})},  // (log(0): not used)
                         {{"to", Attr::of_int((int64_t)DType::Float32)}});
    f = b.op("Log", {b.op("Div", {f, b.scalar_f32((float)exact)})});
    f = b.op(
        "Div",
        {f, b.scalar_f32((float)std::log((double)c.s2s.relative_max_distance / (double)exact))});
    f = b.op("Mul", {f, b.scalar_f32((float)(n - exact))});
    std::string large = b.op(
        "Add",
        {b.scalar_i64(exact), b.op("Cast", {f}, {{"to", Attr::of_int((int64_t)DType::Int64)}})});
    large = b.op("Min", {large, b.scalar_i64(n - 1)});
    std::string small = b.op("Less", {rel, b.scalar_i64(exact)});
    return b.op("Add", {out, b.op("Where", {small, rel, large})});
  }

  // The first block's relative_attention_bias table read at the buckets of the query and key
  // positions (1-D): (1,H,T,S).
  std::string position_bias(const std::string& p, const std::string& queries,
                            const std::string& keys, bool bidirectional) {
    std::string table =
        b.param(p + ".relative_attention_bias.weight", {c.s2s.relative_buckets, heads()},
                normal(std::pow((double)c.hidden_size, -0.5)));
    b.set_scope(p + ".relative_attention_bias");
    std::string v = b.gather_rows(table, buckets(queries, keys, bidirectional));  // (T,S,H)
    v = b.op("Transpose", {v}, {{"perm", Attr::of_ints({2, 0, 1})}});
    return b.op("Unsqueeze", {v, b.const_i64({0})});
  }

  // The encoder over input_ids (B,S) with its padding mask (B,1,1,S). -> (B,S,C)
  std::string encode(const std::string& ids, const std::string& mask) {
    b.set_scope("encoder.embed_tokens");
    std::string h = b.dropout(b.gather_rows("shared.weight", ids), c.hidden_dropout_prob);
    std::string bias;
    for (int64_t i = 0; i < c.num_hidden_layers; i++) {
      const std::string p = cat("encoder.block.", i, ".layer.");
      if (i == 0) {
        std::string pos = positions(ids, 1);
        bias = position_bias(p + "0.SelfAttention", pos, pos, true);
      }
      h = sublayer(p + "0", h, [&](const std::string& x) {
        return attention(p + "0.SelfAttention", x, x, bias, mask);
      });
      h = sublayer(p + "1", h,
                   [&](const std::string& x) { return ffn(p + "1.DenseReluDense", x); });
    }
    return b.dropout(norm(h, "encoder.final_layer_norm"), c.hidden_dropout_prob);
  }

  // Self-attention over the cache (inputs past_keys.<l> (B,H,D,P), past_values.<l> (B,H,P,D))
  // and the new tokens, whose keys and values are the outputs new_keys.<l> / new_values.<l>.
  std::string cached_self_attention(const std::string& p, int64_t l, const std::string& x,
                                    const std::string& bias, const std::string& mask) {
    const int64_t H = heads(), D = c.head_dim;
    std::string q = queries(p, x);
    auto [kt, v] = keys_values(p, x);  // the new tokens': (B,H,D,S), (B,H,S,D)
    new_kv_outputs(b, l, b.op("Transpose", {kt}, {{"perm", Attr::of_ints({0, 1, 3, 2})}}), v, H, D);
    std::string pk = b.input(cat("past_keys.", l), DType::Float32, {-1, H, D, -1},
                             {"batch_size", "", "", "past_length"});
    std::string pv = b.input(cat("past_values.", l), DType::Float32, {-1, H, -1, D},
                             {"batch_size", "", "past_length", ""});
    std::string kts = b.op("Concat", {pk, kt}, {{"axis", Attr::of_int(-1)}});
    std::string vs = b.op("Concat", {pv, v}, {{"axis", Attr::of_int(2)}});
    return out(p, attend(q, kts, vs, bias, mask));
  }

  // Cross-attention over the encoder's keys and values (inputs cross_keys.<l> (B,H,D,S),
  // cross_values.<l> (B,H,S,D)).
  std::string cached_cross_attention(const std::string& p, int64_t l, const std::string& x,
                                     const std::string& mask) {
    const int64_t H = heads(), D = c.head_dim;
    std::string q = queries(p, x);
    std::string kt = b.input(cat("cross_keys.", l), DType::Float32, {-1, H, D, -1},
                             {"batch_size", "", "", "encoder_length"});
    std::string v = b.input(cat("cross_values.", l), DType::Float32, {-1, H, -1, D},
                            {"batch_size", "", "encoder_length", ""});
    return out(p, attend(q, kt, v, "", mask));
  }

  // The decoder over a key/value cache (build_hf_decoder_with_past's interface): input_ids (B,S)
  // at cache_position (S); attention_mask (B,P+S) over the cache slots and the new tokens;
  // encoder_attention_mask (B,S_enc). -> (B,S,C)
  std::string decode_with_past(const std::string& ids) {
    std::string cache_pos = b.input("cache_position", DType::Int64, {-1}, {"sequence_length"});
    std::string pad = additive_attention_mask(b, cached_attention_mask_input(b));  // (B,1,1,P+S)
    std::string enc_mask =
        additive_attention_mask(b, b.input("encoder_attention_mask", DType::Int64, {-1, -1},
                                           {"batch_size", "encoder_length"}));
    std::string causal = cached_causal_mask(b, "past_values.0", cache_pos, 0);  // (S,P+S)
    b.set_scope("decoder.cache_mask");
    std::string mask =
        b.op("Add", {pad, b.op("Where", {causal, b.scalar_f32(0.0f), b.scalar_f32(kMaskValue)})});
    std::string slots =
        b.op("Concat", {positions("past_values.0", 2), cache_pos}, {{"axis", Attr::of_int(0)}});
    b.set_scope("decoder.embed_tokens");
    std::string h = b.gather_rows("shared.weight", ids);
    std::string bias;
    for (int64_t i = 0; i < c.s2s.decoder_layers; i++) {
      const std::string p = cat("decoder.block.", i, ".layer.");
      if (i == 0) bias = position_bias(p + "0.SelfAttention", cache_pos, slots, false);
      h = sublayer(p + "0", h, [&](const std::string& x) {
        return cached_self_attention(p + "0.SelfAttention", i, x, bias, mask);
      });
      h = sublayer(p + "1", h, [&](const std::string& x) {
        return cached_cross_attention(p + "1.EncDecAttention", i, x, enc_mask);
      });
      h = sublayer(p + "2", h,
                   [&](const std::string& x) { return ffn(p + "2.DenseReluDense", x); });
    }
    return norm(h, "decoder.final_layer_norm");
  }

  // The decoder over decoder_input_ids (B,T). -> (B,T,C)
  std::string decode(const std::string& ids, const std::string& enc, const std::string& enc_mask) {
    b.set_scope("decoder.embed_tokens");
    std::string h = b.dropout(b.gather_rows("shared.weight", ids), c.hidden_dropout_prob);
    b.set_scope("decoder.causal_mask");  // (T,T): 0 on and below the diagonal, min above
    std::string t = b.dim_of(ids, 1);
    Tensor one = Tensor::from_vector<float>(DType::Float32, {1}, {1.0f});
    std::string lower =
        b.op("Trilu",
             {b.op("ConstantOfShape", {b.op("Concat", {t, t}, {{"axis", Attr::of_int(0)}})},
                   {{"value", Attr::of_tensor(one)}})},
             {{"upper", Attr::of_int(0)}});
    std::string causal =
        b.op("Mul", {b.op("Sub", {b.scalar_f32(1.0f), lower}), b.scalar_f32(kMaskValue)});
    std::string bias;
    for (int64_t i = 0; i < c.s2s.decoder_layers; i++) {
      const std::string p = cat("decoder.block.", i, ".layer.");
      if (i == 0) {
        std::string pos = positions(ids, 1);
        bias = position_bias(p + "0.SelfAttention", pos, pos, false);
      }
      h = sublayer(p + "0", h, [&](const std::string& x) {
        return attention(p + "0.SelfAttention", x, x, bias, causal);
      });
      h = sublayer(p + "1", h, [&](const std::string& x) {
        return attention(p + "1.EncDecAttention", x, enc, "", enc_mask);
      });
      h = sublayer(p + "2", h,
                   [&](const std::string& x) { return ffn(p + "2.DenseReluDense", x); });
    }
    return b.dropout(norm(h, "decoder.final_layer_norm"), c.hidden_dropout_prob);
  }
};

}  // namespace

BuiltModel build_t5(const HfConfig& c, Task task, int64_t seed) {
  require_task(c, task);
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  T5 m{b, c};
  b.param("shared.weight", {c.vocab_size, c.hidden_size}, m.normal(1.0));
  std::string ids = token_input(b, "input_ids");
  std::string mask = additive_attention_mask(b, token_input(b, "attention_mask"));
  std::string enc = m.encode(ids, mask);
  std::string h = m.decode(token_input(b, "decoder_input_ids"), enc, mask);
  if (c.s2s.scale_decoder_outputs) {
    b.set_scope("lm_head");
    h = b.op("Mul", {h, b.scalar_f32((float)std::pow((double)c.hidden_size, -0.5))});
  }
  seq2seq_lm_head(b, c, h, "shared.weight", "");
  BuiltModel out = finish_model(b, c, task);
  for (const char* t :
       {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"})
    out.tied.push_back({t, "shared.weight"});
  return out;
}

// The encoder for generation: input_ids and attention_mask in, every decoder block's
// cross-attention keys "cross_keys.<l>" (B,H,D,S) and values "cross_values.<l>" (B,H,S,D) out.
BuiltModel build_t5_encoder(const HfConfig& c, int64_t seed) {
  GraphBuilder b(architecture_name(c.model_type, Task::Seq2SeqLM) + "Encoder", (uint64_t)seed);
  T5 m{b, c};
  b.param("shared.weight", {c.vocab_size, c.hidden_size}, m.normal(1.0));
  std::string ids = token_input(b, "input_ids");
  std::string enc = m.encode(ids, additive_attention_mask(b, token_input(b, "attention_mask")));
  const int64_t H = c.num_attention_heads, D = c.head_dim;
  for (int64_t l = 0; l < c.s2s.decoder_layers; l++) {
    auto [kt, v] = m.keys_values(cat("decoder.block.", l, ".layer.1.EncDecAttention"), enc);
    cross_kv_outputs(b, l, kt, v, H, D);
  }
  return finish_encoder(b, c);
}

// The decoder with a key/value cache (hf_model.h: build_hf_decoder_with_past): "logits" (B,V) of
// the last new token.
BuiltModel build_t5_with_past(const HfConfig& c, int64_t seed) {
  GraphBuilder b(architecture_name(c.model_type, Task::Seq2SeqLM) + "DecoderWithPast",
                 (uint64_t)seed);
  T5 m{b, c};
  b.param("shared.weight", {c.vocab_size, c.hidden_size}, m.normal(1.0));
  std::string h = m.decode_with_past(token_input(b, "input_ids"));
  b.set_scope("lm_head");
  std::string s = b.op("Squeeze", {b.dim_of(h, 1), b.const_i64({0})});
  std::string last =
      b.op("Gather", {h, b.op("Sub", {s, b.scalar_i64(1)})}, {{"axis", Attr::of_int(1)}});
  if (c.s2s.scale_decoder_outputs)
    last = b.op("Mul", {last, b.scalar_f32((float)std::pow((double)c.hidden_size, -0.5))});
  tied_projection(b, last, "shared.weight", "", "logits");  // (B,V)
  b.output("logits", DType::Float32, {-1, c.vocab_size});
  BuiltModel out = finish_model(b, c, Task::Base);
  out.task = Task::Seq2SeqLM;
  out.model.predictions = "logits";
  out.tied.push_back({"lm_head.weight", "shared.weight"});
  return out;
}

}  // namespace onyx::models
