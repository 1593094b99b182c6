// distilbert.cc — DistilBERT as Transformers' DistilBertModel (post-LayerNorm encoder, no token
// types, no pooler) with its heads: ...ForSequenceClassification (pre_classifier + ReLU),
// ...ForTokenClassification, ...ForMaskedLM (vocab_transform / vocab_layer_norm / tied
// vocab_projector) and the bare model.
//
// B batch, T sequence, C dim, nh n_heads, hs = C / nh, F hidden_dim, V vocabulary, L labels.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct DistilBert {
  GraphBuilder& b;
  const HfConfig& c;
  std::string prefix;  // "distilbert." or "" for the bare model

  Init weight_init() const { return Init::normal(c.initializer_range); }

  // Embeddings: word + position, LayerNorm, dropout. ids (B,T) -> (B,T,C)
  std::string embeddings(const std::string& ids) {
    std::string p = prefix + "embeddings";
    int64_t C = c.hidden_size;
    int64_t pad = c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size ? c.pad_token_id : -1;
    std::string words = b.embedding(ids, p + ".word_embeddings", c.vocab_size, C,
                                    c.initializer_range, pad);  // (B,T,C)
    std::string table = b.param(p + ".position_embeddings.weight", {c.max_position_embeddings, C},
                                Init::normal(c.initializer_range));
    b.set_scope(p + ".position_embeddings");
    std::string pos = b.leading_rows(table, ids, 1);  // rows 0..T-1: (T,C)
    b.set_scope(p);
    std::string x = b.op("Add", {words, pos});  // (B,T,C) + (T,C)
    x = b.layer_norm(x, p + ".LayerNorm", C, 1e-12);
    return b.dropout(x, c.hidden_dropout_prob);
  }

  // MultiHeadSelfAttention: q scaled by 1/sqrt(hs) before q @ k^T, padded keys filled with
  // finfo.min. h (B,T,C), pad (B,1,1,T) bool -> (B,T,C)
  std::string attention(const std::string& p, const std::string& h, const std::string& pad) {
    int64_t C = c.hidden_size, nh = c.num_attention_heads, hs = C / nh;
    std::string q = b.linear(h, p + ".q_lin", C, C, weight_init());  // (B,T,C)
    std::string k = b.linear(h, p + ".k_lin", C, C, weight_init());
    std::string v = b.linear(h, p + ".v_lin", C, C, weight_init());
    b.set_scope(p);
    q = b.split_heads(q, nh, hs);  // (B,nh,T,hs)
    q = b.op("Div", {q, b.scalar_f32((float)std::sqrt((double)hs))});
    k = b.split_heads_transposed(k, nh, hs);   // (B,nh,hs,T)
    v = b.split_heads(v, nh, hs);              // (B,nh,T,hs)
    std::string att = b.op("MatMul", {q, k});  // (B,nh,T,T)
    att = b.op("Where", {pad, b.scalar_f32(kMaskValue), att});
    att = b.op("Softmax", {att}, {{"axis", Attr::of_int(-1)}});
    att = b.dropout(att, c.attention_probs_dropout_prob);
    std::string y = b.merge_heads(b.op("MatMul", {att, v}), C);  // (B,T,C)
    return b.linear(y, p + ".out_lin", C, C, weight_init());
  }

  // TransformerBlock. (B,T,C) -> (B,T,C)
  std::string block(const std::string& p, const std::string& h, const std::string& pad) {
    int64_t C = c.hidden_size, F = c.intermediate_size;
    std::string a = attention(p + ".attention", h, pad);
    b.set_scope(p);
    a = b.layer_norm(b.op("Add", {a, h}), p + ".sa_layer_norm", C, 1e-12);
    std::string f = b.linear(a, p + ".ffn.lin1", C, F, weight_init());  // (B,T,F)
    f = b.activation(f, c.hidden_act);
    f = b.linear(f, p + ".ffn.lin2", F, C, weight_init());  // (B,T,C)
    f = b.dropout(f, c.hidden_dropout_prob);
    b.set_scope(p);
    return b.layer_norm(b.op("Add", {f, a}), p + ".output_layer_norm", C, 1e-12);
  }

  std::string encode(const std::string& ids, const std::string& mask) {
    std::string h = embeddings(ids);
    b.set_scope(prefix + "transformer");
    // (mask == 0) as (B,1,1,T)
    std::string pad = b.op("Equal", {mask, b.scalar_i64(0)});
    pad = b.op("Unsqueeze", {pad, b.const_i64({1, 2})});
    for (int64_t i = 0; i < c.num_hidden_layers; i++)
      h = block(cat(prefix, "transformer.layer.", i), h, pad);
    return h;
  }
};

}  // namespace

BuiltModel build_distilbert(const HfConfig& c, Task task, int64_t seed) {
  require_task(c, task);
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  DistilBert m{b, c, task == Task::Base ? "" : "distilbert."};
  Init w = Init::normal(c.initializer_range);
  int64_t C = c.hidden_size, L = c.num_labels;

  std::string ids = token_input(b, "input_ids");
  std::string mask = token_input(b, "attention_mask");
  std::string h = m.encode(ids, mask);  // (B,T,C)

  switch (task) {
    case Task::Base:
      b.set_scope("");
      b.op("Identity", {h}, {}, "last_hidden_state");
      b.output("last_hidden_state", DType::Float32, {-1, -1, C});
      break;
    case Task::SequenceClassification: {
      // h[:, 0] -> pre_classifier -> ReLU -> dropout(seq_classif_dropout) -> classifier
      b.set_scope("pre_classifier");
      std::string x = b.linear(first_token(b, h), "pre_classifier", C, C, w);
      x = b.dropout(b.op("Relu", {x}), c.classifier_dropout.value_or(0.2));
      b.linear(x, "classifier", C, L, w, true, "logits");  // (B,L)
      b.output("logits", DType::Float32, {-1, L});
      break;
    }
    case Task::TokenClassification: {
      std::string x = b.dropout(h, c.hidden_dropout_prob);
      b.linear(x, "classifier", C, L, w, true, "logits");  // (B,T,L)
      b.output("logits", DType::Float32, {-1, -1, L});
      break;
    }
    case Task::MaskedLM: {
      std::string x = b.linear(h, "vocab_transform", C, C, w);
      x = b.activation(x, c.hidden_act);
      x = b.layer_norm(x, "vocab_layer_norm", C, 1e-12);
      std::string table = "distilbert.embeddings.word_embeddings.weight";
      if (!c.tie_word_embeddings) table = b.param("vocab_projector.weight", {c.vocab_size, C}, w);
      std::string bias = b.param("vocab_projector.bias", {c.vocab_size}, Init::zeros());
      b.set_scope("vocab_projector");
      tied_projection(b, x, table, bias, "logits");  // (B,T,V)
      b.output("logits", DType::Float32, {-1, -1, c.vocab_size});
      break;
    }
    default:
      break;
  }
  BuiltModel out = finish_model(b, c, task);
  if (task == Task::MaskedLM && c.tie_word_embeddings)
    out.tied.push_back({"vocab_projector.weight", "distilbert.embeddings.word_embeddings.weight"});
  return out;
}

}  // namespace onyx::models
