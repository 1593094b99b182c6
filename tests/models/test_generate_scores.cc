// tests/models/test_generate_scores.cc — what decoding reports for Whisper's temperature fallback
// (generate/whisper_fallback.h): the picked token's log-probability (greedy: under the logits;
// sampling: under the top-k / top-p survivors at temperature 1, as Transformers rescales its
// warped scores), the zlib compression ratio, and the checks on the fallback's options. The
// values against Transformers' own functions: tests/parity/test_whisper_fallback.py.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "generate/whisper_fallback.h"

namespace onyx::generate {
namespace {

double log_softmax(const std::vector<float>& x, size_t k, const std::vector<size_t>& over) {
  double sum = 0;
  for (size_t i : over) sum += std::exp((double)x[i]);
  return (double)x[k] - std::log(sum);
}

TEST(GenerateScores, GreedyLogprobIsTheLogSoftmaxOfThePick) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f};
  GenerationConfig cfg;
  double lp = 0;
  EXPECT_EQ(pick_token(logits.data(), 4, cfg, 0.0, &lp), 1);
  EXPECT_NEAR(lp, log_softmax(logits, 1, {0, 1, 2, 3}), 1e-12);
}

TEST(GenerateScores, SampledLogprobIsOverTheTopKAtTemperatureOne) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.5f};
  GenerationConfig cfg;
  cfg.do_sample = true;
  cfg.temperature = 0.5;
  cfg.top_k = 2;
  for (double u : {0.0, 0.999}) {
    double lp = 0;
    const int64_t t = pick_token(logits.data(), 4, cfg, u, &lp);
    ASSERT_TRUE(t == 1 || t == 3) << t;  // only the two largest survive top-k
    EXPECT_NEAR(lp, log_softmax(logits, (size_t)t, {1, 3}), 1e-6) << "u " << u;
  }
}

TEST(GenerateScores, CompressionRatioGrowsWithRepetition) {
  std::vector<int64_t> same(200, 50000), varied;
  for (int64_t i = 0; i < 8; i++) varied.push_back(1000 + 977 * i);
  // 51865 tokens: two bytes each; 400 bytes of one repeated pair compress to a few
  EXPECT_GT(whisper_compression_ratio(same, 51865), 10.0);
  EXPECT_LT(whisper_compression_ratio(varied, 51865), 1.0);  // 16 bytes: zlib adds its header
  EXPECT_EQ(whisper_compression_ratio({}, 51865), 0.0);
}

TEST(GenerateScores, FallbackOptionsAreChecked) {
  WhisperFallback f;
  f.temperatures = {0.0, -0.2};
  EXPECT_THROW(validate_whisper_fallback(f, 100), std::exception);
  f.temperatures = {0.0, 0.2};
  f.no_speech_threshold = 0.6;
  EXPECT_THROW(validate_whisper_fallback(f, 100), std::exception);  // without logprob_threshold
  f.logprob_threshold = -1.0;
  EXPECT_THROW(validate_whisper_fallback(f, 100), std::exception);  // no <|nospeech|> token
  f.no_speech_token_id = 40;
  EXPECT_NO_THROW(validate_whisper_fallback(f, 100));
  f.compression_ratio_threshold = NAN;
  EXPECT_THROW(validate_whisper_fallback(f, 100), std::exception);
}

}  // namespace
}  // namespace onyx::generate
