// diffusion/unet2d_config.h — diffusers' UNet2DModel and UNet2DConditionModel config.json
// (`_class_name`), parsed with diffusers' defaults for every absent key, and the part of them
// onyx builds: positional time embeddings, DownBlock2D / AttnDownBlock2D / CrossAttnDownBlock2D,
// UpBlock2D / AttnUpBlock2D / CrossAttnUpBlock2D, UNetMidBlock2D / UNetMidBlock2DCrossAttn (or
// none), convolution down/up-sampling, class embeddings from num_class_embeds. Anything else is an
// error naming the key, its value and what is supported.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace onyx::diffusion {

struct UNet2DConfig {
  // UNet2DConditionModel (Stable Diffusion's): cross-attention transformers on an encoder's
  // hidden states in CrossAttn* blocks; TimestepEmbedding and conv_act use act_fn.
  bool conditional = false;
  int64_t cross_attention_dim = 1280;
  std::vector<int64_t> heads;                  // per down block (num_attention_heads, or SD's
                                               // attention_head_dim, which means heads there)
  std::vector<int64_t> transformer_layers;     // per down block (transformer_layers_per_block)
  std::vector<int64_t> up_transformer_layers;  // per up block (reverse_transformer_layers_...)
  bool use_linear_projection = false;
  int64_t sample_size = 0;  // 0: not given (any size divisible by 2^(blocks-1))
  int64_t in_channels = 3, out_channels = 3;
  bool center_input_sample = false;
  int64_t time_embedding_dim = 0;  // 0: block_out_channels[0] * 4
  int64_t freq_shift = 0;
  bool flip_sin_to_cos = true;
  std::vector<std::string> down_block_types, up_block_types;
  std::string mid_block_type = "UNetMidBlock2D";  // "" when null
  std::vector<int64_t> block_out_channels;
  int64_t layers_per_block = 2;
  double mid_block_scale_factor = 1;
  int64_t downsample_padding = 1;
  double dropout = 0;
  std::string act_fn = "silu";
  int64_t attention_head_dim = 8;  // 0: null (one head per block: the block's channels)
  int64_t norm_num_groups = 32;
  int64_t attn_norm_num_groups = 0;  // 0: null (norm_num_groups)
  double norm_eps = 1e-5;
  std::string resnet_time_scale_shift = "default";  // or "scale_shift"
  bool add_attention = true;
  int64_t num_class_embeds = 0;  // 0: unconditional
  std::string raw_json;          // the file as read, saved back unchanged

  int64_t time_embed_dim() const {
    return time_embedding_dim ? time_embedding_dim : block_out_channels.at(0) * 4;
  }
};

// Throws onyx::Error naming `what` (the file) and the key for invalid JSON, a value of the wrong
// type, a block type or option onyx does not build, or inconsistent lengths.
UNet2DConfig parse_unet2d_config(const std::string& json_text, const std::string& what);

// The `_class_name` of a diffusers config.json text ("" when it has none: not a diffusers model).
std::string diffusers_class_name(const std::string& json_text);

}  // namespace onyx::diffusion
