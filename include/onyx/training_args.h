// onyx/training_args.h — Hugging Face TrainingArguments, same names and defaults, so a config
// written for `Trainer` / `ORTTrainer` reads the same here. Unknown or ill-typed keys are errors
// that name the key.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace onyx {

struct TrainingArguments {
  std::string output_dir = "onyx_output";
  double learning_rate = 5e-5;
  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;
  int64_t warmup_steps = 0;
  double warmup_ratio = 0.0;
  std::string lr_scheduler_type = "linear";
  // The schedule function's own parameters as a JSON object ("" = None): num_cycles, lr_end,
  // power, timescale, min_lr / min_lr_rate, warmup_lr_rate, num_decay_steps, ...
  std::string lr_scheduler_kwargs;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;
  std::string optim = "adamw_fused";  // adamw_fused | adamw | sgd (+ HF/ORT aliases)
  double sgd_momentum = 0.0;          // onyx extension (HF passes these through optim_args)
  bool sgd_nesterov = false;
  std::string logging_strategy = "steps";  // no | steps | epoch
  double logging_steps = 500;  // steps (>= 1) or a ratio of max_steps (< 1), as Transformers
  bool logging_first_step = false;
  // A non-finite micro-batch loss adds the mean of the losses since the last log instead.
  bool logging_nan_inf_filter = true;
  std::string eval_strategy = "no";     // no | steps | epoch
  std::optional<double> eval_steps;     // default: logging_steps; a ratio when < 1
  std::string save_strategy = "steps";  // no | steps | epoch
  double save_steps = 500;              // a ratio of max_steps when < 1
  std::optional<int64_t> save_total_limit;
  bool load_best_model_at_end = false;
  std::optional<std::string> metric_for_best_model;
  std::optional<bool> greater_is_better;
  int64_t seed = 42;
  std::optional<int64_t> data_seed;
  bool dataloader_drop_last = false;
  std::string train_sampling_strategy = "random";  // random | sequential | group_by_length
  std::string length_column_name = "length";       // group_by_length's precomputed lengths
  double label_smoothing_factor = 0.0;
  std::optional<std::string> resume_from_checkpoint;
  bool disable_tqdm = false;
  // Recompute each transformer layer's activations in backward instead of keeping them.
  bool gradient_checkpointing = false;
  // Mixed precision as PyTorch's CPU autocast runs matmuls: the linear layers' GEMMs (forward, dX
  // and dW; the LM head's too) take bf16 inputs and accumulate in float32 — the weights through a
  // bf16 shadow the optimizer writes, the activations the GEMMs read stored bf16 in the arena
  // (passes/mixed_precision.cc); master weights, gradients, the optimizer, norms, softmax, the
  // residual stream and the loss stay float32; attention's tile products (on bf16 Q/K/V, the
  // softmax P, dO and dS) and Conv with its gradients also take bf16 operands, as autocast runs
  // SDPA and conv. fp16 is an error: these CPUs have no float16 arithmetic.
  bool bf16 = false;
  bool fp16 = false;
  // Transformers' bf16_full_eval: evaluate() / predict() called outside train() (`onyx evaluate`,
  // `onyx predict`, the evaluation `onyx train` runs after training, the Python package's
  // Trainer.evaluate()) read the trained weights rounded to bf16 — what model.to(torch.bfloat16)
  // holds — with bf16 GEMM inputs and float32 accumulation; the weights stay float32, and
  // evaluations during training are unchanged (Transformers casts only outside train()). Norms,
  // softmax and the loss compute in float32 (torch's bf16 model rounds every activation), and
  // frozen weights and buffers are read as stored. fp16_full_eval is an error.
  bool bf16_full_eval = false;
  bool fp16_full_eval = false;
  // Halve per_device_train_batch_size until the planned step memory fits (max_memory, else the
  // machine's available memory), as Transformers does after out-of-memory errors.
  bool auto_find_batch_size = false;
  // onyx extension: memory budget for one training step ("6GB", "512MiB", bytes); with
  // auto_find_batch_size the largest batch (halving) whose plan fits is used, else a plan over
  // budget is an error before the first step.
  std::optional<std::string> max_memory;
  // Where logs go besides log_history.jsonl: "none" (Transformers 5's default) or "tensorboard"
  // ("all" = every integration onyx has, i.e. tensorboard).
  std::string report_to = "none";
  // TensorBoard event folder; empty = $TENSORBOARD_LOGGING_DIR, else
  // output_dir/runs/<Mon><DD>_<HH-MM-SS>_<host> (Transformers' default_logdir).
  std::string logging_dir;
  // Data parallelism (under mpirun; see docs/DISTRIBUTED.md). Seconds a collective may wait for
  // the other ranks before the job is stopped (Transformers' ddp_timeout).
  int64_t ddp_timeout = 1800;
  // Gradient reduction bucket size in MiB (None: 25, PyTorch DDP's default).
  std::optional<int64_t> ddp_bucket_cap_mb;
  // onyx extension (DeepSpeed's zero_optimization.stage): 0 = DDP (every rank holds the whole
  // optimizer state), 1 = AdamW moments sharded across ranks, 2 = gradients accumulated only in
  // the local shard too.
  int64_t zero_stage = 0;
  // Causal LMs (Seq2SeqTrainingArguments' predict_with_generate): evaluate() also generates from
  // each sample's prompt — its tokens before the first label != -100 — with a KV cache (as the
  // model's generation_config.json says, greedily without one; the generation_* arguments below
  // over it) and scores the result against the labelled completion; predict() returns the
  // generated ids.
  bool predict_with_generate = false;
  // Tokens generated per sample (None: as many as the sample's labelled completion has).
  std::optional<int64_t> generation_max_new_tokens;
  // Seq2SeqTrainingArguments' generation_num_beams: beam search with this many beams (None: 1,
  // greedy) and generation_max_length: generated sequences of at most this many tokens, the
  // left-padded prompt included, when generation_max_new_tokens is None.
  std::optional<int64_t> generation_num_beams;
  std::optional<int64_t> generation_max_length;
  // The keys of Transformers' TrainingArguments onyx has no field for (run_name, do_train,
  // dataloader_num_workers, push_to_hub, ...; src/train/transformers_keys.h): the values given,
  // as JSON text, by key. Each is inert here (any value) or accepted at its default only.
  std::map<std::string, std::string> transformers_only;

  // Sets one argument from its text form ("1e-4", "true", "linear"); throws naming the key.
  void set(const std::string& key, const std::string& value);
  static bool is_key(const std::string& key);
  static std::vector<std::string> keys();
  // One key as `onyx train --help` lists it.
  struct ArgInfo {
    std::string name;
    std::string type;                  // float, int, bool, str, int | None, str | None, bool | None
    std::vector<std::string> choices;  // the values a choice key accepts; empty otherwise
    std::string default_value;         // as a config writes it: 5e-05, 8, false, "linear", None
    std::string help;                  // one line, after Transformers' TrainingArguments docs
  };
  // Every key, in keys() order, with its type, default and help.
  static std::vector<ArgInfo> describe();
  // Checks cross-field rules (strategies, positive sizes, best-model metric, ...).
  void validate() const;
  // All arguments as a JSON object text (saved as training_args.json in checkpoints).
  std::string to_json() const;
  // Canonical optimizer name for `optim` (aliases: adamw_torch, adamw_torch_fused, adamw_ort_fused
  // -> adamw_fused; adamw_hf -> adamw).
  std::string optimizer_name() const;
  std::string best_metric_name() const;  // metric_for_best_model, default "loss"
  bool best_is_greater() const;
  // logging_steps / eval_steps / save_steps as a number of steps: a value below 1 is a ratio of
  // max_steps, rounded up (Transformers' rule).
  static int64_t interval(double steps,
                          int64_t max_steps);  // greater_is_better, default false for *loss
};

}  // namespace onyx
