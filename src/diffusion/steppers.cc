// diffusion/steppers.cc — see steppers.h: DDPM and DDIM (noise_schedule.h), DPM-Solver
// (dpm_solver.h) and Euler (euler.h) behind Stepper.
#include "diffusion/steppers.h"

#include <map>

#include "diffusion/dpm_solver.h"
#include "diffusion/euler.h"
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
  void step(int64_t, const float* y, const float*, float* x, int64_t n) override {
    solver_.step(y, x, n);
  }

 private:
  DpmSolver solver_;
};

class EulerStepper : public Stepper {
 public:
  EulerStepper(const NoiseSchedule& s, int64_t k, bool ancestral)
      : euler_(s, k, ancestral), ancestral_(ancestral) {}
  int64_t steps() const override { return (int64_t)euler_.timesteps().size(); }
  bool float_timesteps() const override { return true; }
  bool draws_noise() const override { return ancestral_; }
  float init_noise_sigma() const override { return euler_.init_noise_sigma(); }
  Tensor timestep(int64_t i, int64_t B) const override {
    return Tensor::from_vector<float>(DType::Float32, {B},
                                      std::vector<float>(B, euler_.timesteps()[i]));
  }
  Tensor model_input(int64_t i, const Tensor& x) const override {
    Tensor in(DType::Float32, x.shape());
    euler_.scale_input(i, x.data<float>(), in.data<float>(), x.numel());
    return in;
  }
  void step(int64_t i, const float* y, const float* noise, float* x, int64_t n) override {
    euler_.step(i, y, noise, x, n);
  }

 private:
  EulerSampler euler_;
  bool ancestral_;
};

}  // namespace

const std::vector<std::string>& Stepper::names() {
  static const std::vector<std::string> n = {"ddpm", "ddim", "dpmsolver", "euler",
                                             "euler_ancestral"};
  return n;
}

std::string Stepper::of_config(const ScheduleConfig& c) {
  static const std::map<std::string, std::string> by_class = {
      {"", "ddpm"},
      {"DDPMScheduler", "ddpm"},
      {"DDIMScheduler", "ddim"},
      {"DPMSolverMultistepScheduler", "dpmsolver"},
      {"EulerDiscreteScheduler", "euler"},
      {"EulerAncestralDiscreteScheduler", "euler_ancestral"}};
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
  if (name == "euler" || name == "euler_ancestral")
    return std::make_unique<EulerStepper>(s, k, name == "euler_ancestral");
  std::string all;
  for (const auto& n : names()) all += (all.empty() ? "" : ", ") + n;
  throw Error(cat("scheduler '", name, "' is not supported (", all, ")"));
}

}  // namespace onyx::diffusion
