// diffusion/sampler.cc — see sampler.h. Drawn noise: image n's starting latents from Philox
// stream n under the seed's key, its step-i noise from stream n under the key of (seed, i), so an
// image does not depend on batch_size or on the other images.
#include "diffusion/sampler.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/normal_draw.h"
#include "runtime/session.h"

namespace onyx::diffusion {
namespace {

using kernels::Philox4x32;

Philox4x32::Key key_for(uint64_t seed, uint64_t step) {
  return Philox4x32::key_from(kernels::mix_seed(seed * 0x9E3779B97F4A7C15ull + step));
}

// Rows [b, e) of the images' noise: from `given` (all N images' noise, or null: drawn per image).
void noise_rows(const float* given, uint64_t seed, uint64_t step, int64_t b, int64_t e,
                int64_t per_image, float* out) {
  if (given) {
    std::memcpy(out, given + b * per_image, (size_t)((e - b) * per_image) * sizeof(float));
    return;
  }
  for (int64_t n = b; n < e; n++)
    kernels::philox_normals(key_for(seed, step), (uint32_t)n, out + (n - b) * per_image, per_image);
}

void check_options(const UNet2DConfig& c, const SampleOptions& o, const Shape& image,
                   int64_t steps) {
  const int64_t N = o.num_images;
  ONYX_CHECK(N >= 1 && N <= 100000, "num_images must be in [1, 100000], got ", N);
  ONYX_CHECK(o.batch_size >= 1, "batch_size must be >= 1");
  const int64_t div = (int64_t)1 << (c.block_out_channels.size() - 1);
  ONYX_CHECK(image[2] % div == 0 && image[3] % div == 0, "image size ", image[2], "x", image[3],
             ": the UNet's ", c.block_out_channels.size(), " blocks need multiples of ", div);
  if (c.num_class_embeds) {
    ONYX_CHECK((int64_t)o.class_labels.size() == N, "the UNet is class-conditional (",
               c.num_class_embeds, " classes): give one class label per image (", N, " images, ",
               o.class_labels.size(), " labels)");
    for (int64_t l : o.class_labels)
      ONYX_CHECK(l >= 0 && l < c.num_class_embeds, "class label ", l, " is outside [0, ",
                 c.num_class_embeds, ")");
  } else {
    ONYX_CHECK(o.class_labels.empty(),
               "the UNet is unconditional (no num_class_embeds): "
               "class labels cannot be given");
  }
  const double gib = (double)N * image[1] * image[2] * image[3] * 4 / (1 << 30);
  ONYX_CHECK(gib <= 8, N, " images of ", image[1], "x", image[2], "x", image[3], " need ", gib,
             " GiB (at most 8 in one run): sample fewer");
  if (c.conditional) {
    ONYX_CHECK(o.encoder_hidden_states,
               "the UNet is a UNet2DConditionModel: give the encoder's "
               "hidden states (N, sequence, ",
               c.cross_attention_dim, ")");
    for (const auto* t : {&o.encoder_hidden_states, &o.negative_encoder_hidden_states}) {
      if (!*t) continue;
      const Shape& s = (*t)->shape();
      ONYX_CHECK((*t)->dtype() == DType::Float32 && s.size() == 3 && s[0] == N &&
                     s[2] == c.cross_attention_dim,
                 "encoder hidden states must be float32 (", N, ", sequence, ",
                 c.cross_attention_dim, "), got ", shape_str(s));
    }
    ONYX_CHECK(o.guidance_scale <= 1 || o.negative_encoder_hidden_states, "guidance_scale ",
               o.guidance_scale,
               " > 1 needs the negative (or empty prompt's) encoder hidden states");
  } else {
    ONYX_CHECK(!o.encoder_hidden_states, "the UNet (UNet2DModel) takes no encoder hidden states");
  }
  Shape want = {N, image[1], image[2], image[3]};
  if (o.latents)
    ONYX_CHECK(o.latents->dtype() == DType::Float32 && o.latents->shape() == want,
               "given latents must be float32 ", shape_str(want), ", got ",
               shape_str(o.latents->shape()));
  if (o.step_noise) {
    Shape ws = {steps, N, image[1], image[2], image[3]};
    ONYX_CHECK(o.step_noise->dtype() == DType::Float32 && o.step_noise->shape() == ws,
               "given step noise must be float32 ", shape_str(ws), ", got ",
               shape_str(o.step_noise->shape()));
  }
}

// Rows [b, e) of an (N, ...) tensor, copied.
Tensor rows(const Tensor& t, int64_t b, int64_t e) {
  Shape s = t.shape();
  const int64_t per = t.numel() / s[0];
  s[0] = e - b;
  Tensor out(t.dtype(), s);
  std::memcpy(out.raw(), t.data<float>() + b * per, (size_t)out.nbytes());
  return out;
}

// The UNet's output for the batch's rows [b, e), guided when the options ask.
Tensor unet_output(runtime::Session& session, std::map<std::string, Tensor>& feeds,
                   const SampleOptions& o, int64_t b, int64_t e) {
  if (!o.encoder_hidden_states) return session.run(feeds).at("model_output");
  feeds["encoder_hidden_states"] = rows(*o.encoder_hidden_states, b, e);
  Tensor cond = session.run(feeds).at("model_output");
  if (o.guidance_scale <= 1) return cond;
  feeds["encoder_hidden_states"] = rows(*o.negative_encoder_hidden_states, b, e);
  Tensor y = session.run(feeds).at("model_output");  // uncond, then guided in place
  const float g = (float)o.guidance_scale;
  float* u = y.data<float>();
  const float* t = cond.data<float>();
  for (int64_t i = 0; i < y.numel(); i++) u[i] = u[i] + g * (t[i] - u[i]);
  return y;
}

}  // namespace

Tensor sample_images(std::shared_ptr<ir::Graph> unet, const UNet2DConfig& c,
                     const ScheduleConfig& schedule, const SampleOptions& o,
                     const std::function<void(int64_t, int64_t)>& on_step) {
  ONYX_CHECK(o.scheduler == "ddpm" || o.scheduler == "ddim", "scheduler '", o.scheduler,
             "' is not supported (ddpm, ddim)");
  NoiseSchedule s(schedule);
  const int64_t steps = o.num_inference_steps   ? o.num_inference_steps
                        : o.scheduler == "ddpm" ? 1000
                                                : 50;
  const std::vector<int64_t> ts = s.inference_timesteps(steps);
  const int64_t H = o.height ? o.height : c.sample_size, W = o.width ? o.width : H;
  ONYX_CHECK(H >= 1 && W >= 1, "no image size: the UNet's config has no sample_size (give one)");
  const Shape image = {o.num_images, c.in_channels, H, W};
  check_options(c, o, image, steps);
  const int64_t per_image = c.in_channels * H * W, N = o.num_images;
  runtime::Session session(unet);
  session.check_supported();
  Tensor out(DType::Float32, image);
  for (int64_t b = 0; b < N; b += o.batch_size) {
    const int64_t e = std::min(N, b + o.batch_size), B = e - b;
    Tensor x(DType::Float32, {B, c.in_channels, H, W});
    noise_rows(o.latents ? o.latents->data<float>() : nullptr, o.seed, 0, b, e, per_image,
               x.data<float>());
    std::map<std::string, Tensor> feeds;
    if (c.num_class_embeds)
      feeds["class_labels"] = Tensor::from_vector<int64_t>(
          DType::Int64, {B},
          std::vector<int64_t>(o.class_labels.begin() + b, o.class_labels.begin() + e));
    Tensor noise(DType::Float32, x.shape());
    for (int64_t i = 0; i < steps; i++) {
      const int64_t t = ts[i];
      feeds["sample"] = x;
      feeds["timestep"] =
          Tensor::from_vector<int64_t>(DType::Int64, {B}, std::vector<int64_t>(B, t));
      Tensor y = unet_output(session, feeds, o, b, e);
      if (o.scheduler == "ddpm") {
        const float* given =
            o.step_noise ? o.step_noise->data<float>() + i * N * per_image : nullptr;
        noise_rows(given, o.seed, (uint64_t)i + 1, b, e, per_image, noise.data<float>());
        s.ddpm_step(y.data<float>(), t, i + 1 < steps ? ts[i + 1] : -1, noise.data<float>(),
                    x.data<float>(), x.numel());
      } else {
        s.ddim_step(y.data<float>(), t, t - s.steps() / steps, x.data<float>(), x.numel());
      }
      if (on_step)
        on_step(b / o.batch_size * steps + i + 1, (N + o.batch_size - 1) / o.batch_size * steps);
    }
    float* dst = out.data<float>() + b * per_image;
    const float* src = x.data<float>();
    for (int64_t k = 0; k < x.numel(); k++) dst[k] = std::clamp(src[k] / 2 + 0.5f, 0.0f, 1.0f);
  }
  return out;
}

}  // namespace onyx::diffusion
