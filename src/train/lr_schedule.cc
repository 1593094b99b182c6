// train/lr_schedule.cc — Transformers' schedule lambdas (optimization.py), evaluated in double in
// the same operation order as the Python, so lr_at gives the same bits as LambdaLR.
// Contraction is off so that, e.g., polynomial's lr_range * pct^power + lr_end stays two roundings.
#pragma GCC optimize("fp-contract=off")

#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "onyx/error.h"

namespace onyx::train {
namespace {

constexpr double kPi = 3.141592653589793;  // math.pi

bool needs_total_steps(const std::string& type) {
  return type == "linear" || type == "cosine" || type == "cosine_with_restarts" ||
         type == "polynomial";
}

double warmup_lambda(int64_t step, int64_t warmup) {
  return (double)step / (double)std::max<int64_t>(1, warmup);
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"linear",      "cosine",   "cosine_with_restarts",
                                                 "polynomial",  "constant", "constant_with_warmup",
                                                 "inverse_sqrt"};
  return names;
}

void validate_schedule(const ScheduleConfig& c) {
  const auto& names = schedule_names();
  if (std::find(names.begin(), names.end(), c.type) == names.end()) {
    std::string valid;
    for (auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
    throw Error(cat("unknown lr schedule '", c.type, "' (valid: ", valid, ")"));
  }
  ONYX_CHECK(c.warmup_steps >= 0, "lr schedule '", c.type, "': negative warmup_steps ",
             c.warmup_steps);
  ONYX_CHECK(c.warmup_ratio >= 0 && c.warmup_ratio <= 1, "lr schedule '", c.type,
             "': warmup_ratio ", c.warmup_ratio, " is not in [0, 1]");
  ONYX_CHECK(c.total_steps >= 0, "lr schedule '", c.type, "': negative total_steps ",
             c.total_steps);
  ONYX_CHECK(!needs_total_steps(c.type) || c.total_steps > 0, "lr schedule '", c.type,
             "' needs total_steps > 0");
  ONYX_CHECK(c.timescale >= 0, "lr schedule '", c.type, "': negative timescale ", c.timescale);
  if (c.type == "polynomial")
    ONYX_CHECK(c.base_lr > c.lr_end, "lr schedule 'polynomial': lr_end (", c.lr_end,
               ") must be smaller than the initial lr (", c.base_lr, ")");
}

int64_t effective_warmup_steps(const ScheduleConfig& c) {
  if (c.warmup_steps > 0) return c.warmup_steps;
  return (int64_t)std::ceil((double)c.total_steps * c.warmup_ratio);
}

double lr_multiplier(const ScheduleConfig& c, int64_t step) {
  validate_schedule(c);
  ONYX_CHECK(step >= 0, "lr schedule '", c.type, "': negative step ", step);
  const int64_t warmup = effective_warmup_steps(c);
  const int64_t total = c.total_steps;
  const std::string& type = c.type;

  if (type == "constant") return 1.0;  // get_scheduler ignores warmup for "constant"
  if (type == "constant_with_warmup")
    return step < warmup ? (double)step / std::max(1.0, (double)warmup) : 1.0;
  if (step < warmup) return warmup_lambda(step, warmup);  // every other type warms up alike

  if (type == "linear")
    return std::max(0.0, (double)(total - step) / (double)std::max<int64_t>(1, total - warmup));
  if (type == "cosine" || type == "cosine_with_restarts") {
    double progress = (double)(step - warmup) / (double)std::max<int64_t>(1, total - warmup);
    if (type == "cosine") {
      double cycles = c.num_cycles < 0 ? 0.5 : c.num_cycles;
      return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress)));
    }
    double cycles = c.num_cycles < 0 ? 1.0 : c.num_cycles;
    if (progress >= 1.0) return 0.0;
    return std::max(0.0, 0.5 * (1.0 + std::cos(kPi * std::fmod(cycles * progress, 1.0))));
  }
  if (type == "polynomial") {
    double lr_init = c.base_lr;
    if (step > total) return c.lr_end / lr_init;
    double lr_range = lr_init - c.lr_end;
    int64_t decay_steps = total - warmup;
    // Transformers divides by zero when step == total == warmup; the limit is lr_end.
    double pct_remaining =
        decay_steps > 0 ? 1 - (double)(step - warmup) / (double)decay_steps : 0.0;
    double decay = lr_range * std::pow(pct_remaining, c.power) + c.lr_end;
    return decay / lr_init;
  }
  // inverse_sqrt
  int64_t timescale = c.timescale > 0 ? c.timescale : (warmup != 0 ? warmup : 10000);
  int64_t shift = timescale - warmup;
  return 1.0 / std::sqrt((double)(step + shift) / (double)timescale);
}

double lr_at(const ScheduleConfig& c, int64_t step) { return c.base_lr * lr_multiplier(c, step); }

}  // namespace onyx::train
