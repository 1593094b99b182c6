// diffusion/layers.h — the PyTorch / diffusers layers the models share (unet2d.cc, dit.cc, vae.cc),
// as GraphBuilder nodes: weights under `<name>.weight` / `<name>.bias` with PyTorch's default
// initialization bounds (U(±1/sqrt(fan_in)), values from onyx's RNG keyed on seed and name).
#pragma once
#include <cstdint>
#include <string>

#include "models/graph_builder.h"

namespace onyx::diffusion {

// nn.Linear(in, out[, bias]) on the last axis.
std::string torch_linear(models::GraphBuilder& b, const std::string& x, const std::string& name,
                         int64_t in, int64_t out, bool bias = true);
// nn.Conv2d(cin, cout, k, stride, padding) on (B,cin,H,W).
std::string torch_conv2d(models::GraphBuilder& b, const std::string& x, const std::string& name,
                         int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t pad);
// nn.LayerNorm(dim, eps, elementwise_affine=False) on the last axis.
std::string layer_norm_plain(models::GraphBuilder& b, const std::string& x, int64_t dim,
                             double eps);
// diffusers' get_timestep_embedding: t (B) int64 -> (B, dim) sinusoids,
// exp(-ln(10000) i / (dim/2 - shift)) frequencies in float32, [cos, sin] when flip_sin_to_cos.
std::string timestep_features(models::GraphBuilder& b, const std::string& t, int64_t dim,
                              bool flip_sin_to_cos, int64_t shift);
// Scaled dot-product attention of q (B,T,C) over k, v (B,S,C) in `heads` heads -> (B,T,C),
// scale 1/sqrt(C/heads): the MatMul/Softmax chain the attention fusion makes onyx.Attention of.
std::string attention_core(models::GraphBuilder& b, const std::string& q, const std::string& k,
                           const std::string& v, int64_t C, int64_t heads);

// Upsample2D's F.interpolate(x, scale_factor=2, mode="nearest") on (B,C,H,W).
std::string upsample_nearest2x(models::GraphBuilder& b, const std::string& x);

// nn.GroupNorm(groups, ch, eps) over (B, ch, ...): "<name>.weight" (ones), "<name>.bias" (zeros).
std::string group_norm(models::GraphBuilder& b, const std::string& x, const std::string& name,
                       int64_t groups, int64_t ch, double eps);

// diffusers' ResnetBlock2D: norm1, act, conv1, [+ time_emb_proj(temb)], norm2, [scale-shift],
// act, dropout, conv2, plus the input (conv_shortcut 1x1 when the widths differ), / output_scale.
struct ResnetOptions {
  int64_t groups = 32;
  double eps = 1e-5;
  std::string act = "silu";  // GraphBuilder::activation's names
  std::string temb;          // (B, temb_dim), act already applied; "" = none (the VAE's blocks)
  int64_t temb_dim = 0;
  bool scale_shift = false;  // resnet_time_scale_shift "scale_shift"
  double dropout = 0, output_scale = 1;
};
std::string resnet_block(models::GraphBuilder& b, const std::string& x, const std::string& p,
                         int64_t cin, int64_t cout, const ResnetOptions& o);

// diffusers' Attention over the H*W positions of x (B,ch,H,W) in `heads` heads (group_norm
// first unless groups is 0; q/k/v and to_out.0 with biases), the input added, / rescale.
std::string spatial_attention(models::GraphBuilder& b, const std::string& x, const std::string& p,
                              int64_t ch, int64_t heads, int64_t groups, double eps,
                              double rescale);

}  // namespace onyx::diffusion
