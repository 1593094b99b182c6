// cmd_train.cc — `onyx train CONFIG [--key value ...]`, `onyx evaluate CONFIG [...]` and
// `onyx predict CONFIG [...] --output PRED.safetensors`: the Trainer driven by a YAML/JSON config
// whose keys are Hugging Face TrainingArguments plus model / loss / data.
#include <iostream>

#include "commands.h"
#include "config/run_config.h"
#include "io/safetensors.h"
#include "onyx/dataset.h"
#include "onyx/trainer.h"
#include "train/progress.h"
#include "train/training_session.h"

namespace onyx::cli {
namespace {

struct Loaded {
  config::RunConfig cfg;
  std::shared_ptr<data::Dataset> train, eval;
};

Loaded load(const std::string& path, const std::vector<std::string>& extras, bool need_train) {
  Loaded l;
  l.cfg = config::load_run_config(path, config::parse_overrides(extras));
  if (need_train) {
    ONYX_CHECK(!l.cfg.train_data.empty(), "config '", path, "': 'train_data' is missing");
    l.train = config::dataset_from_spec(l.cfg.train_data, l.cfg, "train_data");
  }
  if (!l.cfg.eval_data.empty())
    l.eval = config::dataset_from_spec(l.cfg.eval_data, l.cfg, "eval_data");
  return l;
}

}  // namespace

namespace {

// `onyx train --help`'s footer: the config's own keys (config/run_config.cc), then every
// TrainingArguments key with its type, default and help (TrainingArguments::describe()).
std::string config_keys_help() {
  std::string s =
      "Config keys (a YAML or JSON mapping; each can also be given as --key value or --key=value,\n"
      "which overrides the file):\n"
      "  model: str | mapping (required)\n"
      "      An ONNX file, a Hugging Face model folder, or {arch, config, weights, task, seed}.\n"
      "  loss: str | mapping\n"
      "      A scalar graph output, or {type: cross_entropy | mse | output, logits, labels, "
      "ignore_index}.\n"
      "  predictions: str\n"
      "      The graph output that metrics and predict read (default: the loss's logits).\n"
      "  train_data: str | mapping\n"
      "      Training samples: a .safetensors file (tensors named as the graph inputs, dim 0 =\n"
      "      sample), or {type: safetensors | idx_images | text_classification | causal_lm | sft "
      "|\n"
      "      preference | prompts, ...}.\n"
      "  eval_data: str | mapping\n"
      "      Evaluation samples, as train_data.\n"
      "  test_data: str | mapping\n"
      "      Samples for `onyx predict` (default: eval_data), as train_data.\n"
      "  metrics: list\n"
      "      Evaluation metrics: accuracy, f1, mse, perplexity.\n"
      "  frozen: list\n"
      "      Initializers that are not trained.\n"
      "  lora: mapping\n"
      "      LoRA adapters (PEFT's format): {r, lora_alpha, lora_dropout, target_modules, bias,\n"
      "      use_rslora}; only the adapters train, output_dir gets adapter_config.json and\n"
      "      adapter_model.safetensors.\n"
      "  peft_config: str\n"
      "      A PEFT adapter folder (or its adapter_config.json): LoRA as it says, starting from\n"
      "      the folder's adapter_model.safetensors when it has one.\n"
      "  model_init_kwargs: mapping\n"
      "      TRL's: {dtype: bfloat16} stores the frozen linear weights in bf16;\n"
      "      {quantization_config: {load_in_4bit: true, bnb_4bit_quant_type: nf4 | fp4,\n"
      "      bnb_4bit_use_double_quant, bnb_4bit_compute_dtype: float32 | bfloat16,\n"
      "      llm_int8_skip_modules}} stores them in bitsandbytes' 4-bit format (QLoRA; needs\n"
      "      lora or peft_config).\n"
      "  custom_op_libraries: list\n"
      "      Shared libraries of custom ops (include/onyx/custom_op.h), relative to the config.\n"
      "  batch_norm_running_var: str = population  {population, unbiased}\n"
      "      Training-mode BatchNormalization's running_var update: the batch's population\n"
      "      variance (the ONNX spec) or its unbiased variance (PyTorch's BatchNorm).\n"
      "  early_stopping_patience: int | None = None\n"
      "      Stop after this many evaluations without metric_for_best_model improving "
      "(EarlyStoppingCallback).\n"
      "  early_stopping_threshold: float = 0.0\n"
      "      How much metric_for_best_model must improve to count as an improvement.\n"
      "  trainer: str = default  {default, dpo, grpo}\n"
      "      dpo: TRL's DPOTrainer over `type: preference` data (docs/FINE_TUNING.md), with\n"
      "      DPOConfig's keys below and its defaults (learning_rate 1e-6, logging_steps 10,\n"
      "      gradient_checkpointing, bf16 unless fp16). grpo: TRL's GRPOTrainer over `type:\n"
      "      prompts` data, with GRPOConfig's keys below and its defaults (those four, and\n"
      "      per_device_train_batch_size 8).\n"
      "  beta: float = 0.1 (DPO), 0.0 (GRPO)\n"
      "      DPO: the deviation from the reference (IPO's regularization). GRPO: the weight of\n"
      "      the KL term to the reference (the starting policy).\n"
      "  loss_type: str | list = sigmoid (DPO), dapo (GRPO)\n"
      "      DPO: sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, sppo_hard,\n"
      "      apo_zero, apo_down, discopop, sft, sigmoid_norm, or a list of them.\n"
      "      GRPO: dapo, grpo, bnpo, dr_grpo.\n"
      "  loss_weights: list | None = None\n"
      "      DPO: one weight per loss_type (default 1 each).\n"
      "  label_smoothing: float = 0.0\n"
      "      DPO: robust and exo_pair's noise rate, in [0, 0.5).\n"
      "  discopop_tau: float = 0.05\n"
      "      DPO: discopop's temperature.\n"
      "  disable_dropout: bool = true (DPO), false (GRPO)\n"
      "      The model's Dropout turned off, as TRL does.\n"
      "  precompute_ref_log_probs: bool = false\n"
      "      DPO: accepted either way; the reference (the starting policy) is computed once.\n"
      "  precompute_ref_batch_size: int | None = None\n"
      "      DPO: pairs per reference forward (default per_device_train_batch_size).\n"
      "  ref_model: str | None = None\n"
      "      DPO: a reference model folder of the same architecture with other weights (TRL's\n"
      "      ref_model; default: the starting policy).\n"
      "  reward_funcs: list\n"
      "      GRPO: {type: exact_match, column} (1 when the stripped completion equals the\n"
      "      row's column), {type: regex, pattern, dotall} (1 when it matches from the start),\n"
      "      {type: length, target}, {type: python, function: module.function, python,\n"
      "      timeout} (TRL's signature; the module beside the config; run in a worker\n"
      "      process); each with an optional name (rewards/NAME/mean).\n"
      "  reward_weights: list | None = None\n"
      "      GRPO: one weight per reward function (default 1 each).\n"
      "  num_generations: int = 8\n"
      "      GRPO: completions per prompt (a group); the completions of one optimizer step\n"
      "      (per_device_train_batch_size x gradient_accumulation_steps x processes) are whole\n"
      "      groups.\n"
      "  max_completion_length: int = 512\n"
      "      GRPO: new tokens per completion at most.\n"
      "  temperature, top_p, top_k, repetition_penalty: float = 1.0, 1.0, 0, 1.0\n"
      "      GRPO: sampling (the loss divides the logits by the temperature too).\n"
      "  epsilon, epsilon_high: float = 0.2, None\n"
      "      GRPO: the ratio's clip range [1 - epsilon, 1 + epsilon_high] (default epsilon).\n"
      "  num_iterations: int = 1\n"
      "      GRPO: optimizer steps per sampled batch (the old policy's log-probabilities kept).\n"
      "  scale_rewards: str = group  {group, batch, none}\n"
      "      GRPO: the advantage's divisor: its group's reward std, the batch's, or none.\n"
      "  multi_objective_aggregation: str = sum_then_normalize  {sum_then_normalize,\n"
      "      normalize_then_sum}: GRPO: how several reward functions combine.\n"
      "  mask_truncated_completions, shuffle_dataset, use_bias_correction_kl: bool = false,\n"
      "      true, true: GRPO: as GRPOConfig's.\n"
      "\n"
      "TrainingArguments (Hugging Face's names and defaults):\n";
  for (auto& a : TrainingArguments::describe()) {
    s += "  " + a.name + ": " + a.type + " = " + a.default_value;
    if (!a.choices.empty()) {
      s += "  {";
      for (size_t i = 0; i < a.choices.size(); i++) s += (i ? ", " : "") + a.choices[i];
      s += "}";
    }
    s += "\n      " + a.help + "\n";
  }
  return s;
}

constexpr const char* kSeeTrainHelp =
    "Config keys and every TrainingArguments key (--key value overrides the file): see `onyx "
    "train --help`.";

}  // namespace

Action add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a model from a YAML/JSON config");
  auto path = std::make_shared<std::string>();
  cmd->add_option("config", *path, "config file (.yaml or .json)")->required();
  cmd->allow_extras();
  cmd->footer(config_keys_help());
  return [path, cmd]() {
    Loaded l = load(*path, cmd->remaining(), true);
    auto t = config::make_trainer(l.cfg, l.train, l.eval);
    auto out = t->train();
    const auto par = t->parallel_info();
    const bool rank0 = par.rank == 0;   // data parallel: rank 0 reports and saves
    train::Progress::close_open_bar();  // the summary starts on a line of its own
    if (rank0)
      std::cout << "trained " << out.global_step << " steps, train_loss " << out.training_loss
                << "; checkpoints in " << l.cfg.args.output_dir << "\n";
    if (rank0 && par.world_size > 1)
      std::cout << "data parallel: " << par.world_size << " ranks (" << par.backend << "), "
                << (par.zero_stage ? cat("ZeRO stage ", par.zero_stage) : std::string("DDP"))
                << ", " << par.gradient_reductions << " gradient reductions in " << out.global_step
                << " steps (" << par.buckets << " buckets; "
                << (par.overlapped ? cat(par.comm_seconds, " s in the communication thread, ",
                                         par.reduce_seconds, " s of it waited for after backward")
                                   : cat(par.reduce_seconds, " s, not overlapped"))
                << "), " << par.optimizer_state_elements << " of " << par.parameter_elements
                << " optimizer-state elements on rank 0\n";
    if (l.eval) {
      auto m = t->evaluate();
      if (rank0) std::cout << "final evaluation: " << train::format_log_dict(m) << "\n";
    }
    t->save_model(l.cfg.args.output_dir);
    return 0;
  };
}

Action add_evaluate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("evaluate", "evaluate a model (or a checkpoint's weights)");
  auto path = std::make_shared<std::string>();
  auto ckpt = std::make_shared<std::string>();
  cmd->add_option("config", *path, "config file")->required();
  cmd->add_option("--checkpoint", *ckpt, "load weights from this checkpoint folder first");
  cmd->allow_extras();
  cmd->footer(kSeeTrainHelp);
  return [path, ckpt, cmd]() {
    Loaded l = load(*path, cmd->remaining(), false);
    ONYX_CHECK(l.eval, "config '", *path, "': 'eval_data' is missing");
    auto t = config::make_trainer(l.cfg, l.train, l.eval);
    if (!ckpt->empty()) t->load_weights(*ckpt);  // parameters, BatchNorm statistics, adapters
    auto m = t->evaluate();
    for (auto& [k, v] : m) std::cout << k << ": " << v << "\n";
    return 0;
  };
}

Action add_predict_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("predict", "write a model's predictions on test_data");
  auto path = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  cmd->add_option("config", *path, "config file")->required();
  cmd->add_option("--output", *output, "safetensors file for predictions")->required();
  cmd->allow_extras();
  cmd->footer(kSeeTrainHelp);
  return [path, output, cmd]() {
    Loaded l = load(*path, cmd->remaining(), false);
    const auto& spec = !l.cfg.test_data.empty() ? l.cfg.test_data : l.cfg.eval_data;
    ONYX_CHECK(!spec.empty(), "config '", *path, "': 'test_data' (or 'eval_data') is missing");
    auto ds = config::dataset_from_spec(spec, l.cfg, "test_data");
    auto t = config::make_trainer(l.cfg, l.train, l.eval);
    auto po = t->predict(*ds);
    std::map<std::string, Tensor> out;
    if (po.predictions.defined()) out["predictions"] = po.predictions;
    if (po.label_ids.defined()) out["label_ids"] = po.label_ids;
    io::save_safetensors(*output, out);
    for (auto& [k, v] : po.metrics) std::cout << k << ": " << v << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
