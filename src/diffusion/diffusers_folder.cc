// diffusion/diffusers_folder.cc — see diffusers_folder.h.
#include "diffusion/diffusers_folder.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/safetensors.h"
#include "ir/graph.h"
#include "models/hf_weights.h"
#include "onyx/error.h"

namespace onyx::diffusion {
namespace fs = std::filesystem;
namespace {

constexpr const char* kWeights = "diffusion_pytorch_model.safetensors";

}  // namespace

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  ONYX_CHECK(f, "'", p.string(), "': cannot open");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void apply_weights(ir::Graph& g, const fs::path& file, bool part) {
  auto st = io::load_safetensors(file.string());
  std::string missing, unexpected;
  int n_missing = 0, n_unexpected = 0;
  for (auto& [name, t] : st.tensors) {
    auto it = g.initializers.find(name);
    if (it == g.initializers.end()) {
      if (!part && n_unexpected++ < 5) unexpected += (unexpected.empty() ? "" : ", ") + name;
      continue;
    }
    ONYX_CHECK(t.shape() == it->second.shape(), "'", file.string(), "': tensor '", name,
               "' has shape ", shape_str(t.shape()), ", the model's config gives ",
               shape_str(it->second.shape()));
    ONYX_CHECK(is_float(t.dtype()), "'", file.string(), "': tensor '", name, "' is ",
               dtype_name(t.dtype()), ", not a float type");
    it->second = models::to_float32(t);
  }
  for (auto& [name, t] : g.initializers)
    if (is_float(t.dtype()) && name.find('.') != std::string::npos && !st.tensors.count(name) &&
        n_missing++ < 5)
      missing += (missing.empty() ? "" : ", ") + name;
  ONYX_CHECK(
      !n_missing && !n_unexpected, "'", file.string(), "' does not match config.json: ",
      n_missing ? cat(n_missing, " missing (", missing, n_missing > 5 ? ", ..." : "", ")") : "",
      n_missing && n_unexpected ? "; " : "",
      n_unexpected ? cat(n_unexpected, " not in the model (", unexpected,
                         n_unexpected > 5 ? ", ..." : "", ")")
                   : "");
}

std::string pipeline_root(const std::string& model_dir) {
  const fs::path dir = fs::absolute(fs::path(model_dir)).lexically_normal();
  const fs::path d = dir.has_filename() ? dir : dir.parent_path();  // (a trailing slash)
  const fs::path parent = d.parent_path();
  if (fs::is_regular_file(parent / "model_index.json") || d.filename() == "unet")
    return parent.string();
  return "";
}

bool is_diffusers_folder(const std::string& dir) {
  fs::path p = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(p)) return false;
  return !diffusers_class_name(read_text(p)).empty();
}

namespace {

// config.json's text, its `what` for messages, and the class it names.
struct FolderConfig {
  std::string text, what, class_name;
};

FolderConfig folder_config(const std::string& dir) {
  fs::path p = fs::path(dir) / "config.json";
  FolderConfig f{read_text(p), "'" + p.string() + "'", ""};
  f.class_name = diffusers_class_name(f.text);
  if (f.class_name.empty()) parse_unet2d_config(f.text, f.what);  // throws: names the problem
  return f;
}

}  // namespace

ScheduleConfig find_schedule_config(const std::string& model_dir, const std::string& spec) {
  fs::path p;
  if (!spec.empty()) {
    p = fs::is_directory(spec) ? fs::path(spec) / "scheduler_config.json" : fs::path(spec);
    ONYX_CHECK(fs::is_regular_file(p), "noise_scheduler: '", p.string(), "' does not exist");
  } else {
    for (fs::path c : {fs::path(model_dir) / "scheduler_config.json",
                       fs::path(model_dir) / ".." / "scheduler" / "scheduler_config.json"})
      if (fs::is_regular_file(c)) {
        p = c;
        break;
      }
    if (p.empty()) return ScheduleConfig{};
  }
  return parse_schedule_config(read_text(p), "'" + p.string() + "'");
}

Model load_denoiser_training(const std::string& dir, const Objective& o, uint64_t seed,
                             double class_dropout_prob) {
  FolderConfig f = folder_config(dir);
  Model m = f.class_name == "DiTTransformer2DModel"
                ? build_dit_training(parse_dit_config(f.text, f.what), o, seed, class_dropout_prob)
                : build_unet2d_training(parse_unet2d_config(f.text, f.what), o, seed);
  fs::path w = fs::path(dir) / kWeights;
  if (fs::exists(w)) apply_weights(*m.graph, w);
  m.source = dir;
  return m;
}

Denoiser load_denoiser(const std::string& dir) {
  FolderConfig f = folder_config(dir);
  Denoiser d;
  d.class_name = f.class_name;
  if (f.class_name == "DiTTransformer2DModel") {
    DiTConfig c = parse_dit_config(f.text, f.what);
    d.graph = build_dit(c, 0);
    d.in_channels = c.in_channels;
    d.out_channels = c.out();
    d.sample_size = c.sample_size;
    d.size_multiple = c.sample_size;  // its positions are for sample_size only
    d.classes = c.num_embeds_ada_norm;
    d.null_class = true;
  } else {
    UNet2DConfig c = parse_unet2d_config(f.text, f.what);
    d.graph = build_unet2d(c, 0);
    d.in_channels = c.in_channels;
    d.out_channels = c.out_channels;
    d.sample_size = c.sample_size;
    d.size_multiple = (int64_t)1 << (c.block_out_channels.size() - 1);
    d.classes = c.num_class_embeds;
    d.cross_attention_dim = c.conditional ? c.cross_attention_dim : 0;
  }
  fs::path w = fs::path(dir) / kWeights;
  ONYX_CHECK(fs::exists(w), "'", dir, "' has no ", kWeights, " (a trained model to sample from)");
  apply_weights(*d.graph, w);
  return d;
}

}  // namespace onyx::diffusion
