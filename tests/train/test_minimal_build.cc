// test_minimal_build.cc — a minimal build (-DONYX_MINIMAL=ON, cmake/minimal.cmake; the aarch64
// build scripts/test.sh runs under qemu is one) answers every feature it leaves out with an error
// that names the feature and the build, and keeps what needs no library (the UTF-8 codec).
#include <gtest/gtest.h>

#include "data/stft.h"
#include "kernels/cpu/gemm.h"
#include "onyx/error.h"
#include "tokenizers/tokenizer.h"
#include "train/grpo.h"

namespace onyx {
namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(MinimalBuild, LeftOutFeaturesSaySo) {
#if ONYX_MINIMAL
  const std::string minimal = "minimal build (-DONYX_MINIMAL=ON)";
  std::string e = error_of([] { tokenizers::load_tokenizer("my-model/tokenizer.json"); });
  EXPECT_NE(e.find("tokenizer 'my-model/tokenizer.json'"), std::string::npos) << e;
  EXPECT_NE(e.find(minimal), std::string::npos) << e;
  e = error_of(
      [] { data::stft_power(std::vector<double>(400), std::vector<double>(400), 160, 1); });
  EXPECT_NE(e.find("FFTW"), std::string::npos) << e;
  EXPECT_NE(e.find(minimal), std::string::npos) << e;
  e = error_of([] { kernels::set_gemm_backend(kernels::GemmBackend::OpenBLAS); });
  EXPECT_NE(e.find(minimal), std::string::npos) << e;
  EXPECT_EQ(kernels::gemm_backend(), kernels::GemmBackend::OneDNN);  // unchanged
  EXPECT_EQ(kernels::available_gemm_backends().size(), 2u);
  e = error_of([] { train::regex_reward("r", "^a", false, "config 'c.yaml': reward regex"); });
  EXPECT_NE(e.find("config 'c.yaml': reward regex"), std::string::npos) << e;
  EXPECT_NE(e.find(minimal), std::string::npos) << e;
  // what needs no library stays
  EXPECT_EQ(tokenizers::unicode::encode_utf8(U"\u00e9t\u00e9"), "\xc3\xa9t\xc3\xa9");
#else
  GTEST_SKIP() << "a full build: these features are present (their own tests cover them)";
#endif
}

}  // namespace
}  // namespace onyx
