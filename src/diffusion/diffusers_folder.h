// diffusion/diffusers_folder.h — a diffusers model folder (config.json with `_class_name`, and
// diffusion_pytorch_model.safetensors when it has weights) opened for training or sampling, and
// the noise scheduler's config that goes with it.
#pragma once
#include <memory>
#include <string>

#include "diffusion/unet2d.h"

namespace onyx::diffusion {

// config.json of `dir` names a diffusers class (`_class_name`).
bool is_diffusers_folder(const std::string& dir);
UNet2DConfig read_unet2d_config(const std::string& dir);

// The scheduler config for a model folder: `spec` (a scheduler_config.json, a folder holding
// one, or "" for: the folder's own scheduler_config.json, else the pipeline's sibling
// ../scheduler/scheduler_config.json, else DDPMScheduler's defaults).
ScheduleConfig find_schedule_config(const std::string& model_dir, const std::string& spec);

// The training model of build_unet2d_training with the folder's weights when it has any (else
// initialized, as UNet2DModel.from_config). A weights file that lacks a parameter, has one
// onyx does not, or has another shape is an error naming the tensors.
Model load_unet2d_training(const std::string& dir, const Objective& o, uint64_t seed);
// The sampling graph of build_unet2d with the folder's weights (required).
std::shared_ptr<ir::Graph> load_unet2d_sampler(const std::string& dir);

}  // namespace onyx::diffusion
