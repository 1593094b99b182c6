// cmd_sample.cc — `onyx sample MODEL_DIR --output GRID.png`: images from a trained diffusers
// UNet2DModel / UNet2DConditionModel folder (diffusion/sampler.h) by DDPM or DDIM, written as one
// PNG grid (one row per class for a class-conditional model, drawn with Cairo, which `onyx plot`
// already links) and, with --tensors, as safetensors ("images" (N,C,H,W) in [0, 1],
// "class_labels").
#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "diffusion/diffusers_folder.h"
#include "diffusion/sampler.h"
#include "diffusion/text_encoder.h"
#include "diffusion/vae.h"
#include "io/safetensors.h"

namespace onyx::cli {
namespace {

struct SampleArgs {
  std::string model, output, tensors, noise, scheduler_config, conditions, vae;
  diffusion::SampleOptions o;
  diffusion::PromptOptions prompts;
  int64_t per_class = 0, scale = 2;
};

// Images (N,C,H,W) in [0, 1] as a grid of `cols` columns, each pixel `scale`x`scale`, 2 px apart;
// one channel as gray, three as RGB. Written atomically.
void write_grid_png(const Tensor& images, int64_t cols, int64_t scale, const std::string& path) {
  const int64_t N = images.dim(0), C = images.dim(1), H = images.dim(2), W = images.dim(3);
  ONYX_CHECK(C == 1 || C == 3, "a PNG grid needs 1 or 3 channels, the images have ", C);
  const int64_t rows = (N + cols - 1) / cols, gap = 2;
  const int width = (int)(cols * (W * scale + gap) + gap),
            height = (int)(rows * (H * scale + gap) + gap);
  cairo_surface_t* s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height);
  ONYX_CHECK(cairo_surface_status(s) == CAIRO_STATUS_SUCCESS, "cannot make a ", width, "x", height,
             " image");
  cairo_surface_flush(s);
  auto* px = reinterpret_cast<uint32_t*>(cairo_image_surface_get_data(s));
  const int stride = cairo_image_surface_get_stride(s) / 4;
  std::fill(px, px + (size_t)stride * height, 0xffffffffu);  // white gaps
  const float* v = images.data<float>();
  auto byte = [](float x) { return (uint32_t)std::lround(std::clamp(x, 0.0f, 1.0f) * 255.0f); };
  for (int64_t n = 0; n < N; n++)
    for (int64_t y = 0; y < H * scale; y++)
      for (int64_t x = 0; x < W * scale; x++) {
        const int64_t i = (y / scale) * W + x / scale, plane = H * W;
        const float* img = v + n * C * plane;
        uint32_t r = byte(img[i]), g = C == 3 ? byte(img[plane + i]) : r,
                 b = C == 3 ? byte(img[2 * plane + i]) : r;
        const int64_t X = gap + (n % cols) * (W * scale + gap) + x;
        const int64_t Y = gap + (n / cols) * (H * scale + gap) + y;
        px[Y * stride + X] = 0xff000000u | (r << 16) | (g << 8) | b;
      }
  cairo_surface_mark_dirty(s);
  std::string png;
  const cairo_status_t st = cairo_surface_write_to_png_stream(
      s,
      [](void* to, const unsigned char* data, unsigned int n) {
        static_cast<std::string*>(to)->append(reinterpret_cast<const char*>(data), n);
        return CAIRO_STATUS_SUCCESS;
      },
      &png);
  cairo_surface_destroy(s);
  ONYX_CHECK(st == CAIRO_STATUS_SUCCESS, "cannot encode '", path,
             "': ", cairo_status_to_string(st));
  io::write_file_atomic(path, png);
}

int run_sample(SampleArgs& a) {
  ONYX_CHECK(std::filesystem::is_regular_file(std::filesystem::path(a.model) / "config.json"), "'",
             a.model, "' is not a diffusers model folder (no config.json)");
  const diffusion::Denoiser d = diffusion::load_denoiser(a.model);
  diffusion::SampleOptions& o = a.o;
  int64_t cols = 8;
  if (a.per_class) {
    ONYX_CHECK(d.classes, "--per_class: the model (", d.class_name, ") is unconditional");
    ONYX_CHECK(o.class_labels.empty(), "--per_class and --class_labels: give one");
    for (int64_t k = 0; k < d.classes; k++)
      for (int64_t j = 0; j < a.per_class; j++) o.class_labels.push_back(k);
    cols = a.per_class;
  }
  if (!o.class_labels.empty()) o.num_images = (int64_t)o.class_labels.size();
  if (!a.noise.empty()) {
    auto f = io::load_safetensors(a.noise).tensors;
    ONYX_CHECK(f.count("latents"), "'", a.noise, "' has no 'latents'");
    o.latents = f.at("latents");
    ONYX_CHECK(o.latents->rank() == 4, "'", a.noise, "': latents must be (N, C, H, W), got ",
               shape_str(o.latents->shape()));
    o.num_images = o.latents->dim(0);
    if (f.count("step_noise")) o.step_noise = f.at("step_noise");
  }
  if (!a.conditions.empty()) {
    auto f = io::load_safetensors(a.conditions).tensors;
    ONYX_CHECK(f.count("encoder_hidden_states"), "'", a.conditions,
               "' has no 'encoder_hidden_states'");
    o.encoder_hidden_states = f.at("encoder_hidden_states");
    ONYX_CHECK(o.encoder_hidden_states->rank() == 3, "'", a.conditions,
               "': encoder_hidden_states must be (N, sequence, dim), got ",
               shape_str(o.encoder_hidden_states->shape()));
    if (f.count("negative_encoder_hidden_states"))
      o.negative_encoder_hidden_states = f.at("negative_encoder_hidden_states");
    if (o.class_labels.empty() && !o.latents) o.num_images = o.encoder_hidden_states->dim(0);
  }
  if (!a.prompts.prompts.empty()) {
    ONYX_CHECK(a.conditions.empty(), "--prompt and --encoder_hidden_states: give one");
    diffusion::encode_prompts(a.model, a.prompts, o);
    cols = a.prompts.per_prompt;
  }
  diffusion::decode_with_vae(a.model, a.vae, o);
  auto schedule = diffusion::find_schedule_config(a.model, a.scheduler_config);
  Tensor images = diffusion::sample_images(d, schedule, o, [](int64_t i, int64_t n) {
    if (i % 10 == 0 || i == n) std::cerr << "\rsampling: UNet call " << i << "/" << n << std::flush;
    if (i == n) std::cerr << "\n";
  });
  if (!a.tensors.empty()) {
    std::map<std::string, Tensor> out = {{"images", images}};
    if (!o.class_labels.empty())
      out["class_labels"] = Tensor::from_vector<int64_t>(
          DType::Int64, {(int64_t)o.class_labels.size()}, o.class_labels);
    io::save_safetensors(a.tensors, out);
  }
  if (!a.output.empty()) write_grid_png(images, std::min(cols, o.num_images), a.scale, a.output);
  std::cout << "sampled " << o.num_images << " images (" << diffusion::scheduler_name(o, schedule)
            << ")" << (a.output.empty() ? "" : "; grid in " + a.output) << "\n";
  return 0;
}

}  // namespace

Action add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sample", "images from a trained diffusers UNet2DModel folder (DDPM or DDIM)");
  auto a = std::make_shared<SampleArgs>();
  cmd->add_option("model", a->model, "a diffusers UNet2DModel folder (onyx train's output_dir)")
      ->required();
  cmd->add_option("--output", a->output, "PNG grid to write (one row per class with --per_class)");
  cmd->add_option("--tensors", a->tensors, "safetensors to write images (N,C,H,W) in [0, 1] to");
  cmd->add_option("--scheduler", a->o.scheduler,
                  "the folder's scheduler (its config's _class_name; DDPM when it names "
                  "none), or ddpm, ddim, dpmsolver (DPM-Solver++ 2M by default: "
                  "DPMSolverMultistepScheduler), euler or euler_ancestral (Euler(Ancestral)"
                  "DiscreteScheduler), heun (HeunDiscreteScheduler: two UNet calls a step), lms "
                  "(LMSDiscreteScheduler), pndm "
                  "(PNDMScheduler's PLMS, Stable Diffusion 1.x's), unipc (UniPCMultistepScheduler: "
                  "UniPC's predictor-corrector, good in 10-20 steps); all but ddpm are good in "
                  "20-50 steps");
  cmd->add_flag("--use_karras_sigmas", a->o.use_karras_sigmas,
                "dpmsolver / euler / heun / lms / unipc with Karras sigmas (\"DPM++ 2M Karras\"), "
                "as the scheduler "
                "config's use_karras_sigmas");
  cmd->add_option("--eta", a->o.eta,
                  "DDIM's eta in [0, 1] (default 0: deterministic; 1: DDPM's noise)");
  cmd->add_option("--scheduler_config", a->scheduler_config,
                  "scheduler_config.json (default: the model folder's, else DDPM's defaults)");
  cmd->add_option("--num_inference_steps", a->o.num_inference_steps,
                  "denoising steps (default: DDPM 1000, DDIM 50)");
  cmd->add_option("--num_images", a->o.num_images, "images of an unconditional model");
  cmd->add_option("--class_labels", a->o.class_labels, "one class per image")->delimiter(',');
  cmd->add_option("--per_class", a->per_class, "this many images of every class");
  cmd->add_option("--batch_size", a->o.batch_size, "images per UNet call (default 64)");
  cmd->add_option("--seed", a->o.seed, "noise seed");
  cmd->add_option("--noise", a->noise,
                  "safetensors with the starting 'latents' (N,C,H,W) [and the 'step_noise' of DDPM "
                  "or DDIM with eta > 0 (steps,N,C,H,W)] instead of drawn noise");
  cmd->add_option("--scale", a->scale, "PNG pixels per image pixel (default 2)");
  cmd->add_option("--encoder_hidden_states", a->conditions,
                  "UNet2DConditionModel: safetensors with 'encoder_hidden_states' (N,S,D) [and "
                  "'negative_encoder_hidden_states' for --guidance_scale]");
  cmd->add_option("--prompt", a->prompts.prompts,
                  "UNet2DConditionModel: prompts (one row of the grid each), encoded by the "
                  "model folder's text_encoder/ and tokenizer/ (or its pipeline's)");
  cmd->add_option("--negative_prompt", a->prompts.negative_prompt,
                  "the prompt guidance steers away from (default \"\")");
  cmd->add_option("--per_prompt", a->prompts.per_prompt, "images per prompt (default 1)");
  cmd->add_option("--text_encoder", a->prompts.text_encoder, "a CLIPTextModel folder");
  cmd->add_option("--tokenizer", a->prompts.tokenizer, "its tokenizer folder");
  cmd->add_option("--vae", a->vae,
                  "an AutoencoderKL folder decoding the latents (default: the model folder's "
                  "vae/ or its pipeline's; none: no decoding)");
  cmd->add_option("--guidance_scale", a->o.guidance_scale,
                  "classifier-free guidance (> 1: uncond + scale * (cond - uncond))");
  return [a]() { return run_sample(*a); };
}

}  // namespace onyx::cli
