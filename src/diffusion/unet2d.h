// diffusion/unet2d.h — diffusers' UNet2DModel and UNet2DConditionModel (Stable Diffusion's) as
// onyx graphs, with diffusers' state_dict names (conv_in, time_embedding.linear_1,
// down_blocks.0.resnets.0.norm1, down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k, ...,
// conv_out), and the diffusion training objective of diffusers' example scripts around them.
//
// Shapes: B batch, Cin/Cout image channels, H, W image size, T num_train_timesteps.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "diffusion/objective.h"
#include "diffusion/unet2d_config.h"
#include "onyx/trainer.h"

namespace onyx::diffusion {

// The UNet for sampling: inputs "sample" (B,Cin,H,W) float32, "timestep" (B) int64 and, with
// num_class_embeds, "class_labels" (B) int64, for a UNet2DConditionModel "encoder_hidden_states"
// (B,S,cross_attention_dim) float32; output "model_output" (B,Cout,H,W). Weights are
// initializers under diffusers' names, initialized as PyTorch's default Conv2d / Linear / Embedding
// initializations (values differ from PyTorch's: onyx's deterministic RNG keyed on seed and name).
std::shared_ptr<ir::Graph> build_unet2d(const UNet2DConfig& c, uint64_t seed);

// The training graph, same weights: diffusion_training_model (objective.h) around the UNet, whose
// conditioning inputs are as above ("encoder_hidden_states" the frozen text encoder's output,
// precomputed).
Model build_unet2d_training(const UNet2DConfig& c, const Objective& o, uint64_t seed);

}  // namespace onyx::diffusion
