// training_args.cc — TrainingArguments from text: one table maps each Hugging Face key to its
// field and type, so parsing, error messages, key listing and JSON dumps share one source.
#include "onyx/training_args.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "onyx/error.h"
#include "train/did_you_mean.h"
#include "train/lr_schedule.h"
#include "train/transformers_keys.h"

namespace onyx {
namespace {

struct Field {
  const char* name;
  const char* type;
  std::vector<std::string> choices;
  const char* help;
  std::function<void(TrainingArguments&, const std::string&)> set;
  std::function<nlohmann::json(const TrainingArguments&)> get;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), ::tolower);
  return s;
}

double parse_double(const std::string& key, const std::string& v) {
  try {
    size_t pos;
    double d = std::stod(v, &pos);
    if (pos == v.size() && std::isfinite(d)) return d;
  } catch (...) {
  }
  throw Error(cat("training argument '", key, "': expected a number, got '", v, "'"));
}
int64_t parse_int(const std::string& key, const std::string& v) {
  try {
    size_t pos;
    long long i = std::stoll(v, &pos);
    if (pos == v.size()) return i;
    double d = std::stod(v, &pos);  // accept "1e3" and "10.0" when integral
    if (pos == v.size() && d == std::floor(d) && std::fabs(d) < 9e15) return (int64_t)d;
  } catch (...) {
  }
  throw Error(cat("training argument '", key, "': expected an integer, got '", v, "'"));
}
// logging_steps, eval_steps, save_steps: an integer >= 1, or a ratio of max_steps in (0, 1).
double parse_steps(const std::string& key, const std::string& v) {
  double d = parse_double(key, v);
  if ((d > 0 && d < 1) || (d >= 1 && d == std::floor(d))) return d;
  throw Error(cat("training argument '", key,
                  "': expected an integer >= 1 or a ratio of max_steps in (0, 1), got '", v, "'"));
}
nlohmann::json steps_json(double d) {
  return d >= 1 && d == std::floor(d) ? nlohmann::json((int64_t)d) : nlohmann::json(d);
}
bool parse_bool(const std::string& key, const std::string& v) {
  std::string l = lower(v);
  if (l == "true" || l == "1" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "0" || l == "no" || l == "off") return false;
  throw Error(cat("training argument '", key, "': expected true or false, got '", v, "'"));
}
bool is_none(const std::string& v) {
  std::string l = lower(v);
  return l == "none" || l == "null" || l == "~" || l.empty();
}
std::string one_of(const std::string& key, const std::string& v, std::vector<std::string> ok) {
  for (auto& o : ok)
    if (v == o) return v;
  std::string list;
  for (auto& o : ok) list += (list.empty() ? "" : ", ") + o;
  throw Error(cat("training argument '", key, "': '", v, "' is not one of: ", list));
}

// Each row: the key, its type as --help prints it, the accepted values of a choice, a one-line help
// (after Transformers' TrainingArguments docs, as onyx implements the key), parse and dump.
#define F_DOUBLE(name, help)                                                                       \
  {                                                                                                \
#name, "float",                                                                                \
        {}, help,                                                                                  \
         [](TrainingArguments & a,                                                                 \
            const std::string&                                                                     \
                v) { a.name = parse_double(#name, v); },                                           \
                                                      [](const TrainingArguments&                  \
                                                             a) { return nlohmann::json(a.name); } \
  }
#define F_INT(name, help)                                                                          \
  {                                                                                                \
#name, "int",                                                                                  \
        {}, help,                                                                                  \
         [](TrainingArguments & a,                                                                 \
            const std::string&                                                                     \
                v) { a.name = parse_int(#name, v); }, [](const TrainingArguments&                  \
                                                             a) { return nlohmann::json(a.name); } \
  }
#define F_STEPS(name, help)                                                                      \
  {                                                                                              \
#name, "int | float",                                                                        \
        {}, help,                                                                                \
         [](TrainingArguments & a,                                                               \
            const std::string&                                                                   \
                v) { a.name = parse_steps(#name, v); }, [](const TrainingArguments&              \
                                                               a) { return steps_json(a.name); } \
  }
#define F_BOOL(name, help)                                                                       \
  {                                                                                              \
#name, "bool",                                                                               \
        {}, help,                                                                                \
         [](TrainingArguments & a,                                                               \
            const std::string&                                                                   \
                v) { a.name = parse_bool(#name, v); },                                           \
                                                    [](const TrainingArguments&                  \
                                                           a) { return nlohmann::json(a.name); } \
  }
#define F_STR(name, help)                                                                       \
  {                                                                                             \
#name, "str",                                                                               \
        {}, help,                                                                               \
         [](TrainingArguments & a,                                                              \
            const std::string& v) { a.name = v; }, [](const TrainingArguments&                  \
                                                          a) { return nlohmann::json(a.name); } \
  }
#define F_CHOICE(name, help, ...)                                                  \
  {                                                                                \
#name, "str", {__VA_ARGS__}, help,                                               \
   [](TrainingArguments& a, const std::string& v) { a.name = one_of(#name, v, {__VA_ARGS__}); }, \
   [](const TrainingArguments& a) { return nlohmann::json(a.name); } \
  }
#define F_OPT_INT(name, help)                                                             \
  {                                                                                       \
#name, "int | None", {}, help,                                                          \
   [](TrainingArguments& a, const std::string& v) {                                        \
     if (is_none(v)) a.name.reset();                                                       \
     else a.name = parse_int(#name, v);                                                    \
   },                                                                                      \
   [](const TrainingArguments& a) { return a.name ? nlohmann::json(*a.name) : nlohmann::json(); } \
  }
#define F_OPT_STR(name, help)                                                             \
  {                                                                                       \
#name, "str | None", {}, help,                                                          \
   [](TrainingArguments& a, const std::string& v) {                                        \
     if (is_none(v)) a.name.reset();                                                       \
     else a.name = v;                                                                      \
   },                                                                                      \
   [](const TrainingArguments& a) { return a.name ? nlohmann::json(*a.name) : nlohmann::json(); } \
  }
#define F_OPT_BOOL(name, help)                                                            \
  {                                                                                       \
#name, "bool | None", {}, help,                                                         \
   [](TrainingArguments& a, const std::string& v) {                                        \
     if (is_none(v)) a.name.reset();                                                       \
     else a.name = parse_bool(#name, v);                                                   \
   },                                                                                      \
   [](const TrainingArguments& a) { return a.name ? nlohmann::json(*a.name) : nlohmann::json(); } \
  }

// The fields of the run: output folder, learning rate, batch sizes, length.
std::vector<Field> run_fields() {
  return {
      F_STR(output_dir,
            "Folder for the checkpoints (checkpoint-N), log_history.jsonl, trainer_state.json and "
            "the final model."),
      F_DOUBLE(
          learning_rate,
          "The initial learning rate of the optimizer (the peak one when the schedule warms up)."),
      F_INT(per_device_train_batch_size,
            "Samples per training batch (onyx trains on one device, the CPU)."),
      F_INT(per_device_eval_batch_size, "Samples per batch in evaluation and prediction."),
      F_INT(gradient_accumulation_steps,
            "Batches whose gradients add up to one optimizer step; log/eval/save steps count "
            "optimizer steps."),
      F_DOUBLE(num_train_epochs,
               "Epochs to train (a fraction trains that part of the last epoch); max_steps > 0 "
               "overrides it."),
      F_INT(max_steps,
            "If > 0: the number of optimizer steps to train (repeating the data as needed)."),
  };
}

// The fields of the learning-rate schedule.
std::vector<Field> schedule_fields() {
  return {
      F_INT(warmup_steps,
            "Steps of linear warmup from 0 to learning_rate; when > 0 it overrides warmup_ratio."),
      F_DOUBLE(
          warmup_ratio,
          "Warmup as a fraction of the total steps (rounded up), used when warmup_steps is 0."),
      F_CHOICE(lr_scheduler_type,
               "The learning-rate schedule after warmup, as Transformers' get_scheduler builds it.",
               "linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
               "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr",
               "cosine_warmup_with_min_lr", "warmup_stable_decay", "reduce_lr_on_plateau",
               "greedy"),
      {"lr_scheduler_kwargs",
       "dict | None",
       {},
       "The schedule function's own parameters (Transformers' names): num_cycles, lr_end / power "
       "(polynomial), timescale, min_lr or min_lr_rate, warmup_lr_rate, num_decay_steps, "
       "num_stable_steps, warmup_type, decay_type, min_lr_ratio.",
       [](TrainingArguments& a, const std::string& v) {
         if (is_none(v) || v == "{}") {
           a.lr_scheduler_kwargs.clear();
           return;
         }
         nlohmann::json j = nlohmann::json::parse(v, nullptr, false);
         if (!j.is_object())
           throw Error(
               cat("training argument 'lr_scheduler_kwargs': expected a mapping, got '", v, "'"));
         a.lr_scheduler_kwargs = j.dump();
       },
       [](const TrainingArguments& a) {
         return a.lr_scheduler_kwargs.empty() ? nlohmann::json()
                                              : nlohmann::json::parse(a.lr_scheduler_kwargs);
       }},
  };
}

// The fields of the optimizer.
std::vector<Field> optimizer_fields() {
  return {
      F_DOUBLE(
          weight_decay,
          "Decoupled weight decay of AdamW / SGD; never applied to biases and LayerNorm weights."),
      F_DOUBLE(adam_beta1, "AdamW's decay rate of the first-moment (momentum) estimates."),
      F_DOUBLE(adam_beta2, "AdamW's decay rate of the second-moment (variance) estimates."),
      F_DOUBLE(adam_epsilon, "AdamW's epsilon added to the denominator for numerical stability."),
      F_DOUBLE(max_grad_norm,
               "Clip the gradients' global L2 norm to this before each step (0: no clipping)."),
      F_CHOICE(optim,
               "Optimizer: adamw_fused (one fused kernel), adamw (per tensor), sgd or adafactor "
               "(Transformers' Adafactor as its Trainer sets it up); the others are aliases.",
               "adamw_fused", "adamw", "sgd", "adafactor", "adamw_torch", "adamw_torch_fused",
               "adamw_ort_fused", "adamw_hf"),
      F_DOUBLE(
          sgd_momentum,
          "onyx extension: momentum of optim sgd (Transformers passes it through optim_args)."),
      F_BOOL(sgd_nesterov, "onyx extension: Nesterov momentum for optim sgd."),
  };
}

// The fields of logging, evaluation, checkpoints and the best model.
std::vector<Field> logging_eval_save_fields() {
  return {
      F_CHOICE(
          logging_strategy,
          "When to log loss, grad_norm and learning_rate: no, every logging_steps, or each epoch.",
          "no", "steps", "epoch"),
      F_STEPS(logging_steps,
              "Optimizer steps between two logs when logging_strategy is steps; below 1, a ratio "
              "of max_steps."),
      F_BOOL(logging_first_step, "Also log after the first optimizer step."),
      F_BOOL(logging_nan_inf_filter,
             "A nan/inf micro-batch loss adds the mean of the losses logged since the last log "
             "instead (the step itself is skipped either way)."),
      F_CHOICE(eval_strategy,
               "When to evaluate on eval_data: no, every eval_steps, or each epoch (old name: "
               "evaluation_strategy).",
               "no", "steps", "epoch"),
      {"eval_steps",
       "int | float | None",
       {},
       "Optimizer steps between two evaluations when eval_strategy is steps (None: "
       "logging_steps); below 1, a ratio of max_steps.",
       [](TrainingArguments& a, const std::string& v) {
         if (is_none(v))
           a.eval_steps.reset();
         else
           a.eval_steps = parse_steps("eval_steps", v);
       },
       [](const TrainingArguments& a) {
         return a.eval_steps ? steps_json(*a.eval_steps) : nlohmann::json();
       }},
      F_CHOICE(save_strategy,
               "When to save a checkpoint-N folder: no, every save_steps, or each epoch.", "no",
               "steps", "epoch"),
      F_STEPS(save_steps,
              "Optimizer steps between two checkpoints when save_strategy is steps; below 1, a "
              "ratio of max_steps."),
      F_OPT_INT(save_total_limit,
                "Keep at most this many checkpoints (the oldest go first; the best one is kept)."),
      F_BOOL(
          load_best_model_at_end,
          "Load the best checkpoint's weights at the end (needs save_strategy = eval_strategy)."),
      F_OPT_STR(
          metric_for_best_model,
          "Metric that picks the best checkpoint, with or without the eval_ prefix (None: loss)."),
      F_OPT_BOOL(
          greater_is_better,
          "Whether a larger metric_for_best_model is better (None: false for *loss, else true)."),
  };
}

// The fields of randomness, data order, the loss, resuming.
std::vector<Field> data_fields() {
  return {
      F_INT(seed,
            "Random seed for initialization, dropout and (without data_seed) data shuffling."),
      F_OPT_INT(data_seed, "Random seed for the data sampler only (None: seed)."),
      F_BOOL(dataloader_drop_last, "Drop each epoch's last incomplete training batch."),
      F_CHOICE(train_sampling_strategy,
               "Order of the training samples: random (shuffled each epoch), sequential, or "
               "group_by_length (Transformers' LengthGroupedSampler: shuffled, then sorted by "
               "length within megabatches of up to 50 batches; evaluation in that order too), "
               "or batch_rebalance (Transformers' BatchRebalanceSampler: each step's shuffled "
               "samples sorted by length and cut into GA x world micro-batches of balanced cost "
               "bs * len + 0.001 * bs * len^2, so short samples go in bigger batches).",
               "random", "sequential", "group_by_length", "batch_rebalance"),
      F_STR(length_column_name,
            "group_by_length / batch_rebalance: the dataset column holding each sample's length "
            "(if it has one; else the length of its input_ids)."),
      F_DOUBLE(label_smoothing_factor,
               "Label smoothing of the cross-entropy loss (0: none; targets become eps/num_labels, "
               "1-eps+eps/num_labels)."),
      F_OPT_STR(resume_from_checkpoint,
                "A checkpoint-N folder to resume training from, bit for bit (weights, optimizer, "
                "schedule, data order)."),
      F_BOOL(disable_tqdm, "No progress bar on a terminal (log dicts are printed one per line)."),
  };
}

// The fields of precision and memory.
std::vector<Field> precision_fields() {
  return {
      F_BOOL(bf16,
             "Mixed precision: the linear layers' GEMMs (forward and backward, the LM head's too), "
             "attention's tile products and Conv take bf16-rounded inputs with float32 "
             "accumulation; everything else stays float32."),
      F_BOOL(fp16,
             "Mixed precision with float16, emulated (these CPUs have no float16 arithmetic): the "
             "same GEMMs take float16-rounded inputs multiplied in float32 (slower than float32; "
             "bf16 is the CPU's format)."),
      F_BOOL(bf16_full_eval,
             "evaluate() / predict() outside training read the weights rounded to bf16 (as "
             "Transformers' model.to(bfloat16)) with bf16 GEMM inputs; evaluations during "
             "training are unchanged."),
      F_BOOL(fp16_full_eval,
             "evaluate() / predict() outside training read the weights rounded to float16 (as "
             "Transformers' model.half()) with float16-rounded GEMM inputs (emulated)."),
      F_BOOL(gradient_checkpointing,
             "Recompute each transformer layer's activations in backward instead of keeping them "
             "(less memory)."),
      F_BOOL(
          auto_find_batch_size,
          "Halve per_device_train_batch_size until the planned step fits max_memory (else the free "
          "memory)."),
      F_OPT_STR(
          max_memory,
          "onyx extension: memory budget of one training step (6GB, 512MiB, bytes); a plan over it "
          "is an error."),
  };
}

// The fields of reporting and data parallelism.
std::vector<Field> distributed_fields() {
  return {
      F_CHOICE(
          report_to,
          "Where logs go besides log_history.jsonl: none, or tensorboard (all: every integration "
          "onyx has).",
          "none", "tensorboard", "all"),
      F_STR(logging_dir,
            "TensorBoard event folder (empty: $TENSORBOARD_LOGGING_DIR, else "
            "output_dir/runs/<date>_<host>)."),
      F_INT(ddp_timeout,
            "Seconds a collective waits for the other ranks (mpirun) before the whole job stops "
            "with an error."),
      F_OPT_INT(ddp_bucket_cap_mb,
                "Size in MiB of the buckets gradients are reduced in across ranks (None: 25)."),
      F_INT(zero_stage,
            "onyx extension, as DeepSpeed ZeRO: 0 = DDP, 1 = optimizer state sharded across "
            "ranks, 2 = gradients accumulated in the local shard too."),
  };
}

// The fields of generation during evaluation.
std::vector<Field> generation_fields() {
  return {
      F_BOOL(predict_with_generate,
             "Causal LMs: evaluation and prediction also generate (greedy, KV cache) from each "
             "sample's prompt (tokens before the first label) and score it against the labelled "
             "completion (gen_exact_match, gen_token_accuracy)."),
      F_OPT_INT(generation_max_new_tokens,
                "New tokens generated per sample with predict_with_generate (None: the length of "
                "the sample's labelled completion)."),
      F_OPT_INT(generation_num_beams,
                "predict_with_generate with beam search over this many beams (None: greedy)."),
      F_OPT_INT(generation_max_length,
                "predict_with_generate: at most this many tokens per generated sequence, the "
                "left-padded prompt included (used when generation_max_new_tokens is None)."),
  };
}

// Every field, in the order `onyx train --help` and the saved arguments list them.
const std::vector<Field>& fields() {
  static const std::vector<Field> f = [] {
    std::vector<Field> all;
    for (auto group : {run_fields, schedule_fields, optimizer_fields, logging_eval_save_fields,
                       data_fields, precision_fields, distributed_fields, generation_fields}) {
      std::vector<Field> g = group();
      all.insert(all.end(), g.begin(), g.end());
    }
    return all;
  }();
  return f;
}

}  // namespace

void TrainingArguments::set(const std::string& key_in, const std::string& value) {
  std::string key = key_in == "evaluation_strategy" ? "eval_strategy" : key_in;  // HF's old name
  for (auto& f : fields())
    if (key == f.name) return f.set(*this, value);
  if (const train::TransformersKey* k = train::find_transformers_key(key)) {
    const nlohmann::json v = train::parse_transformers_key(*k, value);
    transformers_only[key] = v.dump();
    if (key == "activation_checkpointing" && v.is_boolean()) gradient_checkpointing = v.get<bool>();
    return;
  }
  throw Error(cat("unknown training argument '", key_in, "'", train::did_you_mean(key_in, keys())));
}

bool TrainingArguments::is_key(const std::string& key) {
  if (key == "evaluation_strategy") return true;
  for (auto& f : fields())
    if (key == f.name) return true;
  return train::find_transformers_key(key) != nullptr;
}

std::vector<std::string> TrainingArguments::keys() {
  std::vector<std::string> k;
  for (auto& f : fields()) k.push_back(f.name);
  for (auto& t : train::transformers_keys()) k.push_back(t.name);
  return k;
}

std::vector<TrainingArguments::ArgInfo> TrainingArguments::describe() {
  const TrainingArguments defaults;
  std::vector<ArgInfo> out;
  for (auto& f : fields()) {
    nlohmann::json d = f.get(defaults);
    out.push_back({f.name, f.type, f.choices, d.is_null() ? "None" : d.dump(), f.help});
  }
  for (auto& t : train::transformers_keys()) {
    const std::string d = t.default_json;
    out.push_back({t.name, t.type, t.choices, d == "null" ? "None" : d,
                   cat(t.any_value ? "Transformers' key, any value ("
                                   : "Transformers' key, "
                                     "only its default (",
                       t.note, ").")});
  }
  return out;
}

std::string TrainingArguments::to_json() const {
  nlohmann::ordered_json j;
  for (auto& f : fields()) j[f.name] = f.get(*this);
  for (auto& t : train::transformers_keys()) {
    auto it = transformers_only.find(t.name);
    j[t.name] = nlohmann::json::parse(it != transformers_only.end() ? it->second : t.default_json);
  }
  return j.dump(2);
}

std::string TrainingArguments::optimizer_name() const {
  if (optim == "adamw_torch" || optim == "adamw_torch_fused" || optim == "adamw_ort_fused")
    return "adamw_fused";
  if (optim == "adamw_hf") return "adamw";
  return optim;
}

std::string TrainingArguments::best_metric_name() const {
  std::string m = metric_for_best_model.value_or("loss");
  if (m.rfind("eval_", 0) == 0) m = m.substr(5);
  return m;
}

bool TrainingArguments::best_is_greater() const {
  if (greater_is_better) return *greater_is_better;
  std::string m = best_metric_name();
  return !(m == "loss" || (m.size() >= 4 && m.substr(m.size() - 4) == "loss"));
}

void TrainingArguments::validate() const {
  // (Transformers' messages) the plateau and greedy schedulers step with evaluations' metrics
  ONYX_CHECK(lr_scheduler_type != "reduce_lr_on_plateau" || eval_strategy != "no",
             "training argument 'lr_scheduler_type': lr_scheduler_type reduce_lr_on_plateau "
             "requires an eval strategy");
  ONYX_CHECK(lr_scheduler_type != "greedy" || eval_strategy != "no",
             "training argument 'lr_scheduler_type': lr_scheduler_type greedy requires an eval "
             "strategy");
  {  // lr_scheduler_kwargs' keys belong to the schedule (get_scheduler's TypeError otherwise)
    train::ScheduleConfig sc;
    sc.type = lr_scheduler_type;
    train::apply_scheduler_kwargs(sc, lr_scheduler_kwargs);
  }
  auto positive = [](const char* k, double v) {
    ONYX_CHECK(v > 0, "training argument '", k, "' must be positive, got ", v);
  };
  positive("per_device_train_batch_size", per_device_train_batch_size);
  positive("per_device_eval_batch_size", per_device_eval_batch_size);
  positive("gradient_accumulation_steps", gradient_accumulation_steps);
  if (logging_strategy == "steps") positive("logging_steps", logging_steps);
  if (save_strategy == "steps") positive("save_steps", save_steps);
  if (eval_strategy == "steps" && eval_steps) positive("eval_steps", *eval_steps);
  if (generation_num_beams) positive("generation_num_beams", (double)*generation_num_beams);
  if (generation_max_length) positive("generation_max_length", (double)*generation_max_length);
  ONYX_CHECK(learning_rate >= 0, "training argument 'learning_rate' must be >= 0");
  ONYX_CHECK(warmup_ratio >= 0 && warmup_ratio <= 1,
             "training argument 'warmup_ratio' must be in [0, 1], got ", warmup_ratio);
  ONYX_CHECK(warmup_steps >= 0, "training argument 'warmup_steps' must be >= 0");
  ONYX_CHECK(num_train_epochs > 0 || max_steps > 0,
             "set 'num_train_epochs' > 0 or 'max_steps' > 0");
  ONYX_CHECK(label_smoothing_factor >= 0 && label_smoothing_factor < 1,
             "training argument 'label_smoothing_factor' must be in [0, 1)");
  ONYX_CHECK(!save_total_limit || *save_total_limit > 0,
             "training argument 'save_total_limit' must be positive");
  ONYX_CHECK(!output_dir.empty(), "training argument 'output_dir' is empty");
  // (Transformers' own messages for the first two)
  ONYX_CHECK(!(fp16 && bf16),
             "training arguments 'fp16' and 'bf16': at most one of fp16 and bf16 "
             "can be True, but not both");
  ONYX_CHECK(!(fp16_full_eval && bf16_full_eval),
             "training arguments 'fp16_full_eval' and 'bf16_full_eval': at most one of fp16 and "
             "bf16 can be True for full eval, but not both");
  ONYX_CHECK(!(fp16_full_eval && bf16),
             "training argument 'fp16_full_eval' with 'bf16': not supported (bf16 training's "
             "evaluation graphs store bf16 values); use 'bf16_full_eval'");
  ONYX_CHECK(zero_stage >= 0 && zero_stage <= 2,
             "training argument 'zero_stage' must be 0, 1 or 2, got ", zero_stage);
  ONYX_CHECK(ddp_timeout > 0, "training argument 'ddp_timeout' must be positive, got ",
             ddp_timeout);
  ONYX_CHECK(!ddp_bucket_cap_mb || *ddp_bucket_cap_mb > 0,
             "training argument 'ddp_bucket_cap_mb' must be positive");
  if (load_best_model_at_end) {
    ONYX_CHECK(eval_strategy != "no",
               "load_best_model_at_end needs an eval_strategy other than 'no'");
    ONYX_CHECK(save_strategy == eval_strategy, "load_best_model_at_end needs save_strategy ('",
               save_strategy, "') equal to eval_strategy ('", eval_strategy, "')");
    if (save_strategy == "steps") {
      double es = eval_steps.value_or(logging_steps);
      // as Transformers: both steps or both ratios, and save a multiple of eval
      ONYX_CHECK(
          (es < 1) == (save_steps < 1),
          "load_best_model_at_end needs save_steps and eval_steps both as steps or both as ratios");
      double q = save_steps / es;
      ONYX_CHECK(std::fabs(q - std::round(q)) < 1e-9 && q >= 1,
                 "load_best_model_at_end needs save_steps (", steps_json(save_steps).dump(),
                 ") to be a multiple of eval_steps (", steps_json(es).dump(), ")");
    }
  }
}

int64_t TrainingArguments::interval(double steps, int64_t max_steps) {
  return steps < 1 ? (int64_t)std::ceil((double)max_steps * steps) : (int64_t)steps;
}

}  // namespace onyx
