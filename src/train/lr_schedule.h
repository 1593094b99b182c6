// train/lr_schedule.h — learning-rate schedules with Hugging Face Transformers' formulas
// (transformers.get_scheduler), as multipliers of the base lr with torch's LambdaLR semantics:
// the lr for the optimizer step with index s (0-based; the first step is s = 0) is
// base_lr * lambda(s). With warmup, step 0 therefore runs at lr 0, as in the HF Trainer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace onyx::train {

struct ScheduleConfig {
  std::string type = "linear";  // see schedule_names()
  int64_t warmup_steps = 0;     // used when > 0; otherwise ceil(warmup_ratio * total_steps)
  double warmup_ratio = 0;
  int64_t total_steps = 0;  // num_training_steps
  double base_lr = 5e-5;
  double num_cycles = -1;  // < 0: the type's default (cosine 0.5, cosine_with_restarts 1)
  double lr_end = 1e-7;    // polynomial
  double power = 1.0;      // polynomial
  int64_t timescale = 0;   // inverse_sqrt; 0: Transformers' default (warmup steps, or 10000)
  // cosine_with_min_lr / cosine_warmup_with_min_lr: exactly one of min_lr, min_lr_rate (< 0:
  // unset); cosine_warmup_with_min_lr's warmup starts at warmup_lr_rate (< 0: 1 / warmup).
  double min_lr = -1, min_lr_rate = -1, warmup_lr_rate = -1;
  // warmup_stable_decay: num_decay_steps (required), num_stable_steps (< 0: total - warmup -
  // decay), the shapes of the warmup and the decay (linear, cosine, 1-sqrt), the floor.
  int64_t num_decay_steps = -1, num_stable_steps = -1;
  std::string warmup_type = "linear", decay_type = "cosine";
  double min_lr_ratio = 0;
  // reduce_lr_on_plateau: torch's ReduceLROnPlateau (its kwargs: mode, factor, patience,
  // threshold, threshold_mode, cooldown, min_lr, eps), stepped with an evaluation's metric
  // (plateau_step); no warmup, as Transformers' get_scheduler builds it.
  std::string plateau_mode = "min", plateau_threshold_mode = "rel";
  double plateau_factor = 0.1, plateau_threshold = 1e-4, plateau_min_lr = 0, plateau_eps = 1e-8;
  int64_t plateau_patience = 10, plateau_cooldown = 0;
  // greedy: Transformers' GreedyLR (its kwargs, its defaults), stepped like reduce_lr_on_plateau.
  struct Greedy {
    std::string mode = "min", threshold_mode = "abs";
    double factor = 0.95, threshold = 1e-6, min_lr = 1e-3, max_lr = 1.0, eps = 1e-8;
    int64_t patience = 10, cooldown = 0, warmup = 0, window_size = 50, reset_start = 500;
    bool smooth = false, verbose = false;
  } greedy;
};

// The state of a schedule driven by evaluation metrics (reduce_lr_on_plateau, greedy): the
// current lr, the best metric, the counts of bad / good evaluations and of the cooldown / warmup
// still to wait; greedy's also its evaluations at min_lr left before a reset and its smoothing
// window. Checkpointed in scheduler.json.
struct MetricLrState {
  double lr = -1;  // < 0: the base lr
  double best = 0;
  bool has_best = false;  // false: torch's +-inf
  int64_t num_bad = 0, cooldown_counter = 0;
  int64_t num_good = 0, warmup_counter = 0, reset_start = -1, last_epoch = 0;  // greedy
  std::vector<double> window;                                                  // greedy, smooth
  double window_sum = 0;
};
// torch's ReduceLROnPlateau.step(metric): a better metric (by mode, threshold) resets the count
// of bad evaluations; more than patience of them multiply the lr by factor (not below min_lr,
// not by less than eps), then cooldown evaluations are not counted.
void plateau_step(const ScheduleConfig& config, MetricLrState& state, double metric);
// Transformers' GreedyLR.step(metric): more than patience better evaluations divide the lr by
// factor (up to max_lr), then warmup evaluations are not counted; more than patience worse ones
// multiply it by factor (down to min_lr), then cooldown; reset_start reductions at min_lr restore
// the base lr and the initial state. With smooth, the metric is a rolling mean of window_size.
void greedy_step(const ScheduleConfig& config, MetricLrState& state, double metric);
// The step of config.type's metric-driven schedule; false when the type has none.
bool metric_lr_step(const ScheduleConfig& config, MetricLrState& state, double metric);

// Transformers' lr_scheduler_kwargs (a JSON object; "" = none) into `config`: only the parameters
// of config.type's schedule function (num_cycles, lr_end, power, timescale, min_lr, ...); any
// other key is an error, as get_scheduler's TypeError.
void apply_scheduler_kwargs(ScheduleConfig& config, const std::string& kwargs_json);

// Valid ScheduleConfig::type values: linear, cosine, cosine_with_restarts, polynomial, constant,
// constant_with_warmup, inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr,
// warmup_stable_decay, reduce_lr_on_plateau, greedy.
const std::vector<std::string>& schedule_names();

// Throws onyx::Error for an unknown type (listing the valid ones) or invalid values.
void validate_schedule(const ScheduleConfig& config);

// Transformers' TrainingArguments.get_warmup_steps.
int64_t effective_warmup_steps(const ScheduleConfig& config);

// lambda(step): the multiplier of base_lr. Validates the config.
double lr_multiplier(const ScheduleConfig& config, int64_t step);

// base_lr * lambda(step) (reduce_lr_on_plateau, greedy: the state's current lr).
double lr_at(const ScheduleConfig& config, int64_t step, const MetricLrState* state = nullptr);

}  // namespace onyx::train
