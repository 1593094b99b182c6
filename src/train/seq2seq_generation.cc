// seq2seq_generation.cc — predict_with_generate for an encoder–decoder (Whisper, BART, T5), as
// Transformers' Seq2SeqTrainer.prediction_step: each eval batch's encoder inputs generate from
// decoder_start_token_id (Whisper: the language / task / no-timestamps prompt its generate()
// builds, the language detected per row when the config names none) with generation_max_length /
// generation_num_beams over the model's generation config; the predictions are generate()'s
// sequences (the start token, the new tokens, finished rows padded with pad_token_id to the batch's
// longest, and every row to the generation config's max_length when shorter; Whisper's without the
// start token, as its generate() strips the decoder prompt), joined across batches padded with
// -100. A Whisper whose vocabulary has timestamp tokens decodes as Transformers 5's generate()
// does even without timestamps: a window whose tokens hold a timestamp pair is split there and
// decoded again from the pair (generate/whisper_transcribe.h); its prediction is the segments'
// tokens, without the eos.
#include <algorithm>
#include <filesystem>

#include "data/dataset.h"
#include "generate/generate.h"
#include "generate/whisper_prompt.h"
#include "generate/whisper_transcribe.h"
#include "train/trainer_internal.h"

namespace onyx {

namespace {

// The encoder graph's inputs from an eval batch.
std::map<std::string, Tensor> encoder_inputs(const generate::Generator& gen,
                                             const std::map<std::string, Tensor>& batch) {
  std::map<std::string, Tensor> out;
  for (auto& in : gen.encoder_graph().inputs) {
    auto it = batch.find(in.name);
    ONYX_CHECK(it != batch.end(), "predict_with_generate: the eval dataset has no '", in.name,
               "' (the encoder's input)");
    out[in.name] = it->second;
  }
  return out;
}

// The labelled tokens of row r (labels != -100).
std::vector<int64_t> reference(const Tensor& labels, int64_t r) {
  const int64_t T = labels.dim(1);
  const int64_t* l = labels.data<int64_t>() + r * T;
  std::vector<int64_t> out;
  for (int64_t t = 0; t < T; t++)
    if (l[t] != -100) out.push_back(l[t]);
  return out;
}

// Whisper's window-by-window decoding of one eval batch (a model with timestamp tokens): each
// row's segments' tokens.
std::vector<std::vector<int64_t>> whisper_windows(generate::Generator& gen,
                                                  const std::map<std::string, Tensor>& enc,
                                                  const std::vector<std::vector<int64_t>>& prompts,
                                                  const generate::GenerationConfig& cfg,
                                                  int64_t timestamp_begin) {
  const Tensor& features = enc.at("input_features");
  generate::WhisperWindows w;
  w.timestamp_begin = timestamp_begin;
  const std::vector<int64_t> frames((size_t)features.dim(0), features.dim(2));
  std::vector<std::vector<int64_t>> out;
  for (auto& t : generate::whisper_transcribe(gen, features, frames, prompts, cfg, w))
    out.push_back(std::move(t.tokens));
  return out;
}

}  // namespace

Metrics Trainer::seq2seq_generation_metrics(const data::Dataset& ds, generate::Generator& gen,
                                            generate::GenerationConfig cfg, Tensor* generated) {
  const models::HfConfig& mc = gen.config();
  const int64_t start =
      cfg.decoder_start_token_id >= 0 ? cfg.decoder_start_token_id : mc.s2s.decoder_start_token_id;
  const int64_t pad = cfg.pad_token_id >= 0 ? cfg.pad_token_id : mc.pad_token_id;
  // the generation config's max_length (Transformers' default 20): what rows are padded to
  const int64_t config_max_length = cfg.max_length > 0 ? cfg.max_length : 20;
  const bool keeps_start = mc.model_type != "whisper";
  if (args_.generation_max_new_tokens) {
    cfg.max_new_tokens = *args_.generation_max_new_tokens;
  } else if (args_.generation_max_length || !cfg.length_given) {
    cfg.max_new_tokens = -1;  // max_length counts the decoder start token
    cfg.max_length = args_.generation_max_length.value_or(config_max_length);
  }
  if (args_.generation_num_beams) cfg.num_beams = *args_.generation_num_beams;
  if (cfg.num_beams > 1) cfg.do_sample = false;
  generate::WhisperPromptConfig whisper;  // its generation_config.json's prompt keys, if any
  for (auto& f : model_.processor_files)
    if (mc.model_type == "whisper" &&
        std::filesystem::path(f).filename() == "generation_config.json")
      whisper = generate::read_whisper_prompt_config(std::filesystem::path(f).parent_path());
  ONYX_CHECK(!whisper.return_timestamps,
             "predict_with_generate: generation_config.json sets return_timestamps; onyx's "
             "Seq2SeqTrainer generates without timestamps (set it false)");
  // timestamp tokens after <|notimestamps|>: Transformers splits windows at their pairs
  const int64_t timestamp_begin = whisper.timestamp_begin(mc.vocab_size);
  std::vector<std::vector<int64_t>> rows;
  train::GenerationScore score;
  for (auto& idx :
       data::make_batches(train::eval_order(ds, args_), args_.per_device_eval_batch_size, false)) {
    auto batch = load_batch(ds, idx);
    ONYX_CHECK(batch.count("labels"), "predict_with_generate: the eval dataset has no labels");
    const Tensor& labels = batch.at("labels");
    const auto enc = encoder_inputs(gen, batch);
    std::vector<std::vector<int64_t>> prompts(idx.size(), {start});
    if (mc.model_type == "whisper")
      prompts = generate::whisper_prompts(whisper, start, "", "", false, (int64_t)idx.size(), [&] {
        return generate::detect_whisper_languages(gen, whisper, start, enc);
      });
    auto out = timestamp_begin >= 0 ? whisper_windows(gen, enc, prompts, cfg, timestamp_begin)
                                    : gen.generate(prompts, cfg, nullptr, enc);
    size_t longest = 0;
    for (auto& o : out) longest = std::max(longest, o.size() + (keeps_start ? 1 : 0));
    for (size_t r = 0; r < out.size(); r++) {
      score.add(reference(labels, (int64_t)r), out[r]);
      std::vector<int64_t> row;
      if (keeps_start) row.push_back(start);
      row.insert(row.end(), out[r].begin(), out[r].end());
      row.resize(std::max<size_t>(longest, (size_t)config_max_length), pad);
      rows.push_back(std::move(row));
    }
  }
  ONYX_CHECK(score.n > 0, "predict_with_generate: the eval dataset is empty");
  if (generated) *generated = train::padded_rows(rows);  // across batches: -100
  Metrics m;
  score.write(m);
  return m;
}

}  // namespace onyx
