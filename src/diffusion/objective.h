// diffusion/objective.h — the training graph of diffusers' example scripts around any denoiser
// (UNet2DModel, UNet2DConditionModel, DiTTransformer2DModel): clean images in, noise and
// timesteps drawn in the graph unless the batch gives them, the schedule's add_noise, the
// prediction target, min-SNR weights, the mean squared error as the graph's "loss".
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "diffusion/noise_schedule.h"
#include "models/graph_builder.h"
#include "onyx/trainer.h"

namespace onyx::diffusion {

// What training minimizes (train_unconditional.py / train_text_to_image.py): the schedule's
// add_noise at a timestep, the prediction target, and min-SNR weighting when snr_gamma > 0.
struct Objective {
  ScheduleConfig schedule;
  double snr_gamma = 0;  // 0: off (a plain mean squared error)
};

// The denoiser's prediction (B,C,H,W) for x_t and timesteps t (B) int64, built into the graph
// (declaring its own conditioning inputs: class_labels, encoder_hidden_states).
using Denoise = std::function<std::string(const std::string& x_t, const std::string& t)>;

// Graph inputs "pixel_values" (B,C,H,W) (clean images x0, in the model's range) and the optional
// "noise" (B,C,H,W) and "timesteps" (B) int64 — drawn in the graph when a batch leaves them out
// (standard normal and uniform in [0, T), onyx.DrawNormal / onyx.DrawIntegers keyed on the run
// seed: reproducible on resume and different per step and micro-batch). The denoiser sees
//   x_t = sqrt(alphas_cumprod[t]) x0 + sqrt(1 - alphas_cumprod[t]) noise
// and the scalar output "loss" is the mean over the batch of w[t] · mean((prediction - target)^2)
// per sample, target = noise (epsilon), sqrt(a) noise - sqrt(1 - a) x0 (v_prediction) or x0
// (sample), w = 1 or the min-SNR weight (NoiseSchedule::min_snr_weights); also "model_output".
// The Model: GraphOutput loss, weight decay on every parameter (diffusers' scripts give AdamW
// all of them), weights file diffusion_pytorch_model.safetensors, `config_json`; with `classes`
// > 0 a batch's "labels" (an image classification dataset's) are its "class_labels".
Model diffusion_training_model(models::GraphBuilder& b, int64_t channels, const Objective& o,
                               const Denoise& denoise, const std::string& config_json,
                               int64_t classes);

// Graph inputs shared by the denoisers: images (B,C,H,W) float32, (B) int64.
std::string image_input(models::GraphBuilder& b, const std::string& name, int64_t channels);
std::string batch_input(models::GraphBuilder& b, const std::string& name);

}  // namespace onyx::diffusion
