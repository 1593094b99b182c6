// diffusion/vae.cc — see vae.h. The module structure follows diffusers 0.42's AutoencoderKL
// (models/autoencoders/vae.py: Encoder, Decoder; DiagonalGaussianDistribution).
#include "diffusion/vae.h"

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "diffusion/config_reader.h"
#include "diffusion/diffusers_folder.h"
#include "diffusion/layers.h"
#include "kernels/cpu/normal_draw.h"
#include "runtime/session.h"

namespace fs = std::filesystem;

namespace onyx::diffusion {
namespace {

using models::Attr;
using models::GraphBuilder;

constexpr double kEps = 1e-6;  // every GroupNorm of the VAE (resnet_eps)

struct VaeNet {
  GraphBuilder& b;
  const VaeConfig& c;

  std::string act(const std::string& x) { return b.activation(x, c.act_fn); }
  std::string resnet(const std::string& x, const std::string& p, int64_t cin, int64_t cout) {
    ResnetOptions o;
    o.groups = c.norm_num_groups;
    o.eps = kEps;
    o.act = c.act_fn;
    return resnet_block(b, x, p, cin, cout, o);  // (no time embedding)
  }
  // UNetMidBlock2D without a time embedding: resnet, attention (one head), resnet.
  std::string mid(std::string x, const std::string& p, int64_t ch) {
    x = resnet(x, p + ".resnets.0", ch, ch);
    if (c.mid_block_add_attention)
      x = spatial_attention(b, x, p + ".attentions.0", ch, 1, c.norm_num_groups, kEps, 1);
    return resnet(x, p + ".resnets.1", ch, ch);
  }
  std::string out(const std::string& x, const std::string& p, int64_t ch, int64_t cout) {
    std::string h = act(group_norm(b, x, p + ".conv_norm_out", c.norm_num_groups, ch, kEps));
    return torch_conv2d(b, h, p + ".conv_out", ch, cout, 3, 1, 1);
  }

  // Encoder + quant_conv: images (B,C,H,W) -> moments (B,2L,h,w)
  std::string encoder(std::string x) {
    const auto& ch = c.block_out_channels;
    const int64_t n = (int64_t)ch.size(), L = c.latent_channels;
    x = torch_conv2d(b, x, "encoder.conv_in", c.in_channels, ch[0], 3, 1, 1);
    int64_t cur = ch[0];
    for (int64_t i = 0; i < n; i++) {  // DownEncoderBlock2D
      const std::string p = cat("encoder.down_blocks.", i);
      for (int64_t j = 0; j < c.layers_per_block; j++, cur = ch[i])
        x = resnet(x, cat(p, ".resnets.", j), cur, ch[i]);
      if (i + 1 < n) {  // Downsample2D with padding 0: F.pad(x, (0, 1, 0, 1)) first
        b.set_scope(p + ".downsamplers.0");
        x = b.op("Pad", {x, b.const_i64({0, 0, 0, 0, 0, 0, 1, 1})});
        x = torch_conv2d(b, x, p + ".downsamplers.0.conv", cur, cur, 3, 2, 0);
      }
    }
    x = out(mid(x, "encoder.mid_block", cur), "encoder", cur, 2 * L);
    return c.use_quant_conv ? torch_conv2d(b, x, "quant_conv", 2 * L, 2 * L, 1, 1, 0) : x;
  }

  // post_quant_conv + Decoder: z (B,L,h,w) -> images (B,C,H,W)
  std::string decoder(std::string z) {
    const auto& ch = c.block_out_channels;
    const int64_t n = (int64_t)ch.size(), L = c.latent_channels;
    if (c.use_post_quant_conv) z = torch_conv2d(b, z, "post_quant_conv", L, L, 1, 1, 0);
    std::string x = torch_conv2d(b, z, "decoder.conv_in", L, ch.back(), 3, 1, 1);
    int64_t cur = ch.back();
    x = mid(x, "decoder.mid_block", cur);
    for (int64_t i = 0; i < n; i++) {  // UpDecoderBlock2D, widest first
      const std::string p = cat("decoder.up_blocks.", i);
      const int64_t width = ch[n - 1 - i];
      for (int64_t j = 0; j <= c.layers_per_block; j++, cur = width)
        x = resnet(x, cat(p, ".resnets.", j), cur, width);
      if (i + 1 < n) {
        b.set_scope(p + ".upsamplers.0");
        x = torch_conv2d(b, upsample_nearest2x(b, x), p + ".upsamplers.0.conv", cur, cur, 3, 1, 1);
      }
    }
    return out(x, "decoder", cur, c.out_channels);
  }

  // moments (B,2L,h,w) -> mean and log-variance clamped to [-30, 20]
  std::pair<std::string, std::string> gaussian(const std::string& moments) {
    b.set_scope("latent_dist");
    auto parts = b.op_n("Split", {moments},
                        {{"axis", Attr::of_int(1)}, {"num_outputs", Attr::of_int(2)}}, 2);
    std::string logvar = b.op("Clip", {parts[1], b.scalar_f32(-30), b.scalar_f32(20)});
    return {parts[0], logvar};
  }
};

GraphBuilder vae_builder(uint64_t seed) {
  GraphBuilder b("AutoencoderKL", seed);
  b.graph().opsets[""] = 21;  // GroupNormalization with per-channel scale and bias
  return b;
}

std::string images_input(GraphBuilder& b, const std::string& name, int64_t channels) {
  return b.input(name, DType::Float32, {-1, channels, -1, -1},
                 {"batch_size", "", "height", "width"});
}

void output(GraphBuilder& b, const std::string& value, const std::string& name, int64_t channels) {
  b.set_scope("");
  b.op("Identity", {value}, {}, name);
  b.output(name, DType::Float32, {-1, channels, -1, -1});
}

}  // namespace

VaeConfig parse_vae_config(const std::string& text, const std::string& what) {
  ConfigReader r(text, what);
  std::string cls;
  r.string("_class_name", cls);
  ONYX_CHECK(cls == "AutoencoderKL", what, ": _class_name '", cls, "' is not AutoencoderKL");
  VaeConfig c;
  r.integer("in_channels", c.in_channels);
  r.integer("out_channels", c.out_channels);
  r.integer("latent_channels", c.latent_channels);
  r.integers("block_out_channels", c.block_out_channels);
  r.integer("layers_per_block", c.layers_per_block);
  r.integer("norm_num_groups", c.norm_num_groups);
  r.integer("sample_size", c.sample_size);
  r.string("act_fn", c.act_fn);
  r.one_of("act_fn", c.act_fn, {"silu", "swish", "gelu", "relu"});
  if (c.act_fn == "swish") c.act_fn = "silu";  // (diffusers' get_activation: the same)
  r.number("scaling_factor", c.scaling_factor);
  r.number("shift_factor", c.shift_factor);
  r.boolean("use_quant_conv", c.use_quant_conv);
  r.boolean("use_post_quant_conv", c.use_post_quant_conv);
  r.boolean("mid_block_add_attention", c.mid_block_add_attention);
  std::vector<std::string> down(c.block_out_channels.size(), "DownEncoderBlock2D");
  std::vector<std::string> up(c.block_out_channels.size(), "UpDecoderBlock2D");
  r.strings("down_block_types", down);
  r.strings("up_block_types", up);
  for (auto& t : down) r.one_of("down_block_types", t, {"DownEncoderBlock2D"});
  for (auto& t : up) r.one_of("up_block_types", t, {"UpDecoderBlock2D"});
  ONYX_CHECK(down.size() == c.block_out_channels.size() && up.size() == down.size(), what,
             ": down_block_types, up_block_types and block_out_channels must have the same length");
  ONYX_CHECK(!r.find("latents_mean") && !r.find("latents_std"), what,
             ": latents_mean / latents_std (per-channel latent statistics) are not supported");
  for (int64_t v : c.block_out_channels)
    ONYX_CHECK(v > 0 && v % c.norm_num_groups == 0, what, ": block_out_channels ", v,
               " is not a positive multiple of norm_num_groups ", c.norm_num_groups);
  ONYX_CHECK(c.in_channels > 0 && c.out_channels > 0 && c.latent_channels > 0 &&
                 c.layers_per_block > 0 && c.scaling_factor > 0,
             what, ": channels, layers_per_block and scaling_factor must be positive");
  return c;
}

std::shared_ptr<ir::Graph> build_vae(const VaeConfig& c, uint64_t seed) {
  GraphBuilder b = vae_builder(seed);
  VaeNet net{b, c};
  auto [mean, logvar] = net.gaussian(net.encoder(images_input(b, "sample", c.in_channels)));
  std::string y = net.decoder(mean);
  output(b, mean, "latent_mean", c.latent_channels);
  output(b, logvar, "latent_logvar", c.latent_channels);
  output(b, y, "model_output", c.out_channels);
  return std::make_shared<ir::Graph>(b.take());
}

std::shared_ptr<ir::Graph> load_vae_graph(const std::string& dir) {
  const fs::path config = fs::path(dir) / "config.json";
  auto g = build_vae(parse_vae_config(read_text(config), "'" + config.string() + "'"), 0);
  apply_weights(*g, fs::path(dir) / "diffusion_pytorch_model.safetensors");
  return g;
}

// ---- Vae ----

struct Vae::Impl {
  std::string dir;
  VaeConfig config;
  std::unique_ptr<runtime::Session> encoder, decoder;
  mutable std::mutex mu;  // one run at a time (each session's arena is its own, but reused)
};

std::shared_ptr<Vae> Vae::open(const std::string& dir) {
  const fs::path config = fs::path(dir) / "config.json",
                 weights = fs::path(dir) / "diffusion_pytorch_model.safetensors";
  ONYX_CHECK(fs::exists(config), "VAE folder '", dir, "' has no config.json");
  ONYX_CHECK(fs::exists(weights), "VAE folder '", dir, "' has no ", weights.filename().string(),
             " (a frozen VAE needs its weights)");
  auto v = std::shared_ptr<Vae>(new Vae());
  v->impl_ = std::make_unique<Impl>();
  Impl& m = *v->impl_;
  m.dir = dir;
  m.config = parse_vae_config(read_text(config), "'" + config.string() + "'");
  const VaeConfig& c = m.config;
  {  // the encoder: images -> mean, std
    GraphBuilder b = vae_builder(0);
    VaeNet net{b, c};
    auto [mean, logvar] = net.gaussian(net.encoder(images_input(b, "sample", c.in_channels)));
    b.set_scope("latent_dist");
    std::string std = b.op("Exp", {b.op("Mul", {logvar, b.scalar_f32(0.5f)})});
    output(b, mean, "latent_mean", c.latent_channels);
    output(b, std, "latent_std", c.latent_channels);
    auto g = std::make_shared<ir::Graph>(b.take());
    apply_weights(*g, weights, /*part=*/true);
    m.encoder = std::make_unique<runtime::Session>(g);
  }
  {  // the decoder: latents / scaling_factor + shift_factor -> images
    GraphBuilder b = vae_builder(0);
    VaeNet net{b, c};
    std::string z = images_input(b, "latents", c.latent_channels);
    b.set_scope("unscale");
    z = b.op("Div", {z, b.scalar_f32((float)c.scaling_factor)});
    if (c.shift_factor != 0) z = b.op("Add", {z, b.scalar_f32((float)c.shift_factor)});
    output(b, net.decoder(z), "images", c.out_channels);
    auto g = std::make_shared<ir::Graph>(b.take());
    apply_weights(*g, weights, /*part=*/true);
    m.decoder = std::make_unique<runtime::Session>(g);
  }
  m.encoder->check_supported();
  m.decoder->check_supported();
  return v;
}

std::shared_ptr<Vae> Vae::of_model(const std::string& unet_dir) {
  const fs::path own = fs::path(unet_dir) / "vae";
  if (fs::is_directory(own)) return open(own.string());
  const std::string root = pipeline_root(unet_dir);
  if (!root.empty() && fs::is_directory(fs::path(root) / "vae"))
    return open((fs::path(root) / "vae").string());
  return nullptr;
}

Vae::~Vae() = default;

std::pair<Tensor, Tensor> Vae::encode(const Tensor& images) const {
  const VaeConfig& c = impl_->config;
  ONYX_CHECK(
      images.dtype() == DType::Float32 && images.rank() == 4 && images.dim(1) == c.in_channels,
      "the VAE '", impl_->dir, "' encodes (B, ", c.in_channels, ", H, W) float32 images, got ",
      dtype_name(images.dtype()), " ", shape_str(images.shape()));
  const int64_t f = (int64_t)1 << (c.block_out_channels.size() - 1);
  ONYX_CHECK(images.dim(2) % f == 0 && images.dim(3) % f == 0, "the VAE '", impl_->dir,
             "' takes images whose sides are multiples of ", f, ", got ", images.dim(2), "x",
             images.dim(3));
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto out = impl_->encoder->run({{"sample", images}});
  return {out.at("latent_mean"), out.at("latent_std")};
}

Tensor Vae::decode(const Tensor& latents) const {
  const VaeConfig& c = impl_->config;
  ONYX_CHECK(latents.dtype() == DType::Float32 && latents.rank() == 4 &&
                 latents.dim(1) == c.latent_channels,
             "the VAE '", impl_->dir, "' decodes (B, ", c.latent_channels,
             ", h, w) float32 latents, got ", dtype_name(latents.dtype()), " ",
             shape_str(latents.shape()));
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->decoder->run({{"latents", latents}}).at("images");
}

Tensor Vae::decode_rows(const Tensor& latents, int64_t rows) const {
  const int64_t N = latents.rank() >= 1 ? latents.dim(0) : 0;
  if (N <= rows) return decode(latents);
  const int64_t per_latent = latents.numel() / N;
  Tensor out;
  for (int64_t b = 0; b < N; b += rows) {
    const int64_t e = std::min(N, b + rows);
    Shape s = latents.shape();
    s[0] = e - b;
    Tensor part(DType::Float32, s);
    std::copy(latents.data<float>() + b * per_latent, latents.data<float>() + e * per_latent,
              part.data<float>());
    Tensor images = decode(part);
    if (!b) {
      Shape all = images.shape();
      all[0] = N;
      out = Tensor(DType::Float32, all);
    }
    const int64_t per_image = images.numel() / (e - b);
    std::copy(images.data<float>(), images.data<float>() + images.numel(),
              out.data<float>() + b * per_image);
  }
  return out;
}

const VaeConfig& Vae::config() const { return impl_->config; }
const std::string& Vae::dir() const { return impl_->dir; }

}  // namespace onyx::diffusion

namespace onyx::diffusion {
namespace {

// The seed and the batch's pixels: the key of its latent draws.
uint64_t batch_key(uint64_t seed, const Tensor& t) {
  return kernels::fnv1a_bytes(kernels::kFnvOffset ^ seed, t.raw(), (size_t)t.nbytes());
}

}  // namespace

void decode_with_vae(const std::string& model_dir, const std::string& spec, SampleOptions& o) {
  if (spec == "none") return;
  std::shared_ptr<const Vae> vae = spec.empty() ? Vae::of_model(model_dir) : Vae::open(spec);
  if (vae) o.decode = [vae](const Tensor& latents) { return vae->decode_rows(latents, 4); };
}

void train_on_latents(Model& m, std::shared_ptr<const Vae> vae, uint64_t seed) {
  const VaeConfig& c = vae->config();
  for (auto& in : m.graph->inputs)
    if (in.name == "pixel_values" && in.has_shape && in.shape.size() == 4 && in.shape[1] > 0)
      ONYX_CHECK(in.shape[1] == c.latent_channels, "the VAE '", vae->dir(), "' makes ",
                 c.latent_channels, "-channel latents; the UNet takes ", in.shape[1],
                 " channels (in_channels)");
  auto previous = m.fill_defaults;
  m.fill_defaults = [vae, seed, previous](std::map<std::string, Tensor>& batch) {
    auto px = batch.find("pixel_values");
    ONYX_CHECK(px != batch.end(), "latent diffusion training needs pixel_values (the images)");
    auto [mean, std] = vae->encode(px->second);
    const VaeConfig& c = vae->config();
    Tensor z(DType::Float32, mean.shape());
    auto given = batch.find("latent_noise");
    if (given != batch.end()) {
      ONYX_CHECK(given->second.dtype() == DType::Float32 && given->second.shape() == mean.shape(),
                 "latent_noise must be float32 ", shape_str(mean.shape()), ", got ",
                 shape_str(given->second.shape()));
      std::copy(given->second.data<float>(), given->second.data<float>() + z.numel(),
                z.data<float>());
      batch.erase(given);
    } else {
      const auto key =
          kernels::Philox4x32::key_from(kernels::mix_seed(batch_key(seed, px->second)));
      kernels::philox_normals(key, 0, z.data<float>(), z.numel());
    }
    const float* mu = mean.data<float>();
    const float* sd = std.data<float>();
    float* o = z.data<float>();
    for (int64_t i = 0; i < z.numel(); ++i)
      o[i] = (mu[i] + sd[i] * o[i] - (float)c.shift_factor) * (float)c.scaling_factor;
    px->second = z;
    if (previous) previous(batch);
  };
  m.side_folders["vae"] = vae->dir();
}

}  // namespace onyx::diffusion
