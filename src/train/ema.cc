// train/ema.cc — diffusers' EMAModel in the Trainer (Trainer::set_ema, onyx/trainer.h): the shadow
// is a flat buffer in the parameters' layout, updated in one pass after every optimizer step as
// EMAModel.step does in float32 (s -= (float)(1 - decay) * (s - p)), kept in a checkpoint's ema/
// folder (the weights file and config.json: diffusers' unet_ema folder, which
// UNet2DModel.from_pretrained opens) and written as the model by save_model, as the scripts save
// their final pipeline with the EMA weights copied in.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "io/safetensors.h"
#include "runtime/parallel.h"
#include "train/trainer_internal.h"

namespace onyx {
namespace fs = std::filesystem;

double EmaConfig::decay_at(int64_t optimization_step) const {
  const int64_t step = std::max<int64_t>(0, optimization_step - update_after_step - 1);
  if (step <= 0) return 0.0;
  double d = use_ema_warmup ? 1 - std::pow(1 + (double)step / inv_gamma, -power)
                            : (1.0 + (double)step) / (10.0 + (double)step);
  return std::max(std::min(d, decay), min_decay);
}

void Trainer::set_ema(const EmaConfig& c) {
  ONYX_CHECK(c.decay >= 0 && c.decay <= 1 && c.min_decay >= 0 && c.min_decay <= c.decay,
             "use_ema: need 0 <= ema_min_decay <= ema_max_decay <= 1, got ", c.min_decay, ", ",
             c.decay);
  ONYX_CHECK(c.inv_gamma > 0 && c.power > 0, "use_ema: ema_inv_gamma and ema_power must be > 0");
  impl_->ema_config = c;
}

void Trainer::start_ema() {
  auto& I = *impl_;
  if (!I.ema_config.enabled) return;
  I.ema = std::make_unique<train::FlatBuffer>(I.ts->params().layout());
  std::copy_n(I.ts->params().flat().data<float>(), I.ema->layout().numel,
              I.ema->flat().data<float>());
}

void Trainer::update_ema() {
  auto& I = *impl_;
  if (!I.ema) return;
  const float omd = (float)(1.0 - I.ema_config.decay_at(state_.global_step));
  float* s = I.ema->flat().data<float>();
  const float* p = I.ts->params().flat().data<float>();
  const int64_t n = I.ema->layout().numel;
  runtime::parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) s[i] = s[i] - omd * (s[i] - p[i]);
  });
}

void Trainer::save_ema(const std::string& checkpoint_dir) {
  auto& I = *impl_;
  if (!I.ema) return;
  fs::path d = fs::path(checkpoint_dir) / "ema";
  fs::create_directories(d);
  io::save_safetensors((d / model_.weights_file).string(), I.ema->views(), {{"format", "pt"}});
  if (!model_.config_json.empty())
    io::write_file_atomic((d / "config.json").string(), model_.config_json);
}

void Trainer::load_ema(const std::string& checkpoint_dir) {
  auto& I = *impl_;
  if (!I.ema) return;
  fs::path f = fs::path(checkpoint_dir) / "ema" / model_.weights_file;
  ONYX_CHECK(fs::exists(f), "checkpoint '", checkpoint_dir, "' has no ema/", model_.weights_file,
             " (this run keeps an EMA: use_ema)");
  auto saved = io::load_safetensors(f.string()).tensors;
  for (auto& [name, view] : I.ema->views()) {
    auto it = saved.find(name);
    ONYX_CHECK(it != saved.end() && it->second.shape() == view.shape() &&
                   it->second.dtype() == DType::Float32,
               "'", f.string(), "': no float32 '", name, "' of shape ", shape_str(view.shape()));
    std::copy_n(it->second.data<float>(), view.numel(), I.ema->view(name).data<float>());
  }
}

}  // namespace onyx
