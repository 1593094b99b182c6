// cmd_audio.cc — `onyx whisper-features AUDIO.wav [...] --output FEATURES.safetensors
// [--feature_size 80]`: Whisper's log-mel input features of WAV files
// (data/whisper_features.h), as Transformers' WhisperFeatureExtractor gives them, stacked into
// one `input_features` tensor (N, feature_size, 3000; --no_truncation: all of the longest file's
// frames, for long-form transcription). Audio at another rate is resampled to
// 16 kHz as FFmpeg does (data/resample.h); channels are averaged.
#include <iostream>

#include "commands.h"
#include "data/wav.h"
#include "data/whisper_features.h"
#include "io/safetensors.h"

namespace onyx::cli {

Action add_whisper_features_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("whisper-features",
                         "Whisper's log-mel input features of WAV files (resampled to 16 kHz), as "
                         "WhisperFeatureExtractor computes them, into a .safetensors file");
  auto files = std::make_shared<std::vector<std::string>>();
  auto output = std::make_shared<std::string>();
  auto config = std::make_shared<data::WhisperFeatureConfig>();
  cmd->add_option("audio", *files, "WAV files (PCM 8/16/24/32-bit or float, any channels)")
      ->required();
  cmd->add_option("--output", *output, "the .safetensors file to write (input_features)")
      ->required();
  cmd->add_option("--feature_size", config->feature_size,
                  "mel bins: 80, or 128 (whisper-large-v3), as preprocessor_config.json says");
  auto whole = std::make_shared<bool>(false);
  cmd->add_flag("--no_truncation,--no-truncation", *whole,
                "whole recordings, for long-form transcription (the extractor's truncation=False, "
                "padding=\"longest\"): each file zero-padded to the longest, samples / 160 "
                "frames (at most 2 hours a file)");
  return [files, output, config, whole]() {
    const data::WhisperFeatureConfig& c = *config;
    ONYX_CHECK(c.feature_size > 0 && c.feature_size <= 512, "--feature_size ", c.feature_size,
               " is not a number of mel bins (1-512)");
    std::vector<std::vector<float>> audio;
    size_t longest = 0;
    for (const std::string& f : *files) {
      audio.push_back(*whole ? data::read_whole_recording(f, c)
                             : data::read_wav_at(f, c.sampling_rate, c.samples()).samples);
      longest = std::max(longest, audio.back().size());
    }
    const int64_t frames = *whole ? (int64_t)longest / c.hop_length : c.frames();
    Tensor all(DType::Float32, {(int64_t)files->size(), c.feature_size, frames});
    const int64_t each = c.feature_size * frames;
    for (size_t i = 0; i < audio.size(); i++) {
      Tensor f;
      if (*whole) {
        audio[i].resize(longest, 0.0f);
        f = data::whisper_long_input_features(audio[i], c);
      } else {
        f = data::whisper_input_features(audio[i], c);
      }
      std::copy(f.data<float>(), f.data<float>() + each, all.data<float>() + (int64_t)i * each);
    }
    io::save_safetensors(*output, {{"input_features", all}}, {{"format", "pt"}});
    std::cout << "wrote " << *output << ": input_features " << shape_str(all.shape()) << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
