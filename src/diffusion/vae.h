// diffusion/vae.h — diffusers' AutoencoderKL (Stable Diffusion's VAE) as graphs: its config.json
// (`_class_name` AutoencoderKL) with diffusers' defaults, the encoder (DownEncoderBlock2D stack,
// the mid block's resnets and attention, quant_conv) to the latent distribution's mean and
// log-variance (clamped to [-30, 20] as DiagonalGaussianDistribution), and the decoder
// (post_quant_conv, UpDecoderBlock2D stack) from latents to images; every GroupNorm with eps 1e-6.
// Anything else in the config is an error naming the key.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/sampler.h"
#include "ir/graph.h"
#include "onyx/tensor.h"
#include "onyx/trainer.h"

namespace onyx::diffusion {

struct VaeConfig {
  int64_t in_channels = 3, out_channels = 3, latent_channels = 4;
  std::vector<int64_t> block_out_channels = {64};
  int64_t layers_per_block = 1, norm_num_groups = 32, sample_size = 32;
  std::string act_fn = "silu";  // GraphBuilder::activation's names ("swish" is read as silu)
  double scaling_factor = 0.18215, shift_factor = 0;  // latents = (z - shift) * scaling
  bool use_quant_conv = true, use_post_quant_conv = true, mid_block_add_attention = true;
};

VaeConfig parse_vae_config(const std::string& json_text, const std::string& what);

// The whole AutoencoderKL.forward (sample_posterior False): input "sample" (B,C,H,W); outputs
// "latent_mean", "latent_logvar" (B,L,H/f,W/f) and "model_output", the decoded mean.
std::shared_ptr<ir::Graph> build_vae(const VaeConfig& c, uint64_t seed);

// build_vae with a folder's weights (`onyx run VAE_FOLDER`).
std::shared_ptr<ir::Graph> load_vae_graph(const std::string& dir);

// A VAE folder (config.json + diffusion_pytorch_model.safetensors) for the pipelines: images to
// latents and back, as train_text_to_image.py (vae.encode(x).latent_dist, times
// scaling_factor) and StableDiffusionPipeline (vae.decode(latents / scaling_factor)) use it.
class Vae {
 public:
  static std::shared_ptr<Vae> open(const std::string& dir);
  // The model folder's own vae/ (onyx train's output), else its pipeline's (pipeline_root),
  // else null.
  static std::shared_ptr<Vae> of_model(const std::string& unet_dir);
  ~Vae();
  // (B,C,H,W) in [-1, 1] -> the latent distribution's mean and std (B,L,h,w).
  std::pair<Tensor, Tensor> encode(const Tensor& images) const;
  // Latents as the UNet sees them (scaled) -> images (B,C,H,W) in the model's range.
  Tensor decode(const Tensor& latents) const;
  // decode, `rows` latents at a time (a VAE's activations at image size are large: the sampler
  // decodes its batches so).
  Tensor decode_rows(const Tensor& latents, int64_t rows) const;
  const VaeConfig& config() const;
  const std::string& dir() const;
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Latent diffusion training (train_text_to_image.py's step): each batch's pixel_values become
// latents = (mean + std * eps - shift_factor) * scaling_factor of the frozen VAE's encoding,
// before the UNet's objective sees them. eps is the batch's `latent_noise` (B,L,h,w) when it has
// one, else drawn by Philox under a key of the run seed and the batch's pixels (the same batch
// draws the same eps, in a resumed run too). save_model copies the VAE's folder into
// output_dir/vae for sampling. The UNet's in_channels must be the VAE's latent_channels.
void train_on_latents(Model& m, std::shared_ptr<const Vae> vae, uint64_t seed);

// Sampling a latent model: o.decode set to the VAE's decoder — `spec` a VAE folder, "" for the
// model folder's vae/ or its pipeline's (none there: pixel space), "none" for no decoding.
void decode_with_vae(const std::string& model_dir, const std::string& spec, SampleOptions& o);

}  // namespace onyx::diffusion
