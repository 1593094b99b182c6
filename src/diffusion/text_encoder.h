// diffusion/text_encoder.h — the frozen text encoder of text-to-image training and sampling: a
// CLIPTextModel folder (models/clip_text.cc) and its CLIP tokenizer, used as diffusers' scripts and
// StableDiffusionPipeline use them: tokenizer(prompts, max_length=tokenizer.model_max_length,
// padding="max_length", truncation=True) then text_encoder(input_ids)[0] — the last hidden state,
// with no attention mask (the encoder attends to the padding, as train_text_to_image.py and the
// pipeline call it for CLIP).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diffusion/sampler.h"
#include "onyx/tensor.h"
#include "onyx/trainer.h"
#include "tokenizers/tokenizer.h"

namespace onyx::diffusion {

// tokenizer_config.json's model_max_length, when it is a sensible one (Transformers writes a huge
// sentinel for "none") and at most `positions`; else `positions`.
int64_t model_max_length(const std::string& tokenizer_dir, int64_t positions);
// (N, max_length) int64: each prompt with its special tokens, truncated and padded to max_length
// (tokenizer(prompts, max_length=, padding="max_length", truncation=True)).
Tensor prompt_ids(const tokenizers::Tokenizer& tokenizer, const std::vector<std::string>& prompts,
                  int64_t max_length);

class TextEncoder {
 public:
  // `encoder_dir`: a CLIPTextModel folder with its weights (every one: a frozen encoder with a
  // missing weight would be random); `tokenizer_dir`: its tokenizer folder. Errors name them.
  static std::shared_ptr<TextEncoder> open(const std::string& encoder_dir,
                                           const std::string& tokenizer_dir);
  // A pipeline's text_encoder/ and tokenizer/ beside the model folder `unet_dir`
  // (diffusers_folder.h: pipeline_root), or null when it is in no pipeline or the pipeline has
  // neither.
  static std::shared_ptr<TextEncoder> beside(const std::string& unet_dir);
  // The model folder's own text_encoder/ and tokenizer/ (onyx train's output_dir), else beside.
  static std::shared_ptr<TextEncoder> of_model(const std::string& unet_dir);
  ~TextEncoder();

  // (N, max_length) int64: each prompt with CLIP's special tokens, truncated and padded.
  Tensor input_ids(const std::vector<std::string>& prompts) const;
  // (N, max_length, hidden_size) float32: the last hidden state of input_ids (N, L) int64.
  Tensor encode(const Tensor& input_ids) const;
  Tensor encode(const std::vector<std::string>& prompts) const {
    return encode(input_ids(prompts));
  }
  int64_t hidden_size() const;
  int64_t max_length() const;
  const std::string& encoder_dir() const;
  const std::string& tokenizer_dir() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Text-to-image training on a UNet2DConditionModel's training model (objective.h): each batch's
// encoder_hidden_states from its input_ids, or — with `captions`, one per class — from the
// caption of each row's label, through the frozen encoder (train_text_to_image.py's step). With
// `proportion_empty_prompts` p, each row's caption is the empty prompt with probability p (the
// script's --proportion_empty_prompts, which teaches the unconditional output that guidance
// needs): the draw is keyed on `seed` and the row's ids and pixels, so a resumed run repeats it.
// A batch that brings its own encoder_hidden_states keeps them. save_model copies the encoder's
// and the tokenizer's folders into output_dir (text_encoder/, tokenizer/) for sampling.
void condition_on_text(Model& m, std::shared_ptr<const TextEncoder> encoder,
                       std::vector<std::string> captions, double proportion_empty_prompts = 0,
                       uint64_t seed = 0);

// Prompts for sampling a UNet2DConditionModel, as StableDiffusionPipeline encodes them.
struct PromptOptions {
  std::vector<std::string> prompts;
  std::string negative_prompt;          // with guidance_scale > 1 ("" as the pipeline's default)
  int64_t per_prompt = 1;               // num_images_per_prompt
  std::string text_encoder, tokenizer;  // "": TextEncoder::of_model
};
// Sets o.encoder_hidden_states (each prompt's `per_prompt` times in a row) and, when o guides,
// o.negative_encoder_hidden_states; o.num_images is their number.
void encode_prompts(const std::string& model_dir, const PromptOptions& p, SampleOptions& o);

}  // namespace onyx::diffusion
