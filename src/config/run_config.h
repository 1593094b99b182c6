// config/run_config.h — the `onyx train` config file (YAML or JSON): the model, the loss, the data,
// metrics, and any TrainingArguments by their Hugging Face names. `--key value` on the command line
// overrides the file. Unknown keys and ill-typed values are errors naming the key and the file.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/lora.h"
#include "models/preference_head.h"
#include "onyx/dataset.h"
#include "onyx/trainer.h"
#include "onyx/training_args.h"
#include "quant/bnb_config.h"
#include "train/grpo.h"

namespace onyx::config {

// A dataset: a safetensors file/folder (`path`), or a typed mapping kept as YAML text (`spec`):
// {type: idx_images, folder|images+labels, split}, {type: text_classification, path, tokenizer,
// ...}, {type: causal_lm, path, tokenizer, block_size}.
struct DataSpec {
  std::string path;
  std::string spec;
  bool empty() const { return path.empty() && spec.empty(); }
};

struct RunConfig {
  std::string path;        // the config file
  std::string dir;         // its folder (relative paths resolve against it)
  std::string model;       // .onnx path or Hugging Face folder
  std::string model_spec;  // or a mapping {arch, config, weights, task} as YAML text
  autodiff::LossSpec loss;
  DataSpec train_data, eval_data, test_data;
  std::vector<std::string> metrics;
  std::vector<std::string> frozen;
  std::vector<std::string> custom_op_libraries;  // loaded while the config is read (custom_ops.h)
  std::string predictions;                       // output used for metrics / predict
  // Training-mode BatchNormalization's running_var update: "population" (the ONNX spec's batch
  // variance) or "unbiased" (N - 1, PyTorch's BatchNorm); Model::batch_norm_unbiased_var.
  std::string batch_norm_running_var = "population";
  // Transformers' EarlyStoppingCallback(early_stopping_patience, early_stopping_threshold)
  std::optional<int64_t> early_stopping_patience;
  double early_stopping_threshold = 0.0;
  TrainingArguments args;
  // LoRA adapters (models/lora.h): `lora: {r, lora_alpha, lora_dropout, target_modules, bias,
  // use_rslora}`, or `peft_config: ADAPTER_FOLDER_OR_JSON` (a folder's adapter_model.safetensors
  // gives the adapters' initial values).
  std::optional<models::LoraSpec> lora;
  std::string lora_initial;  // adapter_model.safetensors to start from ("" = PEFT's init)
  // model_init_kwargs.dtype (TRL): "bfloat16" stores the frozen linear weights (LoRA's base, or
  // `frozen` layers) in bf16 and multiplies them with bf16 inputs and float32 accumulation;
  // trainable weights, activations and the optimizer stay float32. "float32" (default, also
  // "auto") keeps every weight float32.
  std::string frozen_dtype = "float32";
  // model_init_kwargs.quantization_config (TRL; Transformers' BitsAndBytesConfig, 4-bit): QLoRA —
  // the frozen linear weights Transformers would quantize stored in bitsandbytes' 4-bit format
  // (models/lora.h store_frozen_weights_4bit). Needs LoRA.
  std::optional<quant::BnbConfig> quantization;
  // `trainer: dpo` — TRL's DPOTrainer: the causal LM's loss becomes DPOConfig's (beta, loss_type,
  // loss_weights, label_smoothing, discopop_tau, disable_dropout, precompute_ref_batch_size: keys
  // of the config, as DPOConfig's), over `type: preference` data (models/preference_head.h).
  // "default": the model's own loss.
  // `trainer: grpo` — TRL's GRPOTrainer: GRPOConfig's keys (num_generations,
  // max_completion_length, temperature, top_p, top_k, repetition_penalty, beta, epsilon,
  // epsilon_high, loss_type, scale_rewards, num_iterations, reward_weights, ...) and the CLI's
  // reward_funcs (train/grpo.h builtin_reward), over `type: prompts` data (train/grpo.h).
  std::string trainer = "default";
  models::PreferenceLoss dpo;
  int64_t precompute_ref_batch_size = 0;
  std::string ref_model;  // DPO: TRL's ref_model, a model folder (Model::reference_model)
  train::GrpoOptions grpo;
  bool grpo_epsilon_high_given = false;  // else epsilon_high follows epsilon (GRPOConfig's None)
  // Diffusion training (a diffusers model folder; diffusion/unet2d.h), as diffusers' example
  // scripts' options: the noise scheduler (a scheduler_config.json or a folder holding one, or
  // the folder's own / its pipeline's scheduler, else DDPMScheduler's defaults), the prediction
  // type over the scheduler's, min-SNR weighting, and the EMA of the weights.
  struct Diffusion {
    std::string noise_scheduler;       // a path, resolved against the config's folder
    std::string noise_scheduler_json;  // or an inline mapping, as JSON text
    std::string prediction_type;       // "" = the scheduler's
    double snr_gamma = 0;              // 0: off
    double class_dropout_prob = 0.1;   // DiT: labels dropped to the null class in training
    EmaConfig ema;
    // Text-to-image (a UNet2DConditionModel): the frozen CLIPTextModel folder and its tokenizer
    // (default: the pipeline's text_encoder/ and tokenizer/ beside the model folder), and the
    // caption of each class label when the data has labels rather than input_ids.
    std::string text_encoder, tokenizer;
    std::vector<std::string> captions;
    double proportion_empty_prompts = 0;  // captions replaced by "" (train_text_to_image.py's)
    // Latent diffusion: the frozen AutoencoderKL folder ("" = the pipeline's vae/ beside the
    // model folder when there is one; "none" = train on pixel_values as given).
    std::string vae;
  } diffusion;
  // keys of DPOConfig / GRPOConfig given before `trainer:` said which (applied when it does)
  std::vector<std::pair<std::string, std::string>> pending_method_keys;
};

// overrides: ("learning_rate", "1e-4"), ... applied after the file, in order.
RunConfig load_run_config(const std::string& path,
                          const std::vector<std::pair<std::string, std::string>>& overrides);

// A config from its YAML / JSON text (the C API's); relative paths resolve against `dir`, errors
// name `what`.
RunConfig parse_run_config(const std::string& text, const std::string& dir,
                           const std::string& what);

// One key of a config from its YAML text, as the file would set it (the Python package's
// DPOTrainer passes DPOConfig's keys this way); errors name `what`.
void set_config_key(RunConfig& c, const std::string& key, const std::string& yaml_text,
                    const std::string& what);

// Parses "--key value" / "--key=value" pairs; throws on a dangling key.
std::vector<std::pair<std::string, std::string>> parse_overrides(
    const std::vector<std::string>& args);

Model model_from_config(const RunConfig& c);
// The Trainer `onyx train` makes of a config: its model, metrics and early stopping, over the
// given datasets (either may be null); predictions kept only when a metric reads them (perplexity
// is the eval loss's).
std::unique_ptr<Trainer> make_trainer(const RunConfig& c, std::shared_ptr<data::Dataset> train,
                                      std::shared_ptr<data::Dataset> eval);
std::shared_ptr<data::Dataset> dataset_from_spec(const DataSpec& d, const RunConfig& c,
                                                 const std::string& which);

}  // namespace onyx::config
