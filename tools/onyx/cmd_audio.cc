// cmd_audio.cc — `onyx whisper-features AUDIO.wav [...] --output FEATURES.safetensors
// [--feature_size 80]`: Whisper's log-mel input features of WAV files
// (data/whisper_features.h), as Transformers' WhisperFeatureExtractor gives them, stacked into
// one `input_features` tensor (N, feature_size, 3000). Audio at another rate is resampled to
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
  return [files, output, config]() {
    const data::WhisperFeatureConfig& c = *config;
    ONYX_CHECK(c.feature_size > 0 && c.feature_size <= 512, "--feature_size ", c.feature_size,
               " is not a number of mel bins (1-512)");
    Tensor all(DType::Float32, {(int64_t)files->size(), c.feature_size, c.frames()});
    const int64_t each = c.feature_size * c.frames();
    for (size_t i = 0; i < files->size(); i++) {
      const data::WavAudio a = data::read_wav_at((*files)[i], c.sampling_rate, c.samples());
      const Tensor f = data::whisper_input_features(a.samples, c);
      std::copy(f.data<float>(), f.data<float>() + each, all.data<float>() + (int64_t)i * each);
    }
    io::save_safetensors(*output, {{"input_features", all}}, {{"format", "pt"}});
    std::cout << "wrote " << *output << ": input_features " << shape_str(all.shape()) << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
