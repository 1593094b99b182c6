// data/speech_dataset.h — speech recognition data for an encoder–decoder (Whisper): a manifest
// (JSONL / JSON / CSV / TSV rows with the audio file and its transcript; relative paths are
// relative to the manifest) read into Whisper's log-mel input features and tokenized labels, as
// Transformers' fine-tuning recipe prepares them: input_features from WhisperFeatureExtractor
// (data/whisper_features.h; audio at another rate resampled to the extractor's as FFmpeg does,
// data/resample.h), labels = the tokenizer's ids of the transcript (its
// post-processor's special tokens included) without a leading decoder start token (the model
// prepends it when shifting labels into decoder_input_ids), padded with -100.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/whisper_features.h"
#include "tokenizers/tokenizer.h"

namespace onyx::data {

struct SpeechOptions {
  std::string format;  // "jsonl", "json", "csv", "tsv"; empty: from the file extension
  std::string audio_field = "audio";
  std::string text_field = "text";
  WhisperFeatureConfig features;  // feature_size, chunk_length, ... (preprocessor_config.json)
  int64_t decoder_start_token_id = -1;  // stripped from the front of the labels when there
  int64_t max_label_length = 448;       // Whisper's max_target_positions: longer is an error
};

// WhisperFeatureConfig from a processor folder's preprocessor_config.json (feature_size,
// sampling_rate, hop_length, n_fft, chunk_length), `base` where it has none; errors name the file.
WhisperFeatureConfig read_preprocessor_config(const std::string& path, WhisperFeatureConfig base);
// The options a processor folder implies (`tokenizer_path`: the folder or a file in it): its
// preprocessor_config.json's features, and Whisper's <|startoftranscript|> as the decoder start
// token when the tokenizer has it.
SpeechOptions processor_speech_options(const std::string& tokenizer_path,
                                       const tokenizers::Tokenizer& tok);

class SpeechDataset : public Dataset {
 public:
  SpeechDataset(const std::string& manifest, std::shared_ptr<const tokenizers::Tokenizer> tok,
                SpeechOptions opts);
  int64_t size() const override { return (int64_t)labels_.size(); }
  // input_features float32 (B, feature_size, frames); labels int64 (B, longest), -100 padded.
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override { return {"input_features", "labels"}; }
  std::vector<int64_t> lengths(const std::string&) const override;  // label tokens

 private:
  SpeechOptions opts_;
  std::vector<std::vector<float>> audio_;  // mono samples, at most chunk_length seconds
  std::vector<std::vector<int64_t>> labels_;
};

}  // namespace onyx::data
