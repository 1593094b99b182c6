// onyx/trainer.h — the Trainer, with Hugging Face's vocabulary: TrainingArguments, TrainerState,
// TrainerControl, callbacks with Transformers' events, EarlyStoppingCallback, compute_metrics,
// train() / evaluate() / predict() / save_model(), checkpoint-N folders, trainer_state.json and
// exact resume.
#pragma once
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "onyx/dataset.h"
#include "onyx/loss.h"
#include "onyx/tensor.h"
#include "onyx/training_args.h"

namespace onyx {

namespace ir {
struct Graph;  // ir/graph.h
}
namespace generate {
class Generator;  // generate/generate.h
struct GenerationConfig;
}  // namespace generate
namespace kernels {
enum class LowPrecision;  // kernels/cpu/gemm.h
}

// diffusers' EMAModel over the trained parameters (use_ema in its training scripts): after each
// optimizer step, shadow -= (1 - decay) * (shadow - param) with EMAModel.get_decay's decay at that
// step (0 at the first: the shadow starts as the first update's weights).
struct EmaConfig {
  bool enabled = false;
  double decay = 0.9999;  // the largest decay (train_unconditional.py's ema_max_decay)
  double min_decay = 0.0;
  int64_t update_after_step = 0;
  bool use_ema_warmup = false;  // 1 - (1 + step / inv_gamma)^-power; else (1 + step) / (10 + step)
  double inv_gamma = 1.0;
  double power = 2.0 / 3.0;
  // EMAModel.get_decay at optimization step `step` (1 for the first step).
  double decay_at(int64_t step) const;
};

// A trainable model: the forward graph, the loss, what it predicts.
struct Model {
  std::shared_ptr<ir::Graph> graph;
  autodiff::LossSpec loss;
  std::set<std::string> frozen;
  std::string predictions;   // output used for metrics/predict; "" = first non-loss output
  bool generic_onnx = true;  // weight-decay rule: also no decay on rank <= 1 tensors
  std::string source;        // where the graph came from (an .onnx path), for export
  std::string config_json;   // Hugging Face config.json, saved next to the weights when set
  // The weights' file in output_dir and checkpoints (diffusers' models:
  // diffusion_pytorch_model.safetensors).
  std::string weights_file = "model.safetensors";
  // Weight decay on every parameter (diffusers' training scripts hand AdamW all of them in one
  // group) instead of Transformers' rule by name.
  bool decay_all = false;
  // Text files written next to the weights (name -> content): a diffusion model's
  // scheduler_config.json, so the saved folder opens as diffusers' model and scheduler.
  std::map<std::string, std::string> side_files;
  // Loss normalization under gradient accumulation, as Transformers' num_items_in_batch: an
  // optimizer step's loss is the sum over the items of all its micro-batches divided by their
  // number. Items are the entries of the batch tensor `items_labels` that differ from
  // `items_ignore_index`, from each row's second position on when `items_shifted` (a causal LM's
  // targets). Empty: the loss is a batch mean over unknown items and micro-batches are averaged
  // (the Trainer fills it in for a cross-entropy LossSpec).
  std::string items_labels;
  bool items_shifted = false;
  int64_t items_ignore_index = -100;
  // A step without one item trains on a zero loss instead of stopping (GRPO's dapo: its graph
  // divides by the clamped token count, as TRL's, when mask_truncated_completions masks them all).
  bool zero_items_ok = false;
  // Transformers' gradient accumulation for a model whose forward takes loss kwargs but whose
  // loss ignores num_items_in_batch (BART, Whisper: a plain CrossEntropyLoss mean): the Trainer
  // then neither normalizes by the items nor divides by the accumulation steps, so a step's loss
  // and gradient are the sum of its micro-batches' mean losses. Matched (items_labels empty), so
  // loss curves and clipping compare with Seq2SeqTrainer's.
  bool sums_micro_batch_means = false;
  // Graph inputs a dataset may omit, and what fills them in a batch (Hugging Face models:
  // attention_mask of ones, token_type_ids of zeros).
  std::set<std::string> optional_inputs;
  // Files saved next to the weights in output_dir and every checkpoint, so that Transformers'
  // AutoTokenizer / AutoImageProcessor open the folder (tokenizer.json, vocab.txt, ...).
  std::vector<std::string> processor_files;
  // Folders copied into output_dir by save_model (not into checkpoints): name there -> source
  // (text-to-image training: the frozen text_encoder/ and tokenizer/ the sampler needs).
  std::map<std::string, std::string> side_folders;
  std::function<void(std::map<std::string, Tensor>&)> fill_defaults;
  // BatchNormalization running_var updated with the unbiased batch variance (PyTorch's BatchNorm)
  // instead of the population variance the ONNX spec defines (config batch_norm_running_var).
  bool batch_norm_unbiased_var = false;
  // LoRA (PEFT's format): the adapter tensors (graph initializer -> name in
  // adapter_model.safetensors) and adapter_config.json's text; save_model writes both next to the
  // model when set.
  std::map<std::string, std::string> adapter_tensors;
  std::string adapter_config_json;
  // A diffusers pipeline component's name ("unet"): its LoRA adapters are also written as
  // pytorch_lora_weights.safetensors, the file diffusers' LoRA scripts save and
  // load_lora_weights / load_lora_adapter read ("unet.<module>.lora.down|up.weight", the LoRA
  // config in the "lora_adapter_metadata" header entry).
  std::string diffusers_lora_component;
  // Frozen weights stored in bfloat16 (config model_init_kwargs.dtype: bfloat16): bf16
  // initializers of the graph, read by the GEMMs with bf16 inputs and float32 accumulation.
  // Saved as BF16 tensors; generation widens copies of them to float32.
  std::set<std::string> bf16_weights;
  // Scalar float32 graph outputs logged during training under their names (TRL's DPO metrics:
  // "rewards/chosen", ...): each micro-batch's value, averaged over the micro-batches since the
  // last log.
  std::vector<std::string> logged_outputs;
  // TRL's num_tokens (DPO): the attention_mask tokens of every training micro-batch so far, over
  // all processes, logged with each log (and with evaluations) and kept in
  // TrainerState::num_input_tokens_seen.
  bool logs_num_tokens = false;
  // DPO (models/preference_head.h): pairs per reference forward (DPOConfig.
  // precompute_ref_batch_size; 0: per_device_train_batch_size / per_device_eval_batch_size).
  int64_t reference_batch_size = 0;
  // DPO: a reference model of the same architecture with other weights (TRL's ref_model), a
  // Hugging Face folder; empty: the starting policy.
  std::string reference_model;
  static Model from_onnx(const std::string& path, autodiff::LossSpec loss = {});
  // The graph output that is the loss (a GraphOutput loss: the named one, else the first output),
  // or "" when the loss is appended to an output (cross-entropy, MSE).
  std::string graph_loss_output() const;
};

struct LogEntry {
  std::map<std::string, double> values;  // "loss", "learning_rate", "eval_accuracy", ...
  double epoch = 0;
  int64_t step = 0;
  std::string to_json() const;
};

struct TrainerState {
  double epoch = 0;
  int64_t global_step = 0;
  int64_t max_steps = 0;
  int64_t num_train_epochs = 0;
  int64_t logging_steps = 500, eval_steps = 500, save_steps = 500;
  int64_t train_batch_size = 0;
  int64_t num_input_tokens_seen = 0;  // tokens trained on so far (Model::logs_num_tokens, GRPO)
  std::vector<LogEntry> log_history;
  std::optional<double> best_metric;
  std::optional<std::string> best_model_checkpoint;
  std::optional<int64_t> best_global_step;  // the step of the best evaluation (Transformers 5)
  bool is_local_process_zero = true;        // data parallel: rank 0 of this host / of the job
  bool is_world_process_zero = true;
  std::string to_json() const;
  static TrainerState from_json(const std::string& text, const std::string& what);
};

struct TrainerControl {
  bool should_training_stop = false;
  bool should_epoch_stop = false;
  bool should_save = false;
  bool should_evaluate = false;
  bool should_log = false;
};

using Metrics = std::map<std::string, double>;

class TrainerCallback {
 public:
  virtual ~TrainerCallback() = default;
  virtual void on_init_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_train_begin(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_epoch_begin(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_epoch_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_step_begin(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_substep_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_step_end(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_evaluate(const TrainingArguments&, TrainerState&, TrainerControl&,
                           const Metrics&) {}
  virtual void on_save(const TrainingArguments&, TrainerState&, TrainerControl&) {}
  virtual void on_log(const TrainingArguments&, TrainerState&, TrainerControl&, const LogEntry&) {}
  virtual void on_prediction_step(const TrainingArguments&, TrainerState&, TrainerControl&) {}
};

// Stops training when the best-model metric has not improved by more than `threshold` for
// `patience` evaluations (Transformers' EarlyStoppingCallback).
class EarlyStoppingCallback : public TrainerCallback {
 public:
  explicit EarlyStoppingCallback(int patience = 1, double threshold = 0.0)
      : patience_(patience), threshold_(threshold) {}
  // metric_for_best_model and an eval_strategy are required (Transformers asserts them).
  void on_train_begin(const TrainingArguments& args, TrainerState& state,
                      TrainerControl& control) override;
  void on_evaluate(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
                   const Metrics& metrics) override;

 private:
  int patience_;
  double threshold_;
  int bad_evals_ = 0;
};

struct EvalPrediction {
  Tensor predictions;  // (N, ...) model outputs, e.g. logits (undefined when the model has none)
  Tensor label_ids;    // (N, ...) labels (undefined when the dataset has none)
  double loss = NAN;   // the mean evaluation loss (NaN when not computed), for perplexity
};
using ComputeMetrics = std::function<Metrics(const EvalPrediction&)>;

namespace metrics {
Metrics accuracy(const EvalPrediction& p);  // argmax over the last axis; labels -100 ignored
Metrics f1(const EvalPrediction& p);        // macro F1 over classes
Metrics mse(const EvalPrediction& p);
// "accuracy", "f1", "mse", "perplexity" (exp of eval_loss, added by evaluate()); throws on others.
ComputeMetrics by_names(const std::vector<std::string>& names);
}  // namespace metrics

struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;
  Metrics metrics;  // train_runtime, train_samples_per_second, ...
};

struct PredictionOutput {
  Tensor predictions;
  Tensor label_ids;
  Metrics metrics;
};

namespace train {
class TrainingSession;
class Optimizer;
}  // namespace train

class Trainer {
 public:
  Trainer(Model model, TrainingArguments args, std::shared_ptr<data::Dataset> train_dataset,
          std::shared_ptr<data::Dataset> eval_dataset = nullptr,
          ComputeMetrics compute_metrics = nullptr,
          std::vector<std::shared_ptr<TrainerCallback>> callbacks = {});
  ~Trainer();

  TrainOutput train();  // resumes from args.resume_from_checkpoint when set
  Metrics evaluate(const std::string& metric_key_prefix = "eval");
  // On another dataset (Transformers' evaluate(eval_dataset=...)): logged and passed to
  // on_evaluate like the above, without touching the best-metric tracking of training.
  Metrics evaluate(const data::Dataset& dataset, const std::string& metric_key_prefix = "eval");
  // Whether compute_metrics reads the predictions (default true). When it does not (no
  // compute_metrics, or only perplexity, which is exp(eval loss)), evaluation keeps none: a
  // language model's logits over an eval set are tokens x vocabulary floats (GBs).
  void set_metrics_need_predictions(bool need) { metrics_need_predictions_ = need; }
  PredictionOutput predict(const data::Dataset& dataset);
  // Seq2SeqTrainer's evaluate / predict generation kwargs: predict_with_generate's lengths and
  // beams from now on (each nullopt: none given, so the generation config's own).
  void set_generation_kwargs(std::optional<int64_t> max_length,
                             std::optional<int64_t> max_new_tokens,
                             std::optional<int64_t> num_beams);
  // model.safetensors (+ onyx_model.json describing the graph source) into `dir`, atomically.
  // With an EMA (set_ema), the EMA weights: the final model diffusers' scripts save.
  void save_model(const std::string& dir);
  // Keeps an exponential moving average of the trained parameters from the next train() on
  // (diffusers' EMAModel); checkpoints hold it in ema/ beside the live weights.
  void set_ema(const EmaConfig& c);
  // What save_model writes as model.safetensors: every initializer by name, trained parameters
  // and buffers at their current values (views of the Trainer's storage: copy to keep).
  std::map<std::string, Tensor> weights();
  const TrainerState& state() const { return state_; }
  // auto_find_batch_size / max_memory: picks the batch size whose planned step fits (train()).
  void fit_batch_to_memory();
  train::TrainingSession& session();
  const Model& model() const { return model_; }
  // The weights of a folder save_model or a checkpoint wrote (a LoRA run's adapters from its
  // adapter_model.safetensors), parameters and BatchNorm statistics; the optimizer state is kept.
  void load_weights(const std::string& dir);
  // Step-level training, the loop in the caller's hands (the C API, onyx/onyx_c.h; ONNX
  // Runtime's TrainStep / OptimizerStep / LazyResetGrad). train_step: one forward and backward on
  // `batch` (graph inputs and labels by name; defaults filled as in training), its gradient added
  // to those since the last optimizer step (a sum); returns the loss. optimizer_step: the run's
  // clipping and optimizer at learning_rate(), then global_step + 1 and the next train_step
  // starts afresh. The schedule is lr_scheduler_type over max_steps (constant without max_steps)
  // unless set_learning_rate fixed a rate. No dataset, output folder or callback takes part.
  double train_step(const std::map<std::string, Tensor>& batch);
  void optimizer_step();
  void reset_gradients();  // the gradients so far are dropped: the next train_step starts afresh
  double learning_rate();  // what the next optimizer step applies
  void set_learning_rate(double lr);  // a constant rate from now on (train() too)
  // The loss of one forward in evaluation mode (no dropout, nothing updated).
  double eval_step(const std::map<std::string, Tensor>& batch);
  void add_callback(std::shared_ptr<TrainerCallback> cb) { callbacks_.push_back(std::move(cb)); }
  // Data parallelism of this run (world size 1 without mpirun).
  struct ParallelInfo {
    int world_size = 1, rank = 0, zero_stage = 0;
    std::string backend;              // "single" | "mpi"
    int64_t gradient_reductions = 0;  // gradient reductions across ranks so far
    double reduce_seconds = 0;        // wall time the steps waited for them
    double comm_seconds = 0;          // time the communication thread spent in them (overlapped)
    int64_t buckets = 0;              // ddp_bucket_cap_mb ranges of the gradient buffer
    bool overlapped = false;          // reduced during backward by a communication thread
    int64_t optimizer_state_elements = 0;  // per optimizer state tensor on this rank
    int64_t parameter_elements = 0;        // of the flat parameter buffer
  };
  ParallelInfo parallel_info() const;

 private:
  struct Impl;
  TrainOutput train_loop();
  // train_loop's parts: before the first step, one step's gradients and its update, the log /
  // evaluation / checkpoint after a step or an epoch, after the last step.
  void start_training();
  void begin_steps();  // the step-level API's schedule, once (trainer_steps.cc)
  // Preference data (DPO): the starting policy's summed completion log-probabilities of every
  // pair, once, as TRL's reference (train/preference_reference.cc).
  void precompute_reference_logps();
  // GRPO (train/grpo.h): before each optimizer step, the generation batch it trains sampled,
  // scored and buffered when the step starts a new one (train/grpo_rollout.cc); the reference's
  // trainable weights kept from before the first step when beta != 0.
  void prepare_rollout();
  void keep_grpo_reference();
  // The means of the values logged since the last log, over the processes (trainer.cc).
  std::map<std::string, double> logged_means();
  // The epoch's micro-batches (train::epoch_batches; GRPO's in order).
  std::vector<std::vector<int64_t>> train_batches(int64_t epoch) const;
  double accumulate_gradients(const std::vector<std::vector<int64_t>>& batches, int64_t group_start,
                              int64_t group_end);
  void apply_gradients();
  // The EMA (train/ema.cc): made from the weights before the first step, updated after each
  // optimizer step, written into and read from a checkpoint's ema/ folder.
  void start_ema();
  void update_ema();
  void save_ema(const std::string& checkpoint_dir);
  void load_ema(const std::string& checkpoint_dir);
  // save_model's files; `ema_weights`: the EMA's values for the trained parameters.
  void save_model_files(const std::string& dir, bool ema_weights);
  void maybe_log_save_evaluate(bool epoch_end);
  TrainOutput finish_training();
  // model.safetensors of a checkpoint folder, with a LoRA run's adapters from its
  // adapter_model.safetensors under their graph names.
  std::map<std::string, Tensor> read_checkpoint_weights(const std::string& dir);
  void log(LogEntry entry);
  void save_checkpoint();
  void load_checkpoint(const std::string& dir);
  void rotate_checkpoints();
  // keep_predictions: return every batch's predictions (predict()); otherwise only when
  // compute_metrics reads them.
  PredictionOutput run_eval(const data::Dataset& ds, bool with_metrics,
                            bool keep_predictions = false);
  Metrics evaluate_on(const data::Dataset& ds, const std::string& prefix, bool track_best);
  // predict_with_generate: greedy generation from each sample's prompt, scored against its
  // labelled completion; the generated ids (N, longest) padded with -100 into `generated`.
  Metrics generation_metrics(const data::Dataset& ds, Tensor* generated);
  // The same for an encoder–decoder (train/seq2seq_generation.cc): generated from each sample's
  // encoder inputs, Seq2SeqTrainer's predictions (start token, new tokens, pad_token_id padding).
  Metrics seq2seq_generation_metrics(const data::Dataset& ds, generate::Generator& gen,
                                     generate::GenerationConfig cfg, Tensor* generated);
  // The decoder with a KV cache fed the current weights (rounded as `low` says; shared: every
  // weight a view of the Trainer's, LoRA unmerged).
  generate::Generator& current_generator(kernels::LowPrecision low, bool shared = false);
  // A batch of `ds` with the inputs the model fills by default (Model::fill_defaults) added.
  std::map<std::string, Tensor> load_batch(const data::Dataset& ds,
                                           const std::vector<int64_t>& idx) const;

  Model model_;
  TrainingArguments args_;
  std::shared_ptr<data::Dataset> train_ds_, eval_ds_;
  ComputeMetrics compute_metrics_;
  bool metrics_need_predictions_ = true;
  std::vector<std::shared_ptr<TrainerCallback>> callbacks_;
  TrainerState state_;
  TrainerControl control_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace onyx
