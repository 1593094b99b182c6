// diffusion/diffusers_folder.h — a diffusers model folder (config.json with `_class_name`:
// UNet2DModel, UNet2DConditionModel or DiTTransformer2DModel, and
// diffusion_pytorch_model.safetensors when it has weights) opened for training or sampling, and
// the noise scheduler's config that goes with it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "diffusion/dit.h"
#include "diffusion/unet2d.h"

namespace onyx::diffusion {

// Puts a diffusion_pytorch_model.safetensors' tensors into the graph's initializers (as float32),
// every name and shape checked: a tensor the graph lacks, or a graph weight the file lacks, is an
// error naming them. `part`: the graph is a part of the file's model (a VAE's encoder): the
// file's other tensors are left out.
void apply_weights(ir::Graph& g, const std::filesystem::path& file, bool part = false);

// A folder's file as text (config.json); a file that cannot be read is an error naming it.
std::string read_text(const std::filesystem::path& p);

// The diffusers pipeline folder a model folder belongs to — its parent, when that has
// model_index.json or the model folder is named unet/ — or "" when it stands alone. Its other
// components (vae/, text_encoder/, tokenizer/, scheduler/) are the model's.
std::string pipeline_root(const std::string& model_dir);

// config.json of `dir` names a diffusers class (`_class_name`).
bool is_diffusers_folder(const std::string& dir);

// What a sampler needs to know of a denoiser, and its sampling graph (inputs "sample",
// "timestep" and the conditioning ones; output "model_output").
struct Denoiser {
  std::string class_name;
  std::shared_ptr<ir::Graph> graph;
  int64_t in_channels = 0, out_channels = 0, sample_size = 0;
  int64_t size_multiple = 1;        // image sizes it takes are multiples of this
  int64_t classes = 0;              // class-conditional: labels in [0, classes)
  bool null_class = false;          // label `classes` is the unconditional one (DiT's guidance)
  int64_t cross_attention_dim = 0;  // > 0: takes encoder_hidden_states (UNet2DConditionModel)
};

// The sampling description of a folder; the graph carries its weights (required).
Denoiser load_denoiser(const std::string& dir);

// The scheduler config for a model folder: `spec` (a scheduler_config.json, a folder holding
// one, or "" for: the folder's own scheduler_config.json, else the pipeline's sibling
// ../scheduler/scheduler_config.json, else DDPMScheduler's defaults).
ScheduleConfig find_schedule_config(const std::string& model_dir, const std::string& spec);

// The training model (objective.h) of the folder's denoiser with its weights when it has any
// (else initialized, as from_config). A weights file that lacks a parameter, has one onyx does
// not, or has another shape is an error naming the tensors. `class_dropout_prob`: DiT's label
// dropout in training (diffusers' 0.1).
Model load_denoiser_training(const std::string& dir, const Objective& o, uint64_t seed,
                             double class_dropout_prob = 0.1);

}  // namespace onyx::diffusion
