// bert.cc — BERT and RoBERTa (post-LayerNorm encoders) as Transformers' BertModel / RobertaModel
// with their heads: ...ForSequenceClassification, ...ForTokenClassification, ...ForMaskedLM and the
// bare model (Task::Base). RoBERTa is BERT with position ids counted from padding_idx + 1, a
// single token type, and its own classification / LM heads.
//
// B batch, T sequence, C hidden, nh heads, hs = C / nh, F intermediate, V vocabulary, L labels.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct Bert {
  GraphBuilder& b;
  const HfConfig& c;
  bool roberta;
  std::string prefix;  // "bert." / "roberta." / "" for the bare model

  Init weight_init() const { return Init::normal(c.initializer_range); }

  // RoBERTa's create_position_ids_from_input_ids: non-padding tokens are numbered
  // padding_idx + 1, padding_idx + 2, ...; padding tokens get padding_idx.
  std::string roberta_position_ids(const std::string& ids) {
    // ids (B,T) -> (B,T)
    std::string pad = b.scalar_i64(c.pad_token_id);
    std::string keep = b.op("Cast", {b.op("Not", {b.op("Equal", {ids, pad})})},
                            {{"to", Attr::of_int((int64_t)DType::Int64)}});
    std::string count = b.op("CumSum", {keep, b.scalar_i64(1)});
    return b.op("Add", {b.op("Mul", {count, keep}), pad});
  }

  // BertEmbeddings: ids (B,T), token_type_ids (B,T) or "" -> (B,T,C)
  std::string embeddings(const std::string& ids, const std::string& token_type_ids) {
    std::string p = prefix + "embeddings";
    int64_t C = c.hidden_size;
    int64_t pad = c.pad_token_id >= 0 && c.pad_token_id < c.vocab_size ? c.pad_token_id : -1;
    double sd = c.initializer_range;
    // Parameters in Transformers' order; RoBERTa's position table has a padding row too.
    std::string words =
        b.param(p + ".word_embeddings.weight", {c.vocab_size, C}, Init::normal(sd, pad));
    std::string positions =
        b.param(p + ".position_embeddings.weight", {c.max_position_embeddings, C},
                Init::normal(sd, roberta ? pad : -1));
    std::string types =
        b.param(p + ".token_type_embeddings.weight", {c.type_vocab_size, C}, Init::normal(sd));
    b.set_scope(p);
    // RoBERTa without token_type_ids: every token has type 0, one (C) row broadcast.
    std::string type_ids = token_type_ids.empty() ? b.scalar_i64(0) : token_type_ids;
    std::string x = b.gather_rows(words, ids);             // (B,T,C)
    x = b.op("Add", {x, b.gather_rows(types, type_ids)});  // + (B,T,C) or (C)
    std::string pos = roberta ? b.gather_rows(positions, roberta_position_ids(ids))  // (B,T,C)
                              : b.leading_rows(positions, ids, 1);  // rows 0..T-1: (T,C)
    x = b.op("Add", {x, pos});
    x = b.layer_norm(x, p + ".LayerNorm", C, c.layer_norm_eps);
    return b.dropout(x, c.hidden_dropout_prob);
  }

  // BertSelfAttention + BertSelfOutput: h (B,T,C), mask (B,1,1,T) -> (B,T,C)
  std::string attention(const std::string& p, const std::string& h, const std::string& mask) {
    int64_t C = c.hidden_size, nh = c.num_attention_heads, hs = C / nh;
    std::string q = b.linear(h, p + ".self.query", C, C, weight_init());  // (B,T,C)
    std::string k = b.linear(h, p + ".self.key", C, C, weight_init());
    std::string v = b.linear(h, p + ".self.value", C, C, weight_init());
    b.set_scope(p + ".self");
    q = b.split_heads(q, nh, hs);              // (B,nh,T,hs)
    k = b.split_heads_transposed(k, nh, hs);   // (B,nh,hs,T)
    v = b.split_heads(v, nh, hs);              // (B,nh,T,hs)
    std::string att = b.op("MatMul", {q, k});  // (B,nh,T,T)
    att = b.op("Div", {att, b.scalar_f32((float)std::sqrt((double)hs))});
    att = b.op("Add", {att, mask});
    att = b.op("Softmax", {att}, {{"axis", Attr::of_int(-1)}});
    att = b.dropout(att, c.attention_probs_dropout_prob);
    std::string y = b.merge_heads(b.op("MatMul", {att, v}), C);  // (B,T,C)
    y = b.linear(y, p + ".output.dense", C, C, weight_init());
    y = b.dropout(y, c.hidden_dropout_prob);
    b.set_scope(p + ".output");
    return b.layer_norm(b.op("Add", {y, h}), p + ".output.LayerNorm", C, c.layer_norm_eps);
  }

  // BertLayer: attention, then BertIntermediate + BertOutput. (B,T,C) -> (B,T,C)
  std::string layer(const std::string& p, const std::string& h, const std::string& mask) {
    int64_t C = c.hidden_size, F = c.intermediate_size;
    std::string a = attention(p + ".attention", h, mask);
    std::string f = b.linear(a, p + ".intermediate.dense", C, F, weight_init());  // (B,T,F)
    f = b.activation(f, c.hidden_act);
    f = b.linear(f, p + ".output.dense", F, C, weight_init());  // (B,T,C)
    f = b.dropout(f, c.hidden_dropout_prob);
    b.set_scope(p + ".output");
    return b.layer_norm(b.op("Add", {f, a}), p + ".output.LayerNorm", C, c.layer_norm_eps);
  }

  // BertPooler: tanh(dense(h[:, 0])). (B,T,C) -> (B,C)
  std::string pooler(const std::string& h, const std::string& out = "") {
    std::string p = prefix + "pooler";
    b.set_scope(p);
    std::string x =
        b.linear(first_token(b, h), p + ".dense", c.hidden_size, c.hidden_size, weight_init());
    return b.op("Tanh", {x}, {}, out);
  }

  // The bare model's encoder output. ids (B,T) -> (B,T,C)
  std::string encode(const std::string& ids, const std::string& mask, const std::string& types) {
    std::string h = embeddings(ids, types);
    std::string m = additive_attention_mask(b, mask);  // (B,1,1,T)
    for (int64_t i = 0; i < c.num_hidden_layers; i++)
      h = layer(cat(prefix, "encoder.layer.", i), h, m);
    return h;
  }
};

}  // namespace

BuiltModel build_bert(const HfConfig& c, Task task, int64_t seed) {
  bool roberta = c.model_type == "roberta";
  require_task(c, task);
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  std::string prefix = task == Task::Base ? "" : base_model_prefix(c.model_type) + ".";
  Bert m{b, c, roberta, prefix};
  Init w = Init::normal(c.initializer_range);
  int64_t C = c.hidden_size, L = c.num_labels;
  double cls_dropout = c.classifier_dropout.value_or(c.hidden_dropout_prob);

  std::string ids = token_input(b, "input_ids");
  std::string mask = token_input(b, "attention_mask");
  std::string types = roberta ? "" : token_input(b, "token_type_ids");
  std::string h = m.encode(ids, mask, types);  // (B,T,C)

  switch (task) {
    case Task::Base:
      b.set_scope("");
      b.op("Identity", {h}, {}, "last_hidden_state");
      b.output("last_hidden_state", DType::Float32, {-1, -1, C});
      m.pooler(h, "pooler_output");
      b.output("pooler_output", DType::Float32, {-1, C});
      break;
    case Task::SequenceClassification:
      if (!roberta) {  // BertForSequenceClassification: dropout(pooler) -> classifier
        std::string x = b.dropout(m.pooler(h), cls_dropout);
        b.linear(x, "classifier", C, L, w, true, "logits");  // (B,L)
      } else {                                               // RobertaClassificationHead on h[:, 0]
        b.set_scope("classifier");
        std::string x = b.dropout(first_token(b, h), cls_dropout);
        x = b.op("Tanh", {b.linear(x, "classifier.dense", C, C, w)});
        x = b.dropout(x, cls_dropout);
        b.linear(x, "classifier.out_proj", C, L, w, true, "logits");  // (B,L)
      }
      b.output("logits", DType::Float32, {-1, L});
      break;
    case Task::TokenClassification: {
      std::string x = b.dropout(h, cls_dropout);
      b.linear(x, "classifier", C, L, w, true, "logits");  // (B,T,L)
      b.output("logits", DType::Float32, {-1, -1, L});
      break;
    }
    case Task::MaskedLM: {
      // BertOnlyMLMHead: transform (dense, act, LayerNorm), then the decoder tied to the word
      // embeddings plus its own bias. RobertaLMHead: the same with gelu and other names.
      std::string hp = roberta ? "lm_head" : "cls.predictions";
      std::string tp = roberta ? "lm_head" : "cls.predictions.transform";
      std::string bias = b.param(hp + ".bias", {c.vocab_size}, Init::zeros());
      std::string x = b.linear(h, tp + ".dense", C, C, w);
      x = b.activation(x, roberta ? "gelu" : c.hidden_act);
      x = b.layer_norm(x, tp + (roberta ? ".layer_norm" : ".LayerNorm"), C, c.layer_norm_eps);
      std::string table = prefix + "embeddings.word_embeddings.weight";
      std::string dec = hp + ".decoder.weight";
      if (!c.tie_word_embeddings) table = b.param(dec, {c.vocab_size, C}, w);
      b.set_scope(hp + ".decoder");
      tied_projection(b, x, table, bias, "logits");  // (B,T,V)
      b.output("logits", DType::Float32, {-1, -1, c.vocab_size});
      break;
    }
    default:
      break;
  }
  BuiltModel out = finish_model(b, c, task);
  if (task == Task::MaskedLM) {
    std::string hp = roberta ? "lm_head" : "cls.predictions";
    if (c.tie_word_embeddings)
      out.tied.push_back({hp + ".decoder.weight", prefix + "embeddings.word_embeddings.weight"});
    out.tied.push_back({hp + ".decoder.bias", hp + ".bias"});
  }
  return out;
}

}  // namespace onyx::models
