// seq2seq.cc — encoder–decoders with BART's layer, as Transformers' ...ForConditionalGeneration:
//   bart     post-LayerNorm; one token table (model.shared) for both stacks and the LM head,
//            scaled by sqrt(d_model) when scale_embedding; learned positions offset by 2; a
//            LayerNorm on each stack's embeddings; logits + final_logits_bias (a buffer: frozen).
//   whisper  pre-LayerNorm with a final LayerNorm per stack; the encoder reads log-mel features
//            (B, num_mel_bins, 2 * max_source_positions) through two Conv1d (the second of
//            stride 2) with GELU, plus sinusoidal positions that are not trained; k_proj has no
//            bias; proj_out is the decoder's token table.
// The decoder reads decoder_input_ids: a batch without them gets labels shifted right (the start
// token first, -100 read as pad_token_id: shift_tokens_right) from default_input_filler, as the
// models' forward does. The loss is the mean cross entropy of every position's logits against
// labels (-100 ignored), as their forward computes it.
//
// B batch, S encoder positions, T decoder positions, C d_model, F ffn, V vocabulary, M mel bins.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct EncoderDecoder {
  GraphBuilder& b;
  const HfConfig& c;
  bool whisper;  // else bart
  // The decoder with a key/value cache (build_hf_decoder_with_past's interface): position_ids,
  // the additive mask of attention_mask over cache slots and new tokens, and per layer the
  // cross-attention's keys and values as inputs (build_seq2seq_encoder's outputs).
  bool with_past = false;
  std::string position_ids, self_pad;
  int64_t decoder_layers = -1;  // the decoder's layers built (-1: all)
  // per decoder layer (with_past): its cross-attention's probabilities (B,nh,T,S)
  std::vector<std::string> cross_probs;

  Init w() const { return Init::normal(c.initializer_range); }

  // BartAttention / WhisperAttention: queries from x (B,T,C), keys and values from kv (B,S,C)
  // (x itself for self-attention); mask additive (B,1,1,S) or ""; causal (T,T) bool or "".
  std::string attention(const std::string& p, const std::string& x, const std::string& kv,
                        int64_t nh, const std::string& mask, const std::string& causal) {
    const int64_t hs = c.hidden_size / nh;
    std::string q = queries(p, x, nh);
    auto [kt, v] = keys_values(p, kv, nh);
    b.set_scope(p);
    return out_proj(p, attend(q, kt, v, hs, mask, causal));
  }

  // q_proj, as heads (B,nh,T,hs); Whisper scales the queries, BART the scores (attend), by
  // head_size^-0.5: the same per element.
  std::string queries(const std::string& p, const std::string& x, int64_t nh) {
    const int64_t C = c.hidden_size, hs = C / nh;
    std::string q = b.split_heads(b.linear(x, p + ".q_proj", C, C, w()), nh, hs);
    if (!whisper) return q;
    return b.op("Mul", {q, b.scalar_f32((float)std::pow((double)hs, -0.5))});
  }

  // k_proj (no bias in Whisper) and v_proj of kv (B,S,C): keys transposed (B,nh,hs,S), values
  // (B,nh,S,hs).
  std::pair<std::string, std::string> keys_values(const std::string& p, const std::string& kv,
                                                  int64_t nh) {
    const int64_t C = c.hidden_size, hs = C / nh;
    std::string k = b.linear(kv, p + ".k_proj", C, C, w(), /*bias=*/!whisper);
    std::string v = b.linear(kv, p + ".v_proj", C, C, w());
    b.set_scope(p);
    return {b.split_heads_transposed(k, nh, hs), b.split_heads(v, nh, hs)};
  }

  // softmax(q kt [* scale] [causal] [+ mask]) v, dropout on the probabilities. -> (B,nh,T,hs);
  // `probs` (when given) names the probabilities.
  std::string attend(const std::string& q, const std::string& kt, const std::string& v, int64_t hs,
                     const std::string& mask, const std::string& causal,
                     std::string* probs = nullptr) {
    std::string s = b.op("MatMul", {q, kt});  // (B,nh,T,S)
    if (!whisper) s = b.op("Mul", {s, b.scalar_f32((float)std::pow((double)hs, -0.5))});
    if (!causal.empty()) s = b.op("Where", {causal, s, b.scalar_f32(kMaskValue)});
    if (!mask.empty()) s = b.op("Add", {s, mask});
    s = b.op("Softmax", {s}, {{"axis", Attr::of_int(-1)}});
    if (probs) *probs = s;
    s = b.dropout(s, c.attention_probs_dropout_prob);
    return b.op("MatMul", {s, v});
  }

  // heads (B,nh,T,hs) merged and through out_proj. -> (B,T,C)
  std::string out_proj(const std::string& p, const std::string& y) {
    const int64_t C = c.hidden_size;
    return b.linear(b.merge_heads(y, C), p + ".out_proj", C, C, w());
  }

  // fc1 -> activation -> activation dropout -> fc2. (B,T,C) -> (B,T,C)
  std::string ffn(const std::string& p, const std::string& x, int64_t F) {
    const int64_t C = c.hidden_size;
    std::string h = b.activation(b.linear(x, p + ".fc1", C, F, w()), c.hidden_act);
    h = b.dropout(h, c.s2s.activation_dropout);
    return b.linear(h, p + ".fc2", F, C, w());
  }

  // One residual sub-layer: x + dropout(f(LN(x))) (Whisper) or LN(x + dropout(f(x))) (BART).
  template <class F>
  std::string residual(const std::string& p, const std::string& ln, const std::string& x, F f) {
    const int64_t C = c.hidden_size;
    const double eps = c.layer_norm_eps;
    std::string y =
        b.dropout(f(whisper ? b.layer_norm(x, p + "." + ln, C, eps) : x), c.hidden_dropout_prob);
    b.set_scope(p);
    std::string sum = b.op("Add", {x, y});
    return whisper ? sum : b.layer_norm(sum, p + "." + ln, C, eps);
  }

  std::string encoder_layer(const std::string& p, const std::string& h, const std::string& mask) {
    std::string x = residual(p, "self_attn_layer_norm", h, [&](const std::string& in) {
      return attention(p + ".self_attn", in, in, c.num_attention_heads, mask, "");
    });
    return residual(p, "final_layer_norm", x,
                    [&](const std::string& in) { return ffn(p, in, c.intermediate_size); });
  }

  // causal: (T,T), or with a cache cached_causal_mask's (S, P+S).
  std::string decoder_layer(const std::string& p, int64_t layer, const std::string& h,
                            const std::string& enc, const std::string& causal,
                            const std::string& enc_mask) {
    const int64_t nh = c.s2s.decoder_attention_heads;
    std::string x = residual(p, "self_attn_layer_norm", h, [&](const std::string& in) {
      if (with_past) return cached_self_attention(p + ".self_attn", layer, in, nh, causal);
      return attention(p + ".self_attn", in, in, nh, "", causal);
    });
    x = residual(p, "encoder_attn_layer_norm", x, [&](const std::string& in) {
      if (with_past) return cached_cross_attention(p + ".encoder_attn", layer, in, nh, enc_mask);
      return attention(p + ".encoder_attn", in, enc, nh, enc_mask, "");
    });
    return residual(p, "final_layer_norm", x,
                    [&](const std::string& in) { return ffn(p, in, c.s2s.decoder_ffn_dim); });
  }

  // Self-attention over the cache and the new tokens (cached_attention: past_keys.<layer>, ...).
  std::string cached_self_attention(const std::string& p, int64_t layer, const std::string& x,
                                    int64_t nh, const std::string& causal) {
    const int64_t C = c.hidden_size, hs = C / nh;
    std::string q = b.split_heads(b.linear(x, p + ".q_proj", C, C, w()), nh, hs);
    std::string k = b.split_heads(b.linear(x, p + ".k_proj", C, C, w(), !whisper), nh, hs);
    std::string v = b.split_heads(b.linear(x, p + ".v_proj", C, C, w()), nh, hs);
    b.set_scope(p);
    return out_proj(p, cached_attention(b, layer, q, k, v, nh, nh, hs, false, causal, self_pad));
  }

  // Cross-attention over the encoder's keys and values, inputs cross_keys.<layer> (B,nh,hs,S)
  // and cross_values.<layer> (B,nh,S,hs).
  std::string cached_cross_attention(const std::string& p, int64_t layer, const std::string& x,
                                     int64_t nh, const std::string& enc_mask) {
    const int64_t hs = c.hidden_size / nh;
    std::string q = queries(p, x, nh);
    std::string kt = b.input(cat("cross_keys.", layer), DType::Float32, {-1, nh, hs, -1},
                             {"batch_size", "", "", "encoder_length"});
    std::string v = b.input(cat("cross_values.", layer), DType::Float32, {-1, nh, -1, hs},
                            {"batch_size", "", "encoder_length", ""});
    b.set_scope(p);
    cross_probs.resize((size_t)c.s2s.decoder_layers);
    return out_proj(p, attend(q, kt, v, hs, enc_mask, "", &cross_probs[(size_t)layer]));
  }

  // BART's token table (model.shared), scaled when scale_embedding. ids (B,T) -> (B,T,C)
  std::string bart_tokens(const std::string& ids) {
    b.set_scope("model.shared");
    std::string x = b.gather_rows_padded("model.shared.weight", ids, c.pad_token_id);
    if (!c.s2s.scale_embedding) return x;
    return b.op("Mul", {x, b.scalar_f32((float)std::sqrt((double)c.hidden_size))});
  }

  // BartLearnedPositionalEmbedding: rows 2..T+1 of the table (T,C), or with a cache the rows
  // of position_ids + 2 (B,T,C).
  std::string bart_positions(const std::string& p, const std::string& ids) {
    std::string table =
        b.param(p + ".embed_positions.weight", {c.max_position_embeddings + 2, c.hidden_size}, w());
    b.set_scope(p + ".embed_positions");
    if (with_past) return b.gather_rows(table, b.op("Add", {position_ids, b.scalar_i64(2)}));
    std::string end = b.op("Add", {b.dim_of(ids, 1), b.const_i64({2})});
    return b.op("Slice", {table, b.const_i64({2}), end, b.const_i64({0})});
  }

  // BART's embeddings: tokens + positions, LayerNorm, dropout. ids (B,T) -> (B,T,C)
  std::string bart_embeddings(const std::string& p, const std::string& ids) {
    std::string x = b.op("Add", {bart_tokens(ids), bart_positions(p, ids)});
    x = b.layer_norm(x, p + ".layernorm_embedding", c.hidden_size, c.layer_norm_eps);
    return b.dropout(x, c.embd_pdrop);
  }

  // Whisper's front end: gelu(conv1), gelu(conv2 stride 2), + positions (not trained).
  // features (B,M,2S) -> (B,S,C)
  std::string whisper_features(const std::string& features) {
    const int64_t C = c.hidden_size, M = c.s2s.num_mel_bins;
    auto conv = [&](const std::string& x, const std::string& name, int64_t in, int64_t stride) {
      std::string wt = b.param(name + ".weight", {C, in, 3}, w());
      std::string bias = b.param(name + ".bias", {C}, Init::zeros());
      b.set_scope(name);
      std::string y = b.op("Conv", {x, wt, bias},
                           {{"kernel_shape", Attr::of_ints({3})},
                            {"pads", Attr::of_ints({1, 1})},
                            {"strides", Attr::of_ints({stride})}});
      return b.activation(y, "gelu");  // nn.functional.gelu, whatever activation_function says
    };
    std::string x = conv(features, "model.encoder.conv1", M, 1);
    x = conv(x, "model.encoder.conv2", C, 2);  // (B,C,S)
    x = b.op("Transpose", {x}, {{"perm", Attr::of_ints({0, 2, 1})}});
    std::string pos = "model.encoder.embed_positions.weight";
    b.graph().add_initializer(pos, sinusoids(c.s2s.max_source_positions, C));
    b.set_scope("model.encoder");
    return b.dropout(b.op("Add", {x, pos}), c.embd_pdrop);
  }

  // Whisper's sinusoids(length, channels): sin then cos of t * 10000^(-i / (channels/2 - 1)).
  static Tensor sinusoids(int64_t length, int64_t channels) {
    Tensor t = Tensor::zeros(DType::Float32, {length, channels});
    const int64_t half = channels / 2;
    const double inc = std::log(10000.0) / (double)std::max<int64_t>(half - 1, 1);
    float* p = t.data<float>();
    for (int64_t i = 0; i < length; i++)
      for (int64_t j = 0; j < half; j++) {
        const float a = (float)i * (float)std::exp(-inc * (double)j);
        p[i * channels + j] = std::sin(a);
        p[i * channels + half + j] = std::cos(a);
      }
    return t;
  }

  // The causal mask of the decoder's self-attention: (T,T) bool, true on and below the diagonal.
  std::string causal_mask(const std::string& ids) {
    b.set_scope("model.decoder.causal_mask");
    std::string t = b.dim_of(ids, 1);
    Tensor one = Tensor::from_vector<float>(DType::Float32, {1}, {1.0f});
    std::string ones =
        b.op("ConstantOfShape", {b.op("Concat", {t, t}, {{"axis", Attr::of_int(0)}})},
             {{"value", Attr::of_tensor(one)}});
    std::string lower = b.op("Trilu", {ones}, {{"upper", Attr::of_int(0)}});
    return b.op("Cast", {lower}, {{"to", Attr::of_int((int64_t)DType::Bool)}});
  }

  // The encoder: (B,S,C) hidden states and the additive mask of its padding ("" for Whisper).
  std::pair<std::string, std::string> encode() {
    std::string h, mask;
    if (whisper) {
      const int64_t frames = 2 * c.s2s.max_source_positions;
      h = whisper_features(b.input("input_features", DType::Float32,
                                   {-1, c.s2s.num_mel_bins, frames}, {"batch_size", "", ""}));
    } else {
      std::string ids = token_input(b, "input_ids");
      mask = additive_attention_mask(b, token_input(b, "attention_mask"));
      h = bart_embeddings("model.encoder", ids);
    }
    for (int64_t i = 0; i < c.num_hidden_layers; i++)
      h = encoder_layer(cat("model.encoder.layers.", i), h, mask);
    if (whisper) h = b.layer_norm(h, "model.encoder.layer_norm", c.hidden_size, c.layer_norm_eps);
    return {h, mask};
  }

  // The decoder over decoder_input_ids (B,T): (B,T,C) hidden states.
  std::string decode(const std::string& ids, const std::string& enc, const std::string& enc_mask) {
    const int64_t C = c.hidden_size;
    std::string h;
    if (whisper) {
      std::string tok = b.param("model.decoder.embed_tokens.weight", {c.vocab_size, C},
                                Init::normal(c.initializer_range, c.pad_token_id));
      b.set_scope("model.decoder.embed_tokens");
      tok = b.gather_rows_padded(tok, ids, c.pad_token_id);
      std::string pos =
          b.param("model.decoder.embed_positions.weight", {c.max_position_embeddings, C}, w());
      b.set_scope("model.decoder.embed_positions");
      pos = with_past ? b.gather_rows(pos, position_ids) : b.leading_rows(pos, ids, 1);
      h = b.dropout(b.op("Add", {tok, pos}), c.embd_pdrop);
    } else {
      h = bart_embeddings("model.decoder", ids);
    }
    std::string causal =
        with_past ? cached_causal_mask(
                        b, "past_values.0",  // declared by layer 0's self-attention
                        b.input("cache_position", DType::Int64, {-1}, {"sequence_length"}), 0)
                  : causal_mask(ids);
    const int64_t layers = decoder_layers < 0 ? c.s2s.decoder_layers : decoder_layers;
    for (int64_t i = 0; i < layers; i++)
      h = decoder_layer(cat("model.decoder.layers.", i), i, h, enc, causal, enc_mask);
    if (whisper && layers == c.s2s.decoder_layers)
      h = b.layer_norm(h, "model.decoder.layer_norm", C, c.layer_norm_eps);
    return h;
  }
};

}  // namespace

BuiltModel build_seq2seq(const HfConfig& c, Task task, int64_t seed) {
  require_task(c, task);
  const bool whisper = c.model_type == "whisper";
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  EncoderDecoder m{b, c, whisper};
  const std::string shared = "model.shared.weight";
  if (!whisper)  // the one token table, first in Transformers' parameter order
    b.param(shared, {c.vocab_size, c.hidden_size},
            Init::normal(c.initializer_range, c.pad_token_id));
  auto [enc, enc_mask] = m.encode();
  std::string ids = token_input(b, "decoder_input_ids");
  std::string h = m.decode(ids, enc, enc_mask);
  std::string table = whisper ? "model.decoder.embed_tokens.weight" : shared;
  std::string bias;
  if (!whisper) bias = b.param("final_logits_bias", {1, c.vocab_size}, Init::zeros());
  seq2seq_lm_head(b, c, h, table, bias);

  BuiltModel out = finish_model(b, c, task);
  if (whisper) {
    out.tied.push_back({"proj_out.weight", table});
    out.model.frozen.insert("model.encoder.embed_positions.weight");  // requires_grad_(False)
  } else {
    for (const char* t : {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                          "lm_head.weight"})
      out.tied.push_back({t, shared});
    out.model.frozen.insert("final_logits_bias");  // a buffer
  }
  return out;
}

// The encoder for generation: its inputs as build_seq2seq's, outputs every decoder layer's
// cross-attention keys "cross_keys.<l>" (B,nh,hs,S) and values "cross_values.<l>" (B,nh,S,hs),
// computed once per input.
BuiltModel build_seq2seq_encoder(const HfConfig& c, int64_t seed) {
  const bool whisper = c.model_type == "whisper";
  GraphBuilder b(architecture_name(c.model_type, Task::Seq2SeqLM) + "Encoder", (uint64_t)seed);
  EncoderDecoder m{b, c, whisper};
  if (!whisper)
    b.param("model.shared.weight", {c.vocab_size, c.hidden_size},
            Init::normal(c.initializer_range, c.pad_token_id));
  std::string enc = m.encode().first;
  const int64_t nh = c.s2s.decoder_attention_heads, hs = c.hidden_size / nh;
  for (int64_t l = 0; l < c.s2s.decoder_layers; l++) {
    auto [kt, v] = m.keys_values(cat("model.decoder.layers.", l, ".encoder_attn"), enc, nh);
    cross_kv_outputs(b, l, kt, v, nh, hs);
  }
  return finish_encoder(b, c);
}

// The decoder with a key/value cache (build_hf_decoder_with_past's interface, input_ids being
// the decoder's tokens) plus cross_keys.<l> / cross_values.<l> from build_seq2seq_encoder and,
// for BART, encoder_attention_mask (B,S).
// The decoder-with-past's inputs and its layers (m.decoder_layers of them) over input_ids: (B,S,C).
static std::string decode_with_past(GraphBuilder& b, EncoderDecoder& m) {
  const HfConfig& c = m.c;
  if (!m.whisper)
    b.param("model.shared.weight", {c.vocab_size, c.hidden_size},
            Init::normal(c.initializer_range, c.pad_token_id));
  std::string ids = token_input(b, "input_ids");
  m.self_pad = additive_attention_mask(b, cached_attention_mask_input(b));
  m.position_ids = token_input(b, "position_ids");
  std::string enc_mask;
  if (!m.whisper)
    enc_mask = additive_attention_mask(b, b.input("encoder_attention_mask", DType::Int64, {-1, -1},
                                                  {"batch_size", "encoder_length"}));
  return m.decode(ids, "", enc_mask);
}

BuiltModel build_seq2seq_with_past(const HfConfig& c, int64_t seed) {
  const bool whisper = c.model_type == "whisper";
  GraphBuilder b(architecture_name(c.model_type, Task::Seq2SeqLM) + "DecoderWithPast",
                 (uint64_t)seed);
  EncoderDecoder m{b, c, whisper, true};
  const std::string shared = "model.shared.weight";
  std::string h = decode_with_past(b, m);  // (B,S,C)
  b.set_scope(whisper ? "proj_out" : "lm_head");
  std::string s = b.op("Squeeze", {b.dim_of(h, 1), b.const_i64({0})});
  std::string last =
      b.op("Gather", {h, b.op("Sub", {s, b.scalar_i64(1)})}, {{"axis", Attr::of_int(1)}});
  std::string table = whisper ? "model.decoder.embed_tokens.weight" : shared;
  std::string bias;
  if (!whisper) bias = b.param("final_logits_bias", {1, c.vocab_size}, Init::zeros());
  tied_projection(b, last, table, bias, "logits");  // (B,V) (+ (1,V))
  b.output("logits", DType::Float32, {-1, c.vocab_size});
  BuiltModel out = finish_model(b, c, Task::Base);
  out.task = Task::Seq2SeqLM;
  out.model.predictions = "logits";
  if (whisper)
    out.tied.push_back({"proj_out.weight", table});
  else
    out.tied.push_back({"lm_head.weight", shared});
  return out;
}

// The decoder-with-past's inputs through the last layer `heads` names; output "cross_attentions"
// (B, heads, S, encoder_length): the cross-attention probabilities of each (layer, head) in
// `heads`, in that order.
BuiltModel build_seq2seq_cross_attentions(const HfConfig& c,
                                          const std::vector<std::pair<int64_t, int64_t>>& heads) {
  ONYX_CHECK(!heads.empty(), "cross-attention weights: no (layer, head) pairs");
  const int64_t nh = c.s2s.decoder_attention_heads;
  int64_t last = 0;
  for (auto [layer, head] : heads) {
    ONYX_CHECK(layer >= 0 && layer < c.s2s.decoder_layers && head >= 0 && head < nh,
               "alignment head [", layer, ", ", head, "] is not one of the model's (",
               c.s2s.decoder_layers, " decoder layers of ", nh, " heads)");
    last = std::max(last, layer);
  }
  GraphBuilder b(architecture_name(c.model_type, Task::Seq2SeqLM) + "CrossAttentions", 0);
  EncoderDecoder m{b, c, c.model_type == "whisper", true};
  m.decoder_layers = last + 1;
  decode_with_past(b, m);
  b.set_scope("cross_attentions");
  std::vector<std::string> picked;
  for (auto [layer, head] : heads)  // (B,nh,T,S) -> (B,1,T,S)
    picked.push_back(b.op("Gather", {m.cross_probs[(size_t)layer], b.const_i64({head})},
                          {{"axis", Attr::of_int(1)}}));
  b.op("Concat", picked, {{"axis", Attr::of_int(1)}}, "cross_attentions");
  b.output("cross_attentions", DType::Float32, {-1, (int64_t)heads.size(), -1, -1});
  return finish_encoder(b, c);
}

}  // namespace onyx::models
