// tests/io/test_gguf.cc — the GGUF writer's encodings (io/gguf.h): float -> half for every half
// value and every midpoint between neighbours (ties to even), overflow, subnormals and NaN; Q8_0
// blocks (scale = amax / 127 as a half, values rounded half away from zero) and Q4_0 blocks; a
// written file's header, metadata and tensor offsets read back. tests/parity/test_gguf.py reads
// whole exports with the gguf package.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/gguf.h"

using namespace onyx;

namespace {

// A half's value, decoded exactly.
double half_value(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * std::ldexp((double)m, -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * std::ldexp(1024.0 + m, e - 25);
}

TEST(Gguf, HalfRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x7C00; h++) {  // every finite non-negative half
    const double v = half_value((uint16_t)h);
    ASSERT_EQ(io::float_to_half((float)v), h) << h;
    ASSERT_EQ(io::float_to_half((float)-v), h | 0x8000) << h;
    if (h + 1 < 0x7C00) {  // the midpoint to the next half (exact in float) goes to the even one
      const float mid = (float)((v + half_value((uint16_t)(h + 1))) / 2);
      ASSERT_EQ(io::float_to_half(mid), (h & 1) ? h + 1 : h) << h;
    }
  }
  EXPECT_EQ(io::float_to_half(65520.0f), 0x7C00);  // rounds up to infinity
  EXPECT_EQ(io::float_to_half(65519.0f), 0x7BFF);
  EXPECT_EQ(io::float_to_half(INFINITY), 0x7C00);
  EXPECT_EQ(io::float_to_half(-1e30f), 0xFC00);
  EXPECT_EQ(io::float_to_half(1e-10f), 0);  // below half the smallest subnormal
  EXPECT_EQ(io::float_to_half(NAN) & 0x7E00, 0x7E00);
}

TEST(Gguf, Q8_0Blocks) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; i++) x[i] = (float)(i - 20) * 0.37f;
  x[40] = 0;
  const std::string q = io::encode_q8_0(x.data(), 64);
  ASSERT_EQ(q.size(), 2u * 34);
  for (int b = 0; b < 2; b++) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.0f;
    uint16_t dh;
    std::memcpy(&dh, q.data() + b * 34, 2);
    EXPECT_EQ(dh, io::float_to_half(d));
    for (int i = 0; i < 32; i++) {
      const int8_t v = (int8_t)q[b * 34 + 2 + i];
      EXPECT_EQ(v, (int)std::round(x[b * 32 + i] * (1.0f / d))) << b << " " << i;
    }
  }
  std::vector<float> zeros(32, 0.0f);
  const std::string z = io::encode_q8_0(zeros.data(), 32);
  for (char c : z) EXPECT_EQ(c, 0);
  EXPECT_THROW(io::encode_q8_0(x.data(), 40), Error);
}

// Q4_0: d = (the value of largest magnitude) / -8 as a half, code = min(15, trunc(x / d + 8.5)),
// value j in byte j's low nibble and value 16 + j in its high one; the largest value of a block
// decodes exactly (code 0), a block of zeros is all code 8 with d = -0.
TEST(Gguf, Q4_0Blocks) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; i++) x[i] = (float)(i - 20) * 0.37f;
  x[33] = -30.0f;  // the second block's largest magnitude, negative
  const std::string q = io::encode_q4_0(x.data(), 64);
  ASSERT_EQ(q.size(), 2u * 18);
  for (int b = 0; b < 2; b++) {
    float amax = 0, max = 0;
    for (int i = 0; i < 32; i++)
      if (std::fabs(x[b * 32 + i]) > amax) amax = std::fabs(x[b * 32 + i]), max = x[b * 32 + i];
    const float d = max / -8.0f;
    uint16_t dh;
    std::memcpy(&dh, q.data() + b * 18, 2);
    EXPECT_EQ(dh, io::float_to_half(d));
    for (int i = 0; i < 32; i++) {
      const uint8_t byte = (uint8_t)q[b * 18 + 2 + i % 16];
      const int code = i < 16 ? (byte & 0xF) : (byte >> 4);
      const int want = std::min(15, (int)std::trunc(x[b * 32 + i] * (1.0f / d) + 8.5f));
      EXPECT_EQ(code, want) << b << " " << i;
      if (x[b * 32 + i] == max) {
        EXPECT_EQ(code, 0);
      }
    }
  }
  std::vector<float> zeros(32, 0.0f);
  const std::string z = io::encode_q4_0(zeros.data(), 32);
  EXPECT_EQ(z.substr(0, 2), std::string("\0\x80", 2));  // d = 0 / -8 = -0, as ggml writes it
  for (size_t i = 2; i < z.size(); i++) EXPECT_EQ((uint8_t)z[i], 0x88);
  EXPECT_THROW(io::encode_q4_0(x.data(), 40), Error);
}

template <class T>
T read_at(const std::string& s, size_t& at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

TEST(Gguf, FileLayout) {
  io::GgufWriter w;
  w.set("general.architecture", std::string("llama"));
  w.set("llama.block_count", (uint32_t)2);
  w.set("tokenizer.ggml.tokens", std::vector<std::string>{"a", "bc"});
  w.add_tensor("x", Tensor::from_vector(DType::Float32, {3}, std::vector<float>{1, 2, 3}),
               io::GgmlType::F32);
  w.add_tensor("y", Tensor::from_vector(DType::Float32, {2, 32}, std::vector<float>(64, 0.5f)),
               io::GgmlType::F16);
  const std::string path = (std::filesystem::temp_directory_path() / "onyx_test.gguf").string();
  w.write(path);
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  std::filesystem::remove(path);
  size_t at = 0;
  EXPECT_EQ(read_at<uint32_t>(s, at), 0x46554747u);
  EXPECT_EQ(read_at<uint32_t>(s, at), 3u);
  EXPECT_EQ(read_at<uint64_t>(s, at), 2u);  // tensors
  EXPECT_EQ(read_at<uint64_t>(s, at), 3u);  // metadata
  auto str = [&] {
    const uint64_t n = read_at<uint64_t>(s, at);
    std::string v = s.substr(at, n);
    at += n;
    return v;
  };
  EXPECT_EQ(str(), "general.architecture");
  EXPECT_EQ(read_at<uint32_t>(s, at), 8u);  // string
  EXPECT_EQ(str(), "llama");
  EXPECT_EQ(str(), "llama.block_count");
  EXPECT_EQ(read_at<uint32_t>(s, at), 4u);  // uint32
  EXPECT_EQ(read_at<uint32_t>(s, at), 2u);
  EXPECT_EQ(str(), "tokenizer.ggml.tokens");
  EXPECT_EQ(read_at<uint32_t>(s, at), 9u);  // array
  EXPECT_EQ(read_at<uint32_t>(s, at), 8u);  // of strings
  EXPECT_EQ(read_at<uint64_t>(s, at), 2u);
  EXPECT_EQ(str(), "a");
  EXPECT_EQ(str(), "bc");
  EXPECT_EQ(str(), "x");
  EXPECT_EQ(read_at<uint32_t>(s, at), 1u);  // dims
  EXPECT_EQ(read_at<uint64_t>(s, at), 3u);
  EXPECT_EQ(read_at<uint32_t>(s, at), 0u);  // F32
  EXPECT_EQ(read_at<uint64_t>(s, at), 0u);  // offset
  EXPECT_EQ(str(), "y");
  EXPECT_EQ(read_at<uint32_t>(s, at), 2u);
  EXPECT_EQ(read_at<uint64_t>(s, at), 32u);  // innermost first
  EXPECT_EQ(read_at<uint64_t>(s, at), 2u);
  EXPECT_EQ(read_at<uint32_t>(s, at), 1u);   // F16
  EXPECT_EQ(read_at<uint64_t>(s, at), 32u);  // 12 bytes of x padded to 32
  const size_t data = (at + 31) / 32 * 32;
  float x0;
  std::memcpy(&x0, s.data() + data + 4, 4);
  EXPECT_EQ(x0, 2.0f);
  uint16_t y0;
  std::memcpy(&y0, s.data() + data + 32, 2);
  EXPECT_EQ(y0, io::float_to_half(0.5f));
  EXPECT_EQ(s.size(), data + 32 + 128);
}

}  // namespace
