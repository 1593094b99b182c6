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

#include "diffusion/noise_schedule.h"
#include "diffusion/unet2d_config.h"
#include "onyx/trainer.h"

namespace onyx::diffusion {

// What training minimizes (train_unconditional.py / train_text_to_image.py): the schedule's
// add_noise at a timestep, the prediction target, and min-SNR weighting when snr_gamma > 0.
struct Objective {
  ScheduleConfig schedule;
  double snr_gamma = 0;  // 0: off (a plain mean squared error)
};

// The UNet for sampling: inputs "sample" (B,Cin,H,W) float32, "timestep" (B) int64 and, with
// num_class_embeds, "class_labels" (B) int64, for a UNet2DConditionModel "encoder_hidden_states"
// (B,S,cross_attention_dim) float32; output "model_output" (B,Cout,H,W). Weights are
// initializers under diffusers' names, initialized as PyTorch's default Conv2d / Linear / Embedding
// initializations (values differ from PyTorch's: onyx's deterministic RNG keyed on seed and name).
std::shared_ptr<ir::Graph> build_unet2d(const UNet2DConfig& c, uint64_t seed);

// The training graph, same weights: inputs "pixel_values" (B,Cin,H,W) (clean images x0, in the
// model's range), "class_labels" (B) with num_class_embeds, "encoder_hidden_states" (B,S,D) for a
// UNet2DConditionModel (the frozen text encoder's output, precomputed), and the optional "noise"
// (B,Cin,H,W) and "timesteps" (B) int64 — drawn in the graph when a batch leaves them out (standard
// normal and uniform in [0, T), onyx.DrawNormal / onyx.DrawIntegers keyed on the run seed:
// reproducible on resume and different per step and micro-batch). The UNet sees
//   x_t = sqrt(alphas_cumprod[t]) x0 + sqrt(1 - alphas_cumprod[t]) noise
// and the scalar output "loss" is the mean over the batch of w[t] · mean((model_output - target)^2)
// per sample, target = noise (epsilon), sqrt(a) noise - sqrt(1 - a) x0 (v_prediction) or x0
// (sample), w = 1 or the min-SNR weight (NoiseSchedule::min_snr_weights). Also "model_output".
// The Model: GraphOutput loss, weight decay on every parameter (diffusers' scripts give AdamW
// all of them), weights file diffusion_pytorch_model.safetensors, config_json = c.raw_json.
Model build_unet2d_training(const UNet2DConfig& c, const Objective& o, uint64_t seed);

}  // namespace onyx::diffusion
