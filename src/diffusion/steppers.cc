// diffusion/steppers.cc — see steppers.h: DDPM and DDIM (noise_schedule.h), DPM-Solver
// (dpm_solver.h), Euler and Heun (euler.h) behind Stepper.
#include "diffusion/steppers.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "diffusion/dpm_solver.h"
#include "diffusion/euler.h"
#include "diffusion/unipc.h"
#include "onyx/error.h"

namespace onyx::diffusion {
namespace {

Tensor int_timesteps(int64_t t, int64_t B) {
  return Tensor::from_vector<int64_t>(DType::Int64, {B}, std::vector<int64_t>(B, t));
}

class DdpmStepper : public Stepper {
 public:
  DdpmStepper(const NoiseSchedule& s, int64_t k) : s_(s), ts_(s.inference_timesteps(k)) {}
  int64_t steps() const override { return (int64_t)ts_.size(); }
  bool draws_noise() const override { return true; }
  Tensor timestep(int64_t i, int64_t B) const override { return int_timesteps(ts_[i], B); }
  void step(int64_t i, const float* y, const float* noise, float* x, int64_t n) override {
    s_.ddpm_step(y, ts_[i], i + 1 < steps() ? ts_[i + 1] : -1, noise, x, n);
  }

 private:
  const NoiseSchedule& s_;
  std::vector<int64_t> ts_;
};

class DdimStepper : public Stepper {
 public:
  DdimStepper(const NoiseSchedule& s, int64_t k, double eta)
      : s_(s), ts_(s.inference_timesteps(k)), eta_((float)eta) {}
  int64_t steps() const override { return (int64_t)ts_.size(); }
  bool draws_noise() const override { return eta_ > 0; }
  Tensor timestep(int64_t i, int64_t B) const override { return int_timesteps(ts_[i], B); }
  void step(int64_t i, const float* y, const float* noise, float* x, int64_t n) override {
    s_.ddim_step(y, ts_[i], ts_[i] - s_.steps() / steps(), eta_, noise, x, n);
  }

 private:
  const NoiseSchedule& s_;
  std::vector<int64_t> ts_;
  float eta_;
};

class DpmStepper : public Stepper {
 public:
  DpmStepper(const NoiseSchedule& s, int64_t k) : solver_(s, k) {}
  int64_t steps() const override { return (int64_t)solver_.timesteps().size(); }
  Tensor timestep(int64_t i, int64_t B) const override {
    return int_timesteps(solver_.timesteps()[i], B);
  }
  bool draws_noise() const override { return solver_.sde(); }
  void step(int64_t, const float* y, const float* noise, float* x, int64_t n) override {
    solver_.step(y, noise, x, n);
  }

 private:
  DpmSolver solver_;
};

class UniPcStepper : public Stepper {
 public:
  UniPcStepper(const NoiseSchedule& s, int64_t k) : solver_(s, k) {}
  int64_t steps() const override { return (int64_t)solver_.timesteps().size(); }
  Tensor timestep(int64_t i, int64_t B) const override {
    return int_timesteps(solver_.timesteps()[i], B);
  }
  void step(int64_t, const float* y, const float*, float* x, int64_t n) override {
    solver_.step(y, x, n);
  }

 private:
  UniPc solver_;
};

// Euler and Heun: float32 timesteps, the denoiser's input scaled by scale_model_input.
template <class Sampler>
class SigmaStepper : public Stepper {
 public:
  int64_t steps() const override { return (int64_t)sampler_.timesteps().size(); }
  bool float_timesteps() const override { return true; }
  float init_noise_sigma() const override { return sampler_.init_noise_sigma(); }
  Tensor timestep(int64_t i, int64_t B) const override {
    return Tensor::from_vector<float>(DType::Float32, {B},
                                      std::vector<float>(B, sampler_.timesteps()[i]));
  }
  Tensor model_input(int64_t i, const Tensor& x) const override {
    Tensor in(DType::Float32, x.shape());
    sampler_.scale_input(i, x.data<float>(), in.data<float>(), x.numel());
    return in;
  }

 protected:
  explicit SigmaStepper(Sampler sampler) : sampler_(std::move(sampler)) {}
  Sampler sampler_;
};

class EulerStepper : public SigmaStepper<EulerSampler> {
 public:
  EulerStepper(const NoiseSchedule& s, int64_t k, bool ancestral)
      : SigmaStepper(EulerSampler(s, k, ancestral)), ancestral_(ancestral) {}
  bool draws_noise() const override { return ancestral_; }
  void step(int64_t i, const float* y, const float* noise, float* x, int64_t n) override {
    sampler_.step(i, y, noise, x, n);
  }

 private:
  bool ancestral_;
};

class HeunStepper : public SigmaStepper<HeunSampler> {
 public:
  HeunStepper(const NoiseSchedule& s, int64_t k) : SigmaStepper(HeunSampler(s, k)) {}
  void step(int64_t i, const float* y, const float*, float* x, int64_t n) override {
    sampler_.step(i, y, x, n);
  }
};

class LmsStepper : public SigmaStepper<LmsSampler> {
 public:
  LmsStepper(const NoiseSchedule& s, int64_t k) : SigmaStepper(LmsSampler(s, k)) {}
  void step(int64_t i, const float* y, const float*, float* x, int64_t n) override {
    sampler_.step(i, y, x, n);
  }
};

// PNDMScheduler: PLMS, the linear multistep update on the last four model outputs — after a
// first step that averages the first two outputs (step_plms's counter 1) with skip_prk_steps
// (Stable Diffusion 1.x's folders), else after the pseudo Runge-Kutta warm-up (step_prk: three
// fourth-order steps of four model calls each, on the four largest timesteps and their
// midpoints; the class's default). Float32 as diffusers' tensors.
class PndmStepper : public Stepper {
 public:
  PndmStepper(const NoiseSchedule& s, int64_t k) : s_(s), ratio_(s.steps() / k) {
    const ScheduleConfig& c = s.config();
    ONYX_CHECK(c.skip_prk_steps || k >= 4, c.origin, ": PNDMScheduler's Runge-Kutta warm-up ",
               "(skip_prk_steps false) needs num_inference_steps >= 4, got ", k);
    ONYX_CHECK(c.prediction_type == "epsilon" || c.prediction_type == "v_prediction", c.origin,
               ": PNDMScheduler takes prediction_type epsilon or v_prediction, not ",
               c.prediction_type);
    final_ = c.set_alpha_to_one_given && c.set_alpha_to_one ? 1.0f : s.alphas_cumprod()[0];
    std::vector<int64_t> t = s.inference_timesteps(k);  // largest first
    std::reverse(t.begin(), t.end());
    if (!c.skip_prk_steps) {
      // (t[-4:].repeat(2) + tile([0, T // k // 2], 4))[:-1].repeat(2)[1:-1][::-1], then
      // t[:-3][::-1]
      half_ = s.steps() / k / 2;
      std::vector<int64_t> pairs, twice;
      for (int64_t j = k - 4; j < k; ++j) pairs.insert(pairs.end(), {t[j], t[j] + half_});
      pairs.pop_back();
      for (int64_t v : pairs) twice.insert(twice.end(), {v, v});
      prk_.assign(twice.rbegin() + 1, twice.rend() - 1);
      ts_ = prk_;
      for (int64_t j = k - 4; j >= 0; --j) ts_.push_back(t[j]);
      counter_ = 0;
      return;
    }
    // concatenate(t[:-1], t[-2:-1], t[-1:])[::-1]: the second-largest timestep twice
    std::vector<int64_t> plms(t.begin(), t.end() - 1);
    if (k >= 2) plms.push_back(t[k - 2]);
    plms.push_back(t[k - 1]);
    ts_.assign(plms.rbegin(), plms.rend());
  }
  int64_t steps() const override { return (int64_t)ts_.size(); }
  Tensor timestep(int64_t i, int64_t B) const override { return int_timesteps(ts_[i], B); }
  void step(int64_t i, const float* m, const float*, float* x, int64_t n) override {
    if (counter_ < (int64_t)prk_.size()) return step_prk(m, x, n);
    int64_t t = ts_[i], prev = t - ratio_;
    if (counter_ == 1) {  // the repeated timestep: from the first sample, with the mean output
      prev = t;
      t = t + ratio_;
    } else {
      if (ets_.size() > 3) ets_.erase(ets_.begin());
      ets_.emplace_back(m, m + n);
    }
    if (counter_ == 0) cur_sample_.assign(x, x + n);
    const float* sample = ets_.size() == 1 && counter_ == 1 ? cur_sample_.data() : x;
    std::vector<float> e(n), out(n);
    for (int64_t j = 0; j < n; ++j) e[j] = combined(m, j);
    prev_sample(sample, t, prev, e.data(), out.data(), n);
    std::copy(out.begin(), out.end(), x);
    ++counter_;
  }

 private:
  // step_prk: the four calls of a Runge-Kutta step each move from its first sample (to the
  // midpoint, the midpoint, the end, the end), the last with the outputs weighted 1/6, 1/3, 1/3,
  // 1/6; the first call's output is kept for PLMS.
  void step_prk(const float* m, float* x, int64_t n) {
    const int64_t phase = counter_ % 4, t_in = prk_[counter_];
    const int64_t prev = t_in - (counter_ % 2 ? 0 : half_);
    const int64_t t = prk_[counter_ / 4 * 4];
    const float w = phase == 0 || phase == 3 ? (float)(1.0 / 6) : (float)(1.0 / 3);
    std::vector<float> out(n), mo(m, m + n);
    if (phase == 0) {
      prk_sum_.assign(n, 0.0f);
      ets_.emplace_back(m, m + n);
      prk_sample_.assign(x, x + n);
    }
    for (int64_t j = 0; j < n; ++j) {
      if (phase < 3)
        prk_sum_[j] = prk_sum_[j] + w * m[j];
      else
        mo[j] = prk_sum_[j] + w * m[j];
    }
    prev_sample(prk_sample_.data(), t, prev, mo.data(), out.data(), n);
    std::copy(out.begin(), out.end(), x);
    ++counter_;
  }

  // step_plms's model output at element j: the outputs so far combined (Adams-Bashforth weights).
  float combined(const float* m, int64_t j) const {
    const size_t k = ets_.size();
    auto e = [&](size_t back) { return ets_[k - back][j]; };
    if (k == 1) return counter_ == 0 ? m[j] : (m[j] + e(1)) / 2.0f;
    if (k == 2) return (3.0f * e(1) - e(2)) / 2.0f;
    if (k == 3) return (23.0f * e(1) - 16.0f * e(2) + 5.0f * e(3)) / 12.0f;
    return (float)(1.0 / 24) * (55.0f * e(1) - 59.0f * e(2) + 37.0f * e(3) - 9.0f * e(4));
  }

  // _get_prev_sample: formula (9) of the PNDM paper.
  void prev_sample(const float* x, int64_t t, int64_t prev, const float* m, float* out,
                   int64_t n) const {
    const float a = s_.alphas_cumprod().at(t);
    const float a_prev = prev >= 0 ? s_.alphas_cumprod().at(prev) : final_;
    const float b = 1.0f - a, b_prev = 1.0f - a_prev;
    const float sample_coeff = std::sqrt(a_prev / a);
    const float denom = a * std::sqrt(b_prev) + std::sqrt(a * b * a_prev);
    const bool v = s_.config().prediction_type == "v_prediction";
    const float sa = std::sqrt(a), sb = std::sqrt(b);
    for (int64_t j = 0; j < n; ++j) {
      const float mo = v ? sa * m[j] + sb * x[j] : m[j];
      out[j] = sample_coeff * x[j] - (a_prev - a) * mo / denom;
    }
  }

  const NoiseSchedule& s_;
  int64_t ratio_;
  float final_ = 1.0f;
  std::vector<int64_t> ts_;
  std::vector<std::vector<float>> ets_;
  std::vector<float> cur_sample_;
  std::vector<int64_t> prk_;                 // the Runge-Kutta calls' timesteps (none: PLMS only)
  int64_t half_ = 0;                         // T // k // 2: a midpoint's offset
  std::vector<float> prk_sum_, prk_sample_;  // the weighted outputs so far, the step's start
  int64_t counter_ = 0;
};

}  // namespace

const std::vector<std::string>& Stepper::names() {
  static const std::vector<std::string> n = {
      "ddpm", "ddim", "dpmsolver", "euler", "euler_ancestral", "heun", "lms", "pndm", "unipc"};
  return n;
}

std::string Stepper::of_config(const ScheduleConfig& c) {
  static const std::map<std::string, std::string> by_class = {
      {"", "ddpm"},
      {"DDPMScheduler", "ddpm"},
      {"DDIMScheduler", "ddim"},
      {"DPMSolverMultistepScheduler", "dpmsolver"},
      {"EulerDiscreteScheduler", "euler"},
      {"EulerAncestralDiscreteScheduler", "euler_ancestral"},
      {"HeunDiscreteScheduler", "heun"},
      {"LMSDiscreteScheduler", "lms"},
      {"PNDMScheduler", "pndm"},
      {"UniPCMultistepScheduler", "unipc"}};
  auto it = by_class.find(c.class_name);
  if (it != by_class.end()) return it->second;
  std::string all;
  for (const auto& n : names()) all += (all.empty() ? "" : ", ") + n;
  throw Error(cat(c.origin, " names ", c.class_name,
                  ", which onyx does not step: choose one with --scheduler (", all,
                  "; each made from this config, as from_config makes it)"));
}

std::unique_ptr<Stepper> Stepper::make(const std::string& name, const NoiseSchedule& s,
                                       int64_t steps, double eta) {
  const int64_t k = steps ? steps : name == "ddpm" ? 1000 : 50;
  if (name == "ddpm") return std::make_unique<DdpmStepper>(s, k);
  if (name == "ddim") return std::make_unique<DdimStepper>(s, k, eta);
  if (name == "dpmsolver") return std::make_unique<DpmStepper>(s, k);
  if (name == "pndm") return std::make_unique<PndmStepper>(s, k);
  if (name == "unipc") return std::make_unique<UniPcStepper>(s, k);
  if (name == "heun") return std::make_unique<HeunStepper>(s, k);
  if (name == "lms") return std::make_unique<LmsStepper>(s, k);
  if (name == "euler" || name == "euler_ancestral")
    return std::make_unique<EulerStepper>(s, k, name == "euler_ancestral");
  std::string all;
  for (const auto& n : names()) all += (all.empty() ? "" : ", ") + n;
  throw Error(cat("scheduler '", name, "' is not supported (", all, ")"));
}

}  // namespace onyx::diffusion
