// vit.cc — ViT as Transformers' ViTModel (patch embedding by a strided Conv2d, [CLS] token,
// learned positions, pre-LayerNorm encoder) and ViTForImageClassification (classifier on the
// final LayerNorm's [CLS] state). Weights are truncated-normal initialized, as ViT does.
//
// B batch, Ch channels, S image size, P patch size, N = (S/P)^2 patches, C hidden, nh heads,
// hs = C / nh, F intermediate, L labels.
#include <cmath>

#include "models/builders.h"

namespace onyx::models {
namespace {

struct Vit {
  GraphBuilder& b;
  const HfConfig& c;
  std::string prefix;  // "vit." or "" for the bare model

  Init weight_init() const { return Init::trunc_normal(c.initializer_range); }

  // ViTEmbeddings. pixel_values (B,Ch,S,S) -> (B,N+1,C)
  std::string embeddings(const std::string& pixels) {
    std::string p = prefix + "embeddings";
    int64_t C = c.hidden_size, P = c.patch_size, n = (c.image_size / P) * (c.image_size / P);
    std::string cls = b.param(p + ".cls_token", {1, 1, C}, Init::trunc_normal(c.initializer_range));
    std::string pos =
        b.param(p + ".position_embeddings", {1, n + 1, C}, Init::trunc_normal(c.initializer_range));
    std::string proj = p + ".patch_embeddings.projection";
    std::string w = b.param(proj + ".weight", {C, c.num_channels, P, P}, weight_init());
    std::string bias = b.param(proj + ".bias", {C}, Init::zeros());
    b.set_scope(proj);
    std::string x = b.op("Conv", {pixels, w, bias},
                         {{"kernel_shape", Attr::of_ints({P, P})},
                          {"strides", Attr::of_ints({P, P})}});        // (B,C,S/P,S/P)
    x = b.op("Reshape", {x, b.const_i64({0, 0, -1})});                 // (B,C,N)
    x = b.op("Transpose", {x}, {{"perm", Attr::of_ints({0, 2, 1})}});  // (B,N,C)
    b.set_scope(p);
    std::string shape =
        b.op("Concat", {b.dim_of(pixels, 0), b.const_i64({1, C})}, {{"axis", Attr::of_int(0)}});
    std::string cls_b = b.op("Expand", {cls, shape});             // (B,1,C)
    x = b.op("Concat", {cls_b, x}, {{"axis", Attr::of_int(1)}});  // (B,N+1,C)
    x = b.op("Add", {x, pos});
    return b.dropout(x, c.hidden_dropout_prob);
  }

  // ViTAttention (ViTSelfAttention + ViTSelfOutput). (B,T,C) -> (B,T,C)
  std::string attention(const std::string& p, const std::string& h) {
    int64_t C = c.hidden_size, nh = c.num_attention_heads, hs = C / nh;
    std::string q = b.linear(h, p + ".attention.query", C, C, weight_init(), c.qkv_bias);
    std::string k = b.linear(h, p + ".attention.key", C, C, weight_init(), c.qkv_bias);
    std::string v = b.linear(h, p + ".attention.value", C, C, weight_init(), c.qkv_bias);
    b.set_scope(p + ".attention");
    q = b.split_heads(q, nh, hs);              // (B,nh,T,hs)
    k = b.split_heads_transposed(k, nh, hs);   // (B,nh,hs,T)
    v = b.split_heads(v, nh, hs);              // (B,nh,T,hs)
    std::string att = b.op("MatMul", {q, k});  // (B,nh,T,T)
    att = b.op("Div", {att, b.scalar_f32((float)std::sqrt((double)hs))});
    att = b.op("Softmax", {att}, {{"axis", Attr::of_int(-1)}});
    att = b.dropout(att, c.attention_probs_dropout_prob);
    std::string y = b.merge_heads(b.op("MatMul", {att, v}), C);  // (B,T,C)
    y = b.linear(y, p + ".output.dense", C, C, weight_init());
    return b.dropout(y, c.hidden_dropout_prob);
  }

  // ViTLayer: x + attn(layernorm_before(x)), then x + mlp(layernorm_after(x)). (B,T,C) -> (B,T,C)
  std::string layer(const std::string& p, const std::string& h) {
    int64_t C = c.hidden_size, F = c.intermediate_size;
    std::string a =
        attention(p + ".attention", b.layer_norm(h, p + ".layernorm_before", C, c.layer_norm_eps));
    b.set_scope(p);
    std::string x = b.op("Add", {a, h});
    std::string f = b.layer_norm(x, p + ".layernorm_after", C, c.layer_norm_eps);
    f = b.activation(b.linear(f, p + ".intermediate.dense", C, F, weight_init()), c.hidden_act);
    f = b.dropout(b.linear(f, p + ".output.dense", F, C, weight_init()), c.hidden_dropout_prob);
    b.set_scope(p);
    return b.op("Add", {f, x});
  }

  std::string encode(const std::string& pixels) {
    std::string h = embeddings(pixels);
    for (int64_t i = 0; i < c.num_hidden_layers; i++)
      h = layer(cat(prefix, "encoder.layer.", i), h);
    return b.layer_norm(h, prefix + "layernorm", c.hidden_size, c.layer_norm_eps);
  }
};

}  // namespace

BuiltModel build_vit(const HfConfig& c, Task task, int64_t seed) {
  require_task(c, task);
  GraphBuilder b(architecture_name(c.model_type, task), (uint64_t)seed);
  Vit m{b, c, task == Task::Base ? "" : "vit."};
  int64_t C = c.hidden_size, L = c.num_labels, S = c.image_size;

  std::string pixels = b.input("pixel_values", DType::Float32, {-1, c.num_channels, S, S},
                               {"batch_size", "", "", ""});
  std::string h = m.encode(pixels);  // (B,N+1,C)
  if (task == Task::Base) {
    b.set_scope("");
    b.op("Identity", {h}, {}, "last_hidden_state");
    b.output("last_hidden_state", DType::Float32, {-1, -1, C});
    b.set_scope("pooler");  // ViTPooler: tanh(dense(h[:, 0]))
    std::string x = b.linear(first_token(b, h), "pooler.dense", C, C, m.weight_init());
    b.op("Tanh", {x}, {}, "pooler_output");
    b.output("pooler_output", DType::Float32, {-1, C});
  } else {
    b.set_scope("classifier");
    b.linear(first_token(b, h), "classifier", C, L, m.weight_init(), true, "logits");  // (B,L)
    b.output("logits", DType::Float32, {-1, L});
  }
  return finish_model(b, c, task);
}

}  // namespace onyx::models
