// diffusion/sampler.h — images from a trained UNet2DModel by diffusers' DDPMPipeline /
// DDIMPipeline loop: x_T ~ N(0, 1), then for each timestep of the scheduler's set_timesteps the
// UNet's output and one scheduler step (noise_schedule.h), class labels passed to a
// class-conditional UNet, the encoder's hidden states to a UNet2DConditionModel (with
// classifier-free guidance), and the pipeline's output transform (x / 2 + 0.5 clamped to [0, 1]).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diffusion/diffusers_folder.h"
#include "diffusion/noise_schedule.h"
#include "onyx/tensor.h"

namespace onyx::diffusion {

struct SampleOptions {
  // ddpm | ddim | dpmsolver | euler | euler_ancestral | heun | pndm (diffusion/steppers.h), made
  // from the scheduler config as from_config makes them; "": the one the config names (its
  // _class_name)
  std::string scheduler;
  double eta = 0;  // DDIM's eta (DDIMPipeline's): the share of DDPM's noise, 0..1
  // Karras sigmas for dpmsolver / euler / heun, as from_config(config, use_karras_sigmas=True)
  // makes them
  bool use_karras_sigmas = false;
  int64_t num_inference_steps = 0;  // 0: the pipeline's default (DDPM 1000, DDIM 50)
  int64_t num_images = 1;
  std::vector<int64_t> class_labels;  // one per image for a class-conditional UNet
  int64_t batch_size = 64;            // images per UNet call
  uint64_t seed = 0;
  int64_t height = 0, width = 0;  // 0: the config's sample_size
  // UNet2DConditionModel: the encoder's hidden states per image (N,S,cross_attention_dim). With
  // guidance_scale > 1, classifier-free guidance as the pipelines do it: uncond + guidance_scale *
  // (cond - uncond), uncond the output on the negative (or empty prompt's) hidden states
  // (N,S,cross_attention_dim) — Stable Diffusion's — or on the null class (DiTPipeline's).
  std::optional<Tensor> encoder_hidden_states, negative_encoder_hidden_states;
  double guidance_scale = 1.0;
  // Given noise instead of drawn (to compare with diffusers from the same draws): the starting
  // latents (N,C,H,W) and the per-step noise of DDPM and of DDIM with eta > 0 (steps,N,C,H,W).
  std::optional<Tensor> latents, step_noise;
  // Latent diffusion: the final latents (B,C,h,w) to images before the output transform (a VAE's
  // decoder: StableDiffusionPipeline's vae.decode(latents / scaling_factor)); null: none.
  std::function<Tensor(const Tensor&)> decode;
};

// The scheduler sample_images steps with: o.scheduler, else the one `schedule` names.
std::string scheduler_name(const SampleOptions& o, const ScheduleConfig& schedule);

// Images (N,C,H,W) float32 in [0, 1]. `on_step(i, steps)` after each denoising step.
// Errors name what is wrong: no class labels for a class-conditional UNet (or labels out of
// range), a size the UNet cannot take, given noise of the wrong shape, too many steps.
Tensor sample_images(const Denoiser& denoiser, const ScheduleConfig& schedule,
                     const SampleOptions& o,
                     const std::function<void(int64_t, int64_t)>& on_step = nullptr);

}  // namespace onyx::diffusion
