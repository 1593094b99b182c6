// train/lr_schedule.cc — Transformers' schedule lambdas (optimization.py), evaluated in double in
// the same operation order as the Python, so lr_at gives the same bits as LambdaLR.
// Contraction is off so that, e.g., polynomial's lr_range * pct^power + lr_end stays two roundings.
#pragma GCC optimize("fp-contract=off")

#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "onyx/error.h"

namespace onyx::train {
namespace {

constexpr double kPi = 3.141592653589793;  // math.pi

bool needs_total_steps(const std::string& type) {
  return type == "linear" || type == "cosine" || type == "cosine_with_restarts" ||
         type == "polynomial" || type == "cosine_with_min_lr" ||
         type == "cosine_warmup_with_min_lr";
}

double warmup_lambda(int64_t step, int64_t warmup) {
  return (double)step / (double)std::max<int64_t>(1, warmup);
}

// min_lr_rate, or min_lr / the base lr (get_cosine_with_min_lr_schedule_with_warmup).
double min_rate(const ScheduleConfig& c) {
  return c.min_lr >= 0 ? c.min_lr / c.base_lr : c.min_lr_rate;
}

// _get_cosine_with_min_lr_schedule_with_warmup_lr_rate_lambda: its own warmup (from
// warmup_lr_rate, or (step + 1) / warmup) and a progress counted from warmup - 1.
double cosine_warmup_with_min_lr(const ScheduleConfig& c, int64_t step_i, int64_t warmup_i) {
  const double step = (double)step_i, warmup = (double)warmup_i, total = (double)c.total_steps;
  if (step < warmup) {
    if (c.warmup_lr_rate < 0) return (step + 1.0) / std::max(1.0, warmup);
    return c.warmup_lr_rate +
           (1.0 - c.warmup_lr_rate) * step / (double)std::max<int64_t>(1, warmup_i - 1);
  }
  const double progress = (step - warmup + 1.0) / std::max(1.0, total - warmup);
  const double cycles = c.num_cycles < 0 ? 0.5 : c.num_cycles;
  double factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress));
  factor = factor * (1 - min_rate(c)) + min_rate(c);
  return std::max(0.0, factor);
}

// _get_wsd_scheduler_lambda: warmup (from min_lr_ratio), stable, decay (to min_lr_ratio).
double warmup_stable_decay(const ScheduleConfig& c, int64_t step, int64_t warmup) {
  const int64_t decay = c.num_decay_steps;
  const int64_t stable =
      c.num_stable_steps >= 0 ? c.num_stable_steps : c.total_steps - warmup - decay;
  const double cycles = c.num_cycles < 0 ? 0.5 : c.num_cycles;
  auto shaped = [&](double factor) {
    factor = factor * (1.0 - c.min_lr_ratio) + c.min_lr_ratio;
    return std::max(0.0, factor);
  };
  if (step < warmup) {
    const double progress = (double)step / (double)std::max<int64_t>(1, warmup);
    if (c.warmup_type == "linear") return shaped(progress);
    if (c.warmup_type == "cosine") return shaped(0.5 * (1.0 - std::cos(kPi * progress)));
    return shaped(1.0 - std::sqrt(1.0 - progress));
  }
  if (step < warmup + stable) return 1.0;
  if (step < warmup + stable + decay) {
    const double progress = (double)(step - warmup - stable) / (double)std::max<int64_t>(1, decay);
    if (c.decay_type == "linear") return shaped(1.0 - progress);
    if (c.decay_type == "cosine")
      return shaped(0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress)));
    return shaped(1.0 - std::sqrt(progress));
  }
  return c.min_lr_ratio;
}

// One of GreedyLR's keyword arguments (min_lr / max_lr: a number, or a list of one per parameter
// group: onyx has one).
void set_greedy_kwarg(ScheduleConfig::Greedy& g, const std::string& k, const nlohmann::json& v) {
  auto fail = [&](const char* what) {
    throw Error(cat("lr_scheduler_kwargs: '", k, "' must be ", what, ", got ", v.dump()));
  };
  if (k == "mode" || k == "threshold_mode") {
    if (!v.is_string()) fail("a string");
    (k == "mode" ? g.mode : g.threshold_mode) = v.get<std::string>();
  } else if (k == "verbose" || k == "smooth") {
    if (!v.is_boolean()) fail("true or false");
    (k == "verbose" ? g.verbose : g.smooth) = v.get<bool>();
  } else if (k == "patience" || k == "cooldown" || k == "warmup" || k == "window_size" ||
             k == "reset_start") {
    if (!v.is_number_integer()) fail("an integer");
    (k == "patience"      ? g.patience
     : k == "cooldown"    ? g.cooldown
     : k == "warmup"      ? g.warmup
     : k == "window_size" ? g.window_size
                          : g.reset_start) = v.get<int64_t>();
  } else {
    const nlohmann::json& x = v.is_array() && v.size() == 1 ? v[0] : v;
    if (v.is_array() && (k == "min_lr" || k == "max_lr") && v.size() != 1)
      throw Error(cat("lr_scheduler_kwargs: expected 1 ", k, "s, got ", v.size(),
                      " (onyx's optimizer has one parameter group)"));
    if (!x.is_number()) fail("a number");
    (k == "factor"      ? g.factor
     : k == "threshold" ? g.threshold
     : k == "min_lr"    ? g.min_lr
     : k == "max_lr"    ? g.max_lr
                        : g.eps) = x.get<double>();
  }
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"linear",
                                                 "cosine",
                                                 "cosine_with_restarts",
                                                 "polynomial",
                                                 "constant",
                                                 "constant_with_warmup",
                                                 "inverse_sqrt",
                                                 "cosine_with_min_lr",
                                                 "cosine_warmup_with_min_lr",
                                                 "warmup_stable_decay",
                                                 "reduce_lr_on_plateau",
                                                 "greedy"};
  return names;
}

void apply_scheduler_kwargs(ScheduleConfig& c, const std::string& text) {
  if (text.empty()) return;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  ONYX_CHECK(j.is_object(), "lr_scheduler_kwargs must be a mapping, got ", text);
  // each schedule function's own parameters (transformers/optimization.py)
  static const std::map<std::string, std::vector<std::string>> params = {
      {"linear", {}},
      {"cosine", {"num_cycles"}},
      {"cosine_with_restarts", {"num_cycles"}},
      {"polynomial", {"lr_end", "power"}},
      {"constant", {}},
      {"constant_with_warmup", {}},
      {"inverse_sqrt", {"timescale"}},
      {"cosine_with_min_lr", {"num_cycles", "min_lr", "min_lr_rate"}},
      {"cosine_warmup_with_min_lr", {"num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"}},
      {"warmup_stable_decay",
       {"num_decay_steps", "num_stable_steps", "warmup_type", "decay_type", "min_lr_ratio",
        "num_cycles"}},
      {"reduce_lr_on_plateau",
       {"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"}},
      {"greedy",
       {"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "warmup", "min_lr",
        "max_lr", "eps", "verbose", "smooth", "window_size", "reset_start"}}};
  auto it = params.find(c.type);
  for (auto& [k, v] : j.items()) {
    const bool known = it != params.end() &&
                       std::find(it->second.begin(), it->second.end(), k) != it->second.end();
    if (!known) {
      std::string list;
      if (it != params.end())
        for (auto& p : it->second) list += (list.empty() ? "" : ", ") + p;
      throw Error(cat("lr_scheduler_kwargs: '", k, "' is not a parameter of the '", c.type,
                      "' schedule (", list.empty() ? "it takes none" : "it takes " + list, ")"));
    }
    if (v.is_null()) continue;
    auto number = [&]() {
      ONYX_CHECK(v.is_number(), "lr_scheduler_kwargs: '", k, "' must be a number, got ", v.dump());
      return v.get<double>();
    };
    auto integer = [&]() {
      ONYX_CHECK(v.is_number_integer(), "lr_scheduler_kwargs: '", k, "' must be an integer, got ",
                 v.dump());
      return v.get<int64_t>();
    };
    if (c.type == "greedy") {
      set_greedy_kwarg(c.greedy, k, v);
      continue;
    }
    if (c.type == "reduce_lr_on_plateau") {
      if (k == "mode" || k == "threshold_mode") {
        ONYX_CHECK(v.is_string(), "lr_scheduler_kwargs: '", k, "' must be a string, got ",
                   v.dump());
        (k == "mode" ? c.plateau_mode : c.plateau_threshold_mode) = v.get<std::string>();
      } else if (k == "patience" || k == "cooldown") {
        (k == "patience" ? c.plateau_patience : c.plateau_cooldown) = integer();
      } else {
        (k == "factor"      ? c.plateau_factor
         : k == "threshold" ? c.plateau_threshold
         : k == "min_lr"    ? c.plateau_min_lr
                            : c.plateau_eps) = number();
      }
      continue;
    }
    if (k == "num_cycles")
      c.num_cycles = number();
    else if (k == "lr_end")
      c.lr_end = number();
    else if (k == "power")
      c.power = number();
    else if (k == "timescale")
      c.timescale = integer();
    else if (k == "min_lr")
      c.min_lr = number();
    else if (k == "min_lr_rate")
      c.min_lr_rate = number();
    else if (k == "warmup_lr_rate")
      c.warmup_lr_rate = number();
    else if (k == "num_decay_steps")
      c.num_decay_steps = integer();
    else if (k == "num_stable_steps")
      c.num_stable_steps = integer();
    else if (k == "min_lr_ratio")
      c.min_lr_ratio = number();
    else {
      ONYX_CHECK(v.is_string(), "lr_scheduler_kwargs: '", k, "' must be a string, got ", v.dump());
      (k == "warmup_type" ? c.warmup_type : c.decay_type) = v.get<std::string>();
    }
  }
}

void validate_schedule(const ScheduleConfig& c) {
  const auto& names = schedule_names();
  if (c.type == "greedy") {  // (GreedyLR's messages)
    ONYX_CHECK(c.greedy.factor < 1.0, "lr schedule 'greedy': Factor should be < 1.0.");
    ONYX_CHECK(c.greedy.mode == "min" || c.greedy.mode == "max", "lr schedule 'greedy': mode ",
               c.greedy.mode, " is unknown!");
    ONYX_CHECK(c.greedy.threshold_mode == "rel" || c.greedy.threshold_mode == "abs",
               "lr schedule 'greedy': threshold mode ", c.greedy.threshold_mode, " is unknown!");
    ONYX_CHECK(!c.greedy.smooth || c.greedy.window_size > 0,
               "lr schedule 'greedy': window_size must be positive with smooth, got ",
               c.greedy.window_size);
  }
  if (c.type == "reduce_lr_on_plateau") {  // (torch's messages)
    ONYX_CHECK(c.plateau_factor < 1.0,
               "lr schedule 'reduce_lr_on_plateau': Factor should be < 1.0.");
    ONYX_CHECK(c.plateau_mode == "min" || c.plateau_mode == "max",
               "lr schedule 'reduce_lr_on_plateau': mode ", c.plateau_mode, " is unknown!");
    ONYX_CHECK(c.plateau_threshold_mode == "rel" || c.plateau_threshold_mode == "abs",
               "lr schedule 'reduce_lr_on_plateau': threshold mode ", c.plateau_threshold_mode,
               " is unknown!");
  }
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
  if (c.type == "cosine_with_min_lr" || c.type == "cosine_warmup_with_min_lr") {
    // (Transformers' messages)
    ONYX_CHECK(!(c.min_lr >= 0 && c.min_lr_rate >= 0), "lr schedule '", c.type,
               "': Only one of min_lr or min_lr_rate should be set");
    ONYX_CHECK(c.min_lr >= 0 || c.min_lr_rate >= 0, "lr schedule '", c.type,
               "': One of min_lr or min_lr_rate should be set through the `lr_scheduler_kwargs`");
  }
  if (c.type == "warmup_stable_decay") {
    ONYX_CHECK(c.num_decay_steps >= 0,
               "lr schedule 'warmup_stable_decay' needs num_decay_steps "
               "in lr_scheduler_kwargs");
    for (const std::string* t : {&c.warmup_type, &c.decay_type})
      ONYX_CHECK(*t == "linear" || *t == "cosine" || *t == "1-sqrt",
                 "lr schedule "
                 "'warmup_stable_decay': unknown ",
                 t == &c.warmup_type ? "warmup" : "decay", " type: ", *t,
                 ", expected 'linear', 'cosine' or '1-sqrt'");
  }
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
  if (type == "reduce_lr_on_plateau" || type == "greedy") return 1.0;  // (lr_at reads the state)
  if (type == "cosine_warmup_with_min_lr") return cosine_warmup_with_min_lr(c, step, warmup);
  if (type == "warmup_stable_decay") return warmup_stable_decay(c, step, warmup);
  if (type == "constant_with_warmup")
    return step < warmup ? (double)step / std::max(1.0, (double)warmup) : 1.0;
  if (step < warmup) return warmup_lambda(step, warmup);  // every other type warms up alike

  if (type == "linear")
    return std::max(0.0, (double)(total - step) / (double)std::max<int64_t>(1, total - warmup));
  if (type == "cosine" || type == "cosine_with_restarts" || type == "cosine_with_min_lr") {
    double progress = (double)(step - warmup) / (double)std::max<int64_t>(1, total - warmup);
    if (type == "cosine_with_min_lr") {
      double cycles = c.num_cycles < 0 ? 0.5 : c.num_cycles;
      double factor = 0.5 * (1.0 + std::cos(kPi * cycles * 2.0 * progress));
      factor = factor * (1 - min_rate(c)) + min_rate(c);
      return std::max(0.0, factor);
    }
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

double lr_at(const ScheduleConfig& c, int64_t step, const MetricLrState* state) {
  if (c.type == "reduce_lr_on_plateau" || c.type == "greedy") {
    validate_schedule(c);
    return state && state->lr >= 0 ? state->lr : c.base_lr;
  }
  return c.base_lr * lr_multiplier(c, step);
}

bool metric_lr_step(const ScheduleConfig& c, MetricLrState& s, double metric) {
  if (c.type == "reduce_lr_on_plateau")
    plateau_step(c, s, metric);
  else if (c.type == "greedy")
    greedy_step(c, s, metric);
  else
    return false;
  return true;
}

void plateau_step(const ScheduleConfig& c, MetricLrState& s, double current) {
  const bool rel = c.plateau_threshold_mode == "rel", min = c.plateau_mode == "min";
  const double t = c.plateau_threshold;
  bool better;
  if (!s.has_best)  // torch's best starts at +-inf
    better = true;
  else if (min)
    better = rel ? current < s.best * (1.0 - t) : current < s.best - t;
  else
    better = rel ? current > s.best * (t + 1.0) : current > s.best + t;
  if (better) {
    s.best = current;
    s.has_best = true;
    s.num_bad = 0;
  } else {
    s.num_bad++;
  }
  if (s.cooldown_counter > 0) {
    s.cooldown_counter--;
    s.num_bad = 0;
  }
  if (s.num_bad > c.plateau_patience) {
    const double old_lr = s.lr >= 0 ? s.lr : c.base_lr;
    const double new_lr = std::max(old_lr * c.plateau_factor, c.plateau_min_lr);
    if (old_lr - new_lr > c.plateau_eps) s.lr = new_lr;
    s.cooldown_counter = c.plateau_cooldown;
    s.num_bad = 0;
  }
}

namespace {

bool greedy_is_better(const ScheduleConfig::Greedy& g, const MetricLrState& s, double current) {
  const bool min = g.mode == "min";
  if (!s.has_best) return min ? current < INFINITY : current > -INFINITY;  // best = +-inf
  if (min)
    return g.threshold_mode == "rel" ? current < s.best * (1.0 - g.threshold)
                                     : current < s.best - g.threshold;
  return g.threshold_mode == "rel" ? current > s.best * (1.0 + g.threshold)
                                   : current > s.best + g.threshold;
}

void greedy_reset(const ScheduleConfig::Greedy& g, MetricLrState& s) {
  s.lr = -1;
  s.has_best = false;
  s.num_bad = s.num_good = s.cooldown_counter = s.warmup_counter = 0;
  s.reset_start = g.reset_start;
  s.window.clear();
  s.window_sum = 0;
  if (g.verbose) std::printf("Scheduler reset to initial state.\n");
}

void greedy_change_lr(const ScheduleConfig& c, MetricLrState& s, bool increase) {
  const ScheduleConfig::Greedy& g = c.greedy;
  const double old_lr = s.lr >= 0 ? s.lr : c.base_lr;
  const double new_lr =
      increase ? std::min(old_lr / g.factor, g.max_lr) : std::max(old_lr * g.factor, g.min_lr);
  if (increase ? new_lr - old_lr > g.eps : old_lr - new_lr > g.eps) {
    s.lr = new_lr;
    if (g.verbose)
      std::printf("Epoch %lld: %s learning rate of group 0 to %.4e.\n", (long long)s.last_epoch,
                  increase ? "increasing" : "reducing", new_lr);
  }
  if (increase) {
    s.reset_start = g.reset_start;
  } else if (!((s.lr >= 0 ? s.lr : c.base_lr) > g.min_lr) && --s.reset_start <= 0) {
    greedy_reset(g, s);
  }
}

}  // namespace

void greedy_step(const ScheduleConfig& c, MetricLrState& s, double current) {
  const ScheduleConfig::Greedy& g = c.greedy;
  if (s.reset_start < 0) s.reset_start = g.reset_start;
  if (g.smooth) {  // StreamingAverage: a running sum, the oldest value dropped past the window
    s.window.push_back(current);
    s.window_sum += current;
    if ((int64_t)s.window.size() > g.window_size) {
      s.window_sum -= s.window.front();
      s.window.erase(s.window.begin());
    }
    current = s.window_sum / (double)s.window.size();
  }
  s.last_epoch++;
  if (s.cooldown_counter > 0 || s.warmup_counter > 0) {
    (s.cooldown_counter > 0 ? s.cooldown_counter : s.warmup_counter)--;
    s.num_bad = s.num_good = 0;
    return;
  }
  if (greedy_is_better(g, s, current)) {
    s.best = current;
    s.has_best = true;
    s.num_bad = 0;
    s.num_good++;
  } else {
    s.num_bad++;
    s.num_good = 0;
  }
  if (s.num_good > g.patience) {
    greedy_change_lr(c, s, true);
    s.warmup_counter = g.warmup;
    s.num_good = 0;
  } else if (s.num_bad > g.patience) {
    greedy_change_lr(c, s, false);
    s.cooldown_counter = g.cooldown;
    s.num_bad = 0;
  }
}

}  // namespace onyx::train
