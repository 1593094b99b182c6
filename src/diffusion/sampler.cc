// diffusion/sampler.cc — see sampler.h. Drawn noise: image n's starting latents from Philox
// stream n under the seed's key, its step-i noise from stream n under the key of (seed, i), so an
// image does not depend on batch_size or on the other images.
#include "diffusion/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "diffusion/steppers.h"
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

void check_conditions(const Denoiser& d, const SampleOptions& o, int64_t N) {
  if (d.classes) {
    ONYX_CHECK((int64_t)o.class_labels.size() == N, "the model (", d.class_name,
               ") is class-conditional (", d.classes, " classes): give one class label per image (",
               N, " images, ", o.class_labels.size(), " labels)");
    for (int64_t l : o.class_labels)
      ONYX_CHECK(l >= 0 && l < d.classes, "class label ", l, " is outside [0, ", d.classes, ")");
  } else {
    ONYX_CHECK(o.class_labels.empty(), "the model (", d.class_name,
               ") is unconditional (no num_class_embeds): class labels cannot be given");
  }
  if (d.cross_attention_dim) {
    ONYX_CHECK(o.encoder_hidden_states, "the model is a ", d.class_name,
               ": give the encoder's hidden states (N, sequence, ", d.cross_attention_dim, ")");
    for (const auto* t : {&o.encoder_hidden_states, &o.negative_encoder_hidden_states}) {
      if (!*t) continue;
      const Shape& s = (*t)->shape();
      ONYX_CHECK((*t)->dtype() == DType::Float32 && s.size() == 3 && s[0] == N &&
                     s[2] == d.cross_attention_dim,
                 "encoder hidden states must be float32 (", N, ", sequence, ",
                 d.cross_attention_dim, "), got ", shape_str(s));
    }
    ONYX_CHECK(o.guidance_scale <= 1 || o.negative_encoder_hidden_states, "guidance_scale ",
               o.guidance_scale,
               " > 1 needs the negative (or empty prompt's) encoder hidden states");
  } else {
    ONYX_CHECK(!o.encoder_hidden_states, "the model (", d.class_name,
               ") takes no encoder hidden states");
    ONYX_CHECK(o.guidance_scale <= 1 || d.null_class, "guidance_scale ", o.guidance_scale,
               ": the model (", d.class_name,
               ") has no unconditional input to guide against (a null class or a prompt)");
  }
}

void check_options(const Denoiser& d, const SampleOptions& o, const Shape& image, int64_t steps) {
  const int64_t N = o.num_images;
  ONYX_CHECK(N >= 1 && N <= 100000, "num_images must be in [1, 100000], got ", N);
  ONYX_CHECK(std::isfinite(o.eta) && o.eta >= 0 && o.eta <= 1, "eta must be in [0, 1], got ",
             o.eta);
  ONYX_CHECK(o.eta == 0 || o.scheduler == "ddim", "eta is DDIM's (the scheduler is '", o.scheduler,
             "')");
  ONYX_CHECK(o.batch_size >= 1, "batch_size must be >= 1");
  const int64_t m = d.size_multiple;
  ONYX_CHECK(image[2] % m == 0 && image[3] % m == 0, "image size ", image[2], "x", image[3],
             ": the model (", d.class_name, ") needs multiples of ", m);
  check_conditions(d, o, N);
  const double gib = (double)N * image[1] * image[2] * image[3] * 4 / (1 << 30);
  ONYX_CHECK(gib <= 8, N, " images of ", image[1], "x", image[2], "x", image[3], " need ", gib,
             " GiB (at most 8 in one run): sample fewer");
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

// (B, 2C, H, W) -> its first C channels (learned sigma: the prediction is the first half).
Tensor first_channels(const Tensor& y, int64_t C) {
  const int64_t B = y.dim(0), plane = y.dim(2) * y.dim(3), all = y.dim(1);
  Tensor out(DType::Float32, {B, C, y.dim(2), y.dim(3)});
  for (int64_t n = 0; n < B; n++)
    std::memcpy(out.data<float>() + n * C * plane, y.data<float>() + n * all * plane,
                (size_t)(C * plane) * sizeof(float));
  return out;
}

// The denoiser's prediction for the batch's rows [b, e): guided when the options ask (against
// the negative prompt's hidden states, or DiT's null class), the first C channels of a learned-
// sigma output.
Tensor model_output(const Denoiser& d, runtime::Session& session,
                    std::map<std::string, Tensor>& feeds, const SampleOptions& o, int64_t b,
                    int64_t e) {
  if (o.encoder_hidden_states)
    feeds["encoder_hidden_states"] = rows(*o.encoder_hidden_states, b, e);
  Tensor y = session.run(feeds).at("model_output");
  if (o.guidance_scale > 1) {
    std::map<std::string, Tensor> uncond = feeds;
    if (o.encoder_hidden_states)
      uncond["encoder_hidden_states"] = rows(*o.negative_encoder_hidden_states, b, e);
    else
      uncond["class_labels"] = Tensor::from_vector<int64_t>(DType::Int64, {e - b},
                                                            std::vector<int64_t>(e - b, d.classes));
    Tensor u = session.run(uncond).at("model_output");
    const float g = (float)o.guidance_scale;
    float* c = y.data<float>();
    const float* un = u.data<float>();
    for (int64_t i = 0; i < y.numel(); i++) c[i] = un[i] + g * (c[i] - un[i]);
  }
  return d.out_channels == d.in_channels ? y : first_channels(y, d.in_channels);
}

// The sampling graph with a float32 `timestep` input (the Euler schedulers' fractional
// timesteps): valid because every consumer of the input casts it to float32 (the sinusoidal time
// features), which the test here makes sure of.
std::shared_ptr<ir::Graph> with_float_timestep(const ir::Graph& g) {
  auto out = std::make_shared<ir::Graph>(g);
  for (const ir::Node& n : out->nodes)
    for (const std::string& in : n.inputs)
      ONYX_CHECK(in != "timestep" ||
                     (n.op_type == "Cast" && n.attr_int("to", 0) == (int64_t)DType::Float32),
                 "the model's timestep input feeds '", n.name, "' (", n.op_type,
                 "), not only a cast to float: it cannot take the Euler schedulers' fractional "
                 "timesteps");
  for (ir::ValueInfo& v : out->inputs)
    if (v.name == "timestep") v.dtype = DType::Float32;
  return out;
}

}  // namespace

std::string scheduler_name(const SampleOptions& o, const ScheduleConfig& schedule) {
  return o.scheduler.empty() ? Stepper::of_config(schedule) : o.scheduler;
}

Tensor sample_images(const Denoiser& d, const ScheduleConfig& schedule, const SampleOptions& given,
                     const std::function<void(int64_t, int64_t)>& on_step) {
  SampleOptions o = given;
  o.scheduler = scheduler_name(given, schedule);
  ScheduleConfig config = schedule;
  if (o.use_karras_sigmas) {
    ONYX_CHECK(o.scheduler == "dpmsolver" || o.scheduler == "euler" || o.scheduler == "heun" ||
                   o.scheduler == "unipc" || o.scheduler == "lms",
               "use_karras_sigmas is for the dpmsolver, euler, heun, lms and unipc schedulers, "
               "not ",
               o.scheduler);
    config.karras_sigmas = true;
  }
  NoiseSchedule s(config);
  const auto probe = Stepper::make(o.scheduler, s, o.num_inference_steps, o.eta);
  const int64_t steps = probe->steps();
  // the size: given, else the given latents', else the config's sample_size
  const bool from_latents = o.latents && o.latents->rank() == 4 && !o.height && !o.width;
  const int64_t H = from_latents ? o.latents->dim(2) : o.height ? o.height : d.sample_size;
  const int64_t W = from_latents ? o.latents->dim(3) : o.width ? o.width : H;
  ONYX_CHECK(H >= 1 && W >= 1, "no image size: the model's config has no sample_size");
  const int64_t C = d.in_channels;
  const Shape image = {o.num_images, C, H, W};
  check_options(d, o, image, steps);
  const int64_t per_image = C * H * W, N = o.num_images;
  runtime::Session session(probe->float_timesteps() ? with_float_timestep(*d.graph) : d.graph);
  session.check_supported();
  Tensor out;  // (N, ...) as the first batch's images give it
  for (int64_t b = 0; b < N; b += o.batch_size) {
    const int64_t e = std::min(N, b + o.batch_size), B = e - b;
    auto stepper = Stepper::make(o.scheduler, s, o.num_inference_steps, o.eta);
    Tensor x(DType::Float32, {B, C, H, W});
    noise_rows(o.latents ? o.latents->data<float>() : nullptr, o.seed, 0, b, e, per_image,
               x.data<float>());
    if (const float sigma = stepper->init_noise_sigma(); sigma != 1.0f)
      for (int64_t k = 0; k < x.numel(); k++) x.data<float>()[k] = x.data<float>()[k] * sigma;
    std::map<std::string, Tensor> feeds;
    if (d.classes)
      feeds["class_labels"] = Tensor::from_vector<int64_t>(
          DType::Int64, {B},
          std::vector<int64_t>(o.class_labels.begin() + b, o.class_labels.begin() + e));
    Tensor noise(DType::Float32, x.shape());
    for (int64_t i = 0; i < steps; i++) {
      feeds["sample"] = stepper->model_input(i, x);
      feeds["timestep"] = stepper->timestep(i, B);
      Tensor y = model_output(d, session, feeds, o, b, e);
      if (stepper->draws_noise()) {
        const float* given =
            o.step_noise ? o.step_noise->data<float>() + i * N * per_image : nullptr;
        noise_rows(given, o.seed, (uint64_t)i + 1, b, e, per_image, noise.data<float>());
      }
      stepper->step(i, y.data<float>(), noise.data<float>(), x.data<float>(), x.numel());
      if (on_step)
        on_step(b / o.batch_size * steps + i + 1, (N + o.batch_size - 1) / o.batch_size * steps);
    }
    const Tensor images = o.decode ? o.decode(x) : x;
    if (!b) {
      Shape all = images.shape();
      all[0] = N;
      const double gib = (double)shape_numel(all) * 4 / (1 << 30);
      ONYX_CHECK(gib <= 8, N, " decoded images of ", shape_str(Shape(all.begin() + 1, all.end())),
                 " need ", gib, " GiB (at most 8 in one run): sample fewer");
      out = Tensor(DType::Float32, all);
    }
    const int64_t per = images.numel() / B;
    float* dst = out.data<float>() + b * per;
    const float* src = images.data<float>();
    for (int64_t k = 0; k < images.numel(); k++) dst[k] = std::clamp(src[k] / 2 + 0.5f, 0.0f, 1.0f);
  }
  return out;
}

}  // namespace onyx::diffusion
