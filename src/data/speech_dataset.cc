// speech_dataset.cc — see speech_dataset.h.
#include "data/speech_dataset.h"

#include <algorithm>
#include <filesystem>

#include "data/text_rows.h"
#include "data/wav.h"
#include "io/json.h"

namespace fs = std::filesystem;

namespace onyx::data {

WhisperFeatureConfig read_preprocessor_config(const std::string& path, WhisperFeatureConfig c) {
  const nlohmann::json j = io::read_json_file(path);
  ONYX_CHECK(j.is_object(), path, ": expected a JSON object");
  auto take = [&](const char* key, int64_t& field, int64_t lo, int64_t hi) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    ONYX_CHECK(it->is_number_integer() && it->get<int64_t>() >= lo && it->get<int64_t>() <= hi,
               path, ": '", key, "' must be an integer in [", lo, ", ", hi, "], got ", it->dump());
    field = it->get<int64_t>();
  };
  take("feature_size", c.feature_size, 1, 512);
  take("sampling_rate", c.sampling_rate, 1000, 192000);
  take("hop_length", c.hop_length, 1, 4096);
  take("n_fft", c.n_fft, 2, 16384);
  take("chunk_length", c.chunk_length, 1, 600);
  return c;
}

SpeechOptions processor_speech_options(const std::string& tokenizer_path,
                                       const tokenizers::Tokenizer& tok) {
  SpeechOptions o;
  const fs::path dir = fs::is_directory(tokenizer_path) ? fs::path(tokenizer_path)
                                                        : fs::path(tokenizer_path).parent_path();
  if (fs::is_regular_file(dir / "preprocessor_config.json"))
    o.features = read_preprocessor_config((dir / "preprocessor_config.json").string(), o.features);
  if (auto start = tok.token_id("<|startoftranscript|>")) o.decoder_start_token_id = *start;
  return o;
}

namespace {

// The transcript's label ids: tokenized, a leading decoder start token dropped.
std::vector<int64_t> transcript_labels(const tokenizers::Tokenizer& tok, const std::string& text,
                                       const SpeechOptions& o, const std::string& where) {
  std::vector<int64_t> ids = tok.encode(text).input_ids;
  if (!ids.empty() && ids[0] == o.decoder_start_token_id) ids.erase(ids.begin());
  ONYX_CHECK(!ids.empty(), where, ": the transcript has no tokens");
  ONYX_CHECK((int64_t)ids.size() <= o.max_label_length, where, ": the transcript is ", ids.size(),
             " tokens, more than the model's ", o.max_label_length, " (max_target_positions)");
  return ids;
}

}  // namespace

SpeechDataset::SpeechDataset(const std::string& manifest,
                             std::shared_ptr<const tokenizers::Tokenizer> tok, SpeechOptions opts)
    : opts_(std::move(opts)) {
  TextClassificationOptions ro;
  ro.format = opts_.format;
  const fs::path dir = fs::path(manifest).parent_path();
  for (const Row& r : read_rows(manifest, ro)) {
    const std::string where = cat("dataset '", manifest, "' line ", r.line);
    const nlohmann::json* a = row_field(r, opts_.audio_field.c_str());
    const nlohmann::json* t = row_field(r, opts_.text_field.c_str());
    ONYX_CHECK(a && a->is_string() && t && t->is_string(), where, ": needs string fields '",
               opts_.audio_field, "' (a WAV file) and '", opts_.text_field, "' (its transcript)");
    fs::path file = a->get<std::string>();
    if (file.is_relative()) file = dir / file;
    WavAudio w = read_wav_at(file.string(), opts_.features.sampling_rate, opts_.features.samples());
    audio_.push_back(std::move(w.samples));
    labels_.push_back(transcript_labels(*tok, t->get<std::string>(), opts_, where));
  }
  ONYX_CHECK(!labels_.empty(), "dataset '", manifest, "' has no rows");
}

std::map<std::string, Tensor> SpeechDataset::batch(const std::vector<int64_t>& idx) const {
  const WhisperFeatureConfig& f = opts_.features;
  const int64_t B = (int64_t)idx.size(), each = f.feature_size * f.frames();
  size_t longest = 0;
  for (int64_t i : idx) longest = std::max(longest, labels_.at(i).size());
  Tensor features(DType::Float32, {B, f.feature_size, f.frames()});
  Tensor labels(DType::Int64, {B, (int64_t)longest});
  std::fill(labels.data<int64_t>(), labels.data<int64_t>() + labels.numel(), (int64_t)-100);
  for (int64_t r = 0; r < B; r++) {
    const Tensor x = whisper_input_features(audio_.at(idx[r]), f);
    std::copy(x.data<float>(), x.data<float>() + each, features.data<float>() + r * each);
    const auto& l = labels_[idx[r]];
    std::copy(l.begin(), l.end(), labels.data<int64_t>() + r * (int64_t)longest);
  }
  return {{"input_features", features}, {"labels", labels}};
}

std::vector<int64_t> SpeechDataset::lengths(const std::string&) const {
  std::vector<int64_t> out;
  for (auto& l : labels_) out.push_back((int64_t)l.size());
  return out;
}

}  // namespace onyx::data
