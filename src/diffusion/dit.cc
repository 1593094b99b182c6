// diffusion/dit.cc — see dit.h. The structure follows diffusers 0.42's DiTTransformer2DModel,
// PatchEmbed (get_2d_sincos_pos_embed), CombinedTimestepLabelEmbeddings (Timesteps(256, flip,
// shift 1) + TimestepEmbedding, LabelEmbedding with a null-class row), AdaLayerNormZero and
// BasicTransformerBlock's ada_norm_zero path (attn1 with biases, FeedForward gelu-approximate).
#include "diffusion/dit.h"

#include <cmath>

#include "diffusion/config_reader.h"
#include "diffusion/layers.h"

namespace onyx::diffusion {
namespace {

using models::Attr;
using models::GraphBuilder;
using models::Init;

// diffusers' get_2d_sincos_pos_embed for a g x g grid (base size g, interpolation 1): token
// i*g + j (row i, column j) is [sincos_{D/2}(j), sincos_{D/2}(i)], sincos_E(p) = [sin(p w_k),
// cos(p w_k)], w_k = 10000^(-k / (E/2)), computed in float64 as diffusers does, stored float32.
Tensor sincos_positions(int64_t g, int64_t D) {
  Tensor t(DType::Float32, {1, g * g, D});
  float* o = t.data<float>();
  const int64_t E = D / 2, K = E / 2;
  for (int64_t i = 0; i < g; i++)
    for (int64_t j = 0; j < g; j++) {
      float* row = o + (i * g + j) * D;
      for (int64_t half = 0; half < 2; half++) {
        const double p = half == 0 ? (double)j : (double)i;
        for (int64_t k = 0; k < K; k++) {
          const double w = 1.0 / std::pow(10000.0, (double)k / (double)K);
          row[half * E + k] = (float)std::sin(p * w);
          row[half * E + K + k] = (float)std::cos(p * w);
        }
      }
    }
  return t;
}

struct DiT {
  GraphBuilder& b;
  const DiTConfig& c;
  std::string labels;     // (B) int64
  double label_drop = 0;  // training: LabelEmbedding's token_drop probability

  std::string linear(const std::string& x, const std::string& name, int64_t in, int64_t out) {
    return torch_linear(b, x, name, in, out);
  }

  // A parameter, or the one already made under that name (block 0's embedding, read again by the
  // final layer).
  std::string shared_param(const std::string& name, const Shape& shape, const Init& init) {
    return b.graph().initializers.count(name) ? name : b.param(name, shape, init);
  }

  // torch_linear over shared_param weights.
  std::string shared_linear(const std::string& x, const std::string& name, int64_t in,
                            int64_t out) {
    const Init init = Init::uniform(1.0 / std::sqrt((double)in));
    std::string w = shared_param(name + ".weight", {out, in}, init);
    std::string bias = shared_param(name + ".bias", {out}, init);
    b.set_scope(name);
    std::string wt = b.op("Transpose", {w}, {{"perm", Attr::of_ints({1, 0})}});
    return b.op("Add", {b.op("MatMul", {x, wt}), bias});
  }

  // CombinedTimestepLabelEmbeddings: (B, D)
  std::string embedding(const std::string& p, const std::string& t) {
    const int64_t D = c.inner_dim(), classes = c.num_embeds_ada_norm;
    b.set_scope(p + ".time_proj");
    std::string e = timestep_features(b, t, 256, true, 1);
    e = shared_linear(
        b.activation(shared_linear(e, p + ".timestep_embedder.linear_1", 256, D), "silu"),
        p + ".timestep_embedder.linear_2", D, D);
    const std::string name = p + ".class_embedder.embedding_table";
    std::string table = shared_param(name + ".weight", {classes + 1, D}, Init::normal(1.0));
    b.set_scope(name);
    std::string l = labels;
    if (label_drop > 0) {  // token_drop: a label becomes the null class with this probability
      const int64_t high = 1 << 24;
      std::string u = b.op("DrawIntegers", {b.const_tensor(Tensor(DType::Int64, {0})), labels},
                           {{"high", Attr::of_int(high)}});
      b.graph().nodes.back().domain = "onyx";
      std::string drop = b.op("Less", {u, b.scalar_i64((int64_t)std::llround(label_drop * high))});
      l = b.op("Where", {drop, b.scalar_i64(classes), labels});
    }
    return b.op("Add", {e, b.gather_rows(table, l)});
  }

  // (B,D) -> k chunks (B,1,D) of Linear(silu(cond)) (AdaLayerNormZero's and proj_out_1's)
  std::vector<std::string> modulation(const std::string& cond, const std::string& name, int k) {
    const int64_t D = c.inner_dim();
    std::string m = linear(b.activation(cond, "silu"), name, D, k * D);
    b.set_scope(name);
    m = b.op("Unsqueeze", {m, b.const_i64({1})});
    return b.op_n("Split", {m}, {{"axis", Attr::of_int(-1)}, {"num_outputs", Attr::of_int(k)}}, k);
  }

  std::string modulate(const std::string& x, const std::string& shift, const std::string& scale) {
    return b.op("Add", {b.op("Mul", {x, b.op("Add", {scale, b.scalar_f32(1)})}), shift});
  }

  // BasicTransformerBlock, ada_norm_zero. x (B,N,D)
  std::string block(const std::string& x, const std::string& p, const std::string& t) {
    const int64_t D = c.inner_dim(), H = c.num_attention_heads;
    auto m = modulation(embedding(p + ".norm1.emb", t), p + ".norm1.linear", 6);
    // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
    b.set_scope(p + ".norm1");
    std::string h = modulate(layer_norm_plain(b, x, D, 1e-6), m[0], m[1]);
    std::string q = torch_linear(b, h, p + ".attn1.to_q", D, D, c.attention_bias),
                k = torch_linear(b, h, p + ".attn1.to_k", D, D, c.attention_bias),
                v = torch_linear(b, h, p + ".attn1.to_v", D, D, c.attention_bias);
    b.set_scope(p + ".attn1");
    std::string a = linear(attention_core(b, q, k, v, D, H), p + ".attn1.to_out.0", D, D);
    b.set_scope(p);
    std::string y = b.op("Add", {b.op("Mul", {m[2], b.dropout(a, c.dropout)}), x});
    std::string n3 = c.norm_elementwise_affine ? b.layer_norm(y, p + ".norm3", D, c.norm_eps)
                                               : layer_norm_plain(b, y, D, c.norm_eps);
    b.set_scope(p);
    std::string f = linear(modulate(n3, m[3], m[4]), p + ".ff.net.0.proj", D, 4 * D);
    b.set_scope(p + ".ff.net.0");
    f = b.activation(f, c.activation_fn == "gelu" ? "gelu" : "gelu_pytorch_tanh");
    f = linear(b.dropout(f, c.dropout), p + ".ff.net.2", 4 * D, D);
    b.set_scope(p);
    return b.op("Add", {b.op("Mul", {m[5], f}), y});
  }

  // (B,C,S,S) -> (B,out,S,S)
  std::string forward(const std::string& x, const std::string& t) {
    const int64_t D = c.inner_dim(), P = c.patch_size, g = c.sample_size / P, out = c.out();
    std::string h = torch_conv2d(b, x, "pos_embed.proj", c.in_channels, D, P, P, 0);
    b.set_scope("pos_embed");
    h = b.op("Transpose", {b.op("Reshape", {h, b.const_i64({0, 0, -1})})},
             {{"perm", Attr::of_ints({0, 2, 1})}});  // (B,N,D)
    h = b.op("Add", {h, b.const_tensor(sincos_positions(g, D))});
    for (int64_t l = 0; l < c.num_layers; l++) h = block(h, cat("transformer_blocks.", l), t);
    // the final layer's conditioning is block 0's embedding, called again (its own label drop)
    auto m = modulation(embedding("transformer_blocks.0.norm1.emb", t), "proj_out_1", 2);
    b.set_scope("norm_out");
    h = modulate(layer_norm_plain(b, h, D, 1e-6), m[0], m[1]);
    h = linear(h, "proj_out_2", D, P * P * out);  // (B,N,P*P*out)
    b.set_scope("unpatchify");  // (B,g,g,P,P,out) -> (B,out,g,P,g,P) -> (B,out,S,S)
    h = b.op("Reshape", {h, b.const_i64({-1, g, g, P, P, out})});
    h = b.op("Transpose", {h}, {{"perm", Attr::of_ints({0, 5, 1, 3, 2, 4})}});
    return b.op("Reshape", {h, b.const_i64({-1, out, g * P, g * P})});
  }
};

void check(const DiTConfig& c, const std::string& what) {
  ONYX_CHECK(c.num_attention_heads >= 1 && c.attention_head_dim >= 1 && c.num_layers >= 1 &&
                 c.in_channels >= 1 && c.num_embeds_ada_norm >= 1,
             what,
             ": num_attention_heads, attention_head_dim, num_layers, in_channels and "
             "num_embeds_ada_norm must be positive");
  ONYX_CHECK(c.out() == c.in_channels || c.out() == 2 * c.in_channels, what, ": out_channels ",
             c.out(), " must be in_channels (", c.in_channels, ") or twice it (learned sigma)");
  ONYX_CHECK(
      c.patch_size >= 1 && c.sample_size >= c.patch_size && c.sample_size % c.patch_size == 0, what,
      ": sample_size ", c.sample_size, " is not a multiple of patch_size ", c.patch_size);
  ONYX_CHECK(c.inner_dim() % 4 == 0, what, ": the inner dimension ", c.inner_dim(),
             " (heads x head dim) must be a multiple of 4 (2-D sin-cos positions)");
  ONYX_CHECK(c.activation_fn == "gelu-approximate" || c.activation_fn == "gelu", what,
             ": activation_fn '", c.activation_fn, "' is not supported (gelu-approximate, gelu)");
  ONYX_CHECK(c.dropout >= 0 && c.dropout < 1, what, ": dropout must be in [0, 1)");
}

GraphBuilder dit_builder(uint64_t seed) {
  GraphBuilder b("DiTTransformer2DModel", seed);
  b.graph().opsets[""] = 21;
  return b;
}

}  // namespace

DiTConfig parse_dit_config(const std::string& text, const std::string& what) {
  ConfigReader r(text, what);
  DiTConfig c;
  c.raw_json = text;
  r.integer("num_attention_heads", c.num_attention_heads);
  r.integer("attention_head_dim", c.attention_head_dim);
  r.integer("in_channels", c.in_channels);
  r.integer("out_channels", c.out_channels);
  r.integer("num_layers", c.num_layers);
  r.number("dropout", c.dropout);
  r.boolean("attention_bias", c.attention_bias);
  r.integer("sample_size", c.sample_size);
  r.integer("patch_size", c.patch_size);
  r.string("activation_fn", c.activation_fn);
  r.integer("num_embeds_ada_norm", c.num_embeds_ada_norm);
  r.boolean("norm_elementwise_affine", c.norm_elementwise_affine);
  r.number("norm_eps", c.norm_eps);
  r.only("norm_type", {"ada_norm_zero"});  // the only one DiTTransformer2DModel builds
  check(c, what);
  return c;
}

std::shared_ptr<ir::Graph> build_dit(const DiTConfig& c, uint64_t seed) {
  GraphBuilder b = dit_builder(seed);
  std::string x = image_input(b, "sample", c.in_channels);
  std::string t = batch_input(b, "timestep");
  DiT d{b, c, batch_input(b, "class_labels")};
  std::string y = d.forward(x, t);
  b.set_scope("");
  b.op("Identity", {y}, {}, "model_output");
  b.output("model_output", DType::Float32, {-1, c.out(), -1, -1});
  return std::make_shared<ir::Graph>(b.take());
}

Model build_dit_training(const DiTConfig& c, const Objective& o, uint64_t seed,
                         double class_dropout_prob) {
  ONYX_CHECK(class_dropout_prob >= 0 && class_dropout_prob < 1,
             "class_dropout_prob must be in [0, 1), got ", class_dropout_prob);
  GraphBuilder b = dit_builder(seed);
  DiT d{b, c, "", class_dropout_prob};
  return diffusion_training_model(
      b, c.in_channels, o,
      [&](const std::string& x_t, const std::string& t) {
        d.labels = batch_input(b, "class_labels");
        std::string y = d.forward(x_t, t);
        if (c.out() == c.in_channels) return y;
        b.set_scope("learned_sigma");  // the prediction is the first C channels
        return b.op("Slice", {y, b.const_i64({0}), b.const_i64({c.in_channels}), b.const_i64({1})});
      },
      c.raw_json, c.num_embeds_ada_norm);
}

}  // namespace onyx::diffusion
