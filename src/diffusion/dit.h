// diffusion/dit.h — diffusers' DiTTransformer2DModel (Peebles & Xie's DiT) as onyx graphs, with
// diffusers' state_dict names: the patch embedding (a strided conv plus fixed 2-D sin-cos
// positions), transformer blocks with adaLN-Zero (each block's own timestep + class embedding
// regressing shift, scale and gate of attention and feed-forward), the final adaptive LayerNorm,
// the linear decoder back to patches.
//
// Shapes: B batch, C in_channels, S sample_size, P patch_size, N = (S/P)^2 tokens, D inner dim.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "diffusion/objective.h"

namespace onyx::diffusion {

struct DiTConfig {
  int64_t num_attention_heads = 16, attention_head_dim = 72;
  int64_t in_channels = 4, out_channels = 0;  // 0: in_channels; 2 x in_channels: learned sigma
  int64_t num_layers = 28;
  double dropout = 0;
  bool attention_bias = true;
  int64_t sample_size = 32, patch_size = 2;
  std::string activation_fn = "gelu-approximate";  // or "gelu"
  int64_t num_embeds_ada_norm = 1000;              // classes (the null class is one more)
  bool norm_elementwise_affine = false;
  double norm_eps = 1e-5;
  std::string raw_json;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t out() const { return out_channels ? out_channels : in_channels; }
};

// Throws naming `what` and the key for invalid JSON, a wrong type or what onyx does not build
// (norm_type other than ada_norm_zero, a sample size the patches do not tile, ...).
DiTConfig parse_dit_config(const std::string& json_text, const std::string& what);

// The DiT for sampling: inputs "sample" (B,C,S,S), "timestep" (B) int64, "class_labels" (B) int64
// (num_embeds_ada_norm is the null class of classifier-free guidance); output "model_output"
// (B,out,S,S). The (1, N, D) positions are a constant, as diffusers' pos_embed buffer.
std::shared_ptr<ir::Graph> build_dit(const DiTConfig& c, uint64_t seed);

// The training graph (objective.h) around the DiT. In training each block's class embedding drops
// a label to the null class with probability class_dropout_prob (diffusers' LabelEmbedding: each
// block's own draw, as its forward calls each block's embedding); with learned sigma
// (out_channels 2C) the loss reads the first C channels, as DiTPipeline does.
Model build_dit_training(const DiTConfig& c, const Objective& o, uint64_t seed,
                         double class_dropout_prob = 0.1);

}  // namespace onyx::diffusion
