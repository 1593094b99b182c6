// tests/quant/test_bnb4.cc — bitsandbytes' 4-bit format (quant/bnb4.h) and the kernels that read
// it (kernels/quant/matmul_4bit.cc): each index is the nearest code value (a value on a midpoint
// takes the lower code), absmax per block, the last partial block and an odd element count,
// double quantization's state; onyx.Dequantize4Bit equal to the format's own dequantization;
// onyx.MatMul4Bit (both orientations, bias, leading dimensions, weights whose rows cross blocks,
// float32 and bf16 compute, 1 and 2 threads) against a double-precision product with the
// dequantized weight; malformed inputs named. tests/quant/test_bnb_reference.py checks the codes
// against bitsandbytes itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "autodiff/gradient.h"
#include "config/run_config.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/dispatch.h"
#include "kernels/cpu/simd/simd.h"
#include "quant/bnb4.h"
#include "quant/store_4bit.h"
#include "runtime/parallel.h"
#include "runtime/session.h"

using namespace onyx;

namespace {

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 0.05f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<float> dequantized(const quant::Quant4& q) {
  std::vector<float> out(q.numel());
  quant::view_of(q).dequantize(0, q.numel(), out.data());
  return out;
}

int nibble(const quant::Quant4& q, int64_t i) {
  return (i & 1) ? (q.packed[i / 2] & 0xF) : (q.packed[i / 2] >> 4);
}

TEST(Bnb4, NearestCodeLowerOnTies) {
  for (quant::Code4 type : {quant::Code4::Nf4, quant::Code4::Fp4}) {
    const auto& code = quant::code4_table(type);
    std::vector<float> w = randn(4096 + 37, 3);  // a partial last block, odd count
    quant::Quant4 q = quant::quantize_4bit(w.data(), {(int64_t)w.size()}, type, 64, false, "w");
    ASSERT_EQ(q.packed.size(), (w.size() + 1) / 2);
    ASSERT_EQ((int64_t)q.absmax.size(), q.blocks());
    for (int64_t i = 0; i < (int64_t)w.size(); i++) {
      const int64_t b = i / 64;
      const float s = w[i] / q.absmax[b];
      const float got = code[nibble(q, i)];
      for (float c : code) ASSERT_LE(std::fabs(s - got), std::fabs(s - c) + 1e-6f) << i;
    }
    // absmax per block
    for (int64_t b = 0; b < q.blocks(); b++) {
      float m = 0;
      for (int64_t i = b * 64; i < std::min<int64_t>(w.size(), (b + 1) * 64); i++)
        m = std::max(m, std::fabs(w[i]));
      EXPECT_EQ(m, q.absmax[b]);
    }
  }
  // a value exactly on a midpoint takes the lower code
  const auto& nf4 = quant::code4_table(quant::Code4::Nf4);
  const float mid = (nf4[9] + nf4[10]) / 2.0f;
  std::vector<float> w = {1.0f, mid};
  quant::Quant4 q = quant::quantize_4bit(w.data(), {2}, quant::Code4::Nf4, 64, false, "w");
  EXPECT_EQ(nibble(q, 0), 15);
  EXPECT_EQ(nibble(q, 1), 9);
}

TEST(Bnb4, DoubleQuantization) {
  std::vector<float> w = randn(64 * 600, 5);
  quant::Quant4 q = quant::quantize_4bit(w.data(), {600, 64}, quant::Code4::Nf4, 64, true, "w");
  ASSERT_TRUE(q.nested);
  EXPECT_EQ((int64_t)q.absmax_codes.size(), 600);
  EXPECT_EQ(q.nested_absmax.size(), 3u);  // ceil(600 / 256)
  quant::Quant4 plain =
      quant::quantize_4bit(w.data(), {600, 64}, quant::Code4::Nf4, 64, false, "w");
  EXPECT_EQ(q.packed, plain.packed);  // the 4-bit codes do not depend on the absmax's storage
  const auto v = quant::view_of(q);
  for (int64_t b = 0; b < 600; b++)  // each absmax within one 8-bit step of its own value
    EXPECT_NEAR(v.scale(b), plain.absmax[b], 0.02f * q.nested_absmax[b / 256]) << b;
  // the dynamic map: 256 sorted values from -1 to 1 with 0 among them
  const auto& m = quant::dynamic_map();
  EXPECT_TRUE(std::is_sorted(m.begin(), m.end()));
  EXPECT_EQ(m.back(), 1.0f);
  EXPECT_NE(std::find(m.begin(), m.end(), 0.0f), m.end());
}

TEST(Bnb4, RejectsNonFiniteAndBadBlocksize) {
  std::vector<float> w = {1, NAN, 2, 3};
  EXPECT_THROW(quant::quantize_4bit(w.data(), {4}, quant::Code4::Nf4, 64, false, "w"), Error);
  w[1] = 0;
  EXPECT_THROW(quant::quantize_4bit(w.data(), {4}, quant::Code4::Nf4, 48, false, "w"), Error);
  EXPECT_THROW(quant::parse_code4("int4", "cfg"), Error);
}

// A graph holding W (N, K) 4-bit, read by onyx.MatMul4Bit or onyx.Dequantize4Bit.
struct Case {
  int64_t N, K;
  bool nested;
  quant::Code4 type;
};

ir::Graph weight_graph(const Case& c, quant::Quant4& q, std::vector<float>& w) {
  w = randn(c.N * c.K, 11);
  q = quant::quantize_4bit(w.data(), {c.N, c.K}, c.type, 64, c.nested, "W");
  ir::Graph g;
  g.opsets[""] = 17;
  g.opsets["onyx"] = 1;
  g.add_initializer("W", Tensor::from_vector(DType::Float32, {c.N, c.K}, w));
  quant::store_initializer_4bit(g, "W", q);
  return g;
}

std::vector<Tensor> inputs_of(const ir::Graph& g, const ir::Node& d) {
  std::vector<Tensor> in;
  for (auto& name : d.inputs) in.push_back(name.empty() ? Tensor() : g.initializers.at(name));
  return in;
}

TEST(Bnb4Kernels, DequantizeMatchesFormat) {
  for (Case c : {Case{96, 64, true, quant::Code4::Nf4}, Case{33, 70, false, quant::Code4::Fp4}}) {
    quant::Quant4 q;
    std::vector<float> w;
    ir::Graph g = weight_graph(c, q, w);
    const ir::Node& d = g.nodes[0];
    auto out = runtime::run_node(d, 1, inputs_of(g, d));
    ASSERT_EQ(out[0].shape(), (Shape{c.N, c.K}));
    const auto want = dequantized(q);
    EXPECT_EQ(0, std::memcmp(out[0].data<float>(), want.data(), want.size() * 4));
    // transpose = 1 (a Conv1D weight stored as nn.Linear's layout): the (K, N) transpose
    ir::Node t = d;
    t.attrs["transpose"] = ir::Attribute::of_int(1);
    auto tout = runtime::run_node(t, 1, inputs_of(g, t));
    ASSERT_EQ(tout[0].shape(), (Shape{c.K, c.N}));
    const float* tp = tout[0].data<float>();
    for (int64_t n = 0; n < c.N; n++)
      for (int64_t k = 0; k < c.K; k++) ASSERT_EQ(tp[k * c.N + n], want[n * c.K + k]);
  }
}

// simd::dequant4_f32 / dequant4_bf16 on every path this CPU runs, bit for bit against
// code[index] * scale (bf16: that value through kernels::f32_to_bf16): ranges starting and ending
// on odd elements and inside blocks, block sizes 64, 128 and 96 (not a multiple of a vector step),
// scales that make zeros, denormal products (flushed in bf16), ties and large values.
TEST(Bnb4Kernels, DequantizationPathsMatchTheFormat) {
  const std::string start = simd::chosen_path();
  std::mt19937 gen(5);
  std::vector<uint8_t> packed(2000);
  for (auto& b : packed) b = (uint8_t)gen();
  const auto& code = quant::code4_table(quant::Code4::Nf4);
  std::vector<float> scales(64);
  std::uniform_real_distribution<float> u(0.001f, 3.0f);
  for (auto& s : scales) s = u(gen);
  scales[1] = 0.0f, scales[2] = 1e-39f, scales[3] = 3e38f, scales[4] = 1.0f + 1.0f / 256;
  for (const std::string& path : simd::supported_paths()) {
    simd::select_path(path);
    for (int64_t bs : {64, 128, 96})
      for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 4000},
                                  {1, 3998},
                                  {37, 1001},
                                  {130, 2},
                                  {63, 1},
                                  {64, 65}}) {
        SCOPED_TRACE(path + " blocksize " + std::to_string(bs) + " begin " + std::to_string(begin) +
                     " count " + std::to_string(count));
        const float* sc = scales.data();
        std::vector<float> want(count), got(count);
        for (int64_t i = 0; i < count; i++) {
          const int64_t e = begin + i;
          const uint8_t byte = packed[e / 2];
          want[i] = code[(e & 1) ? (byte & 0xF) : (byte >> 4)] * sc[e / bs - begin / bs];
        }
        std::vector<uint16_t> want16(count), got16(count);
        kernels::f32_to_bf16(want.data(), want16.data(), count);
        simd::dequant4_f32(packed.data(), code.data(), sc, bs, begin, count, got.data());
        simd::dequant4_bf16(packed.data(), code.data(), sc, bs, begin, count, got16.data());
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), count * 4));
        ASSERT_EQ(want16, got16);
      }
  }
  simd::select_path(start);
}

void check_matmul(const Case& c, bool transB, bool bias, const std::string& compute, int threads) {
  quant::Quant4 q;
  std::vector<float> w;
  ir::Graph g = weight_graph(c, q, w);
  const ir::Node& d = g.nodes[0];
  const auto W = dequantized(q);
  const int64_t in = transB ? c.K : c.N, out = transB ? c.N : c.K;
  const Shape xs{2, 5, in};
  std::vector<float> x = randn(10 * in, 17, 1.0f), b = randn(out, 19, 1.0f);
  ir::Node n;
  n.name = "mm";
  n.op_type = "MatMul4Bit";
  n.domain = "onyx";
  n.inputs = {"X", d.inputs[0], d.inputs[1], c.nested ? d.inputs[2] : "",
              c.nested ? d.inputs[3] : ""};
  if (bias) n.inputs.push_back("b");
  n.outputs = {"Y"};
  n.attrs = d.attrs;
  n.attrs["transB"] = ir::Attribute::of_int(transB);
  n.attrs["compute_dtype"] = ir::Attribute::of_string(compute);
  std::vector<Tensor> args = {Tensor::from_vector(DType::Float32, xs, x)};
  for (size_t i = 1; i < 5; i++)
    args.push_back(n.inputs[i].empty() ? Tensor() : g.initializers.at(n.inputs[i]));
  if (bias) args.push_back(Tensor::from_vector(DType::Float32, {out}, b));
  runtime::set_num_threads(threads);
  auto y = runtime::run_node(n, 1, args)[0];
  runtime::set_num_threads(2);
  ASSERT_EQ(y.shape(), (Shape{2, 5, out}));
  const float* Y = y.data<float>();
  const double tol = compute == "bfloat16" ? 2e-2 : 1e-5;
  for (int64_t r = 0; r < 10; r++)
    for (int64_t j = 0; j < out; j++) {
      double s = bias ? b[j] : 0, mag = 0;
      for (int64_t k = 0; k < in; k++) {
        const double wv = transB ? W[j * c.K + k] : W[k * c.K + j];
        s += (double)x[r * in + k] * wv;
        mag += std::fabs((double)x[r * in + k] * wv);
      }
      ASSERT_NEAR(Y[r * out + j], s, tol * (mag + 1e-3))
          << "N " << c.N << " K " << c.K << " transB " << transB << " " << compute << " row " << r
          << " col " << j;
    }
}

TEST(Bnb4Kernels, MatMul4BitMatchesDequantizedProduct) {
  for (Case c : {Case{96, 64, true, quant::Code4::Nf4}, Case{33, 70, false, quant::Code4::Fp4},
                 Case{300, 1100, true, quant::Code4::Nf4}})
    for (bool transB : {true, false})
      for (int threads : {1, 2}) {
        check_matmul(c, transB, transB, "float32", threads);
        check_matmul(c, transB, false, "bfloat16", threads);
      }
}

TEST(Bnb4Kernels, RejectsMismatchedWeight) {
  Case c{96, 64, false, quant::Code4::Nf4};
  quant::Quant4 q;
  std::vector<float> w;
  ir::Graph g = weight_graph(c, q, w);
  ir::Node d = g.nodes[0];
  d.attrs["shape"] = ir::Attribute::of_ints({96, 128});  // twice the bytes the codes hold
  try {
    runtime::run_node(d, 1, inputs_of(g, d));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes"), std::string::npos) << e.what();
  }
}

}  // namespace

// PEFT's prepare_model_for_kbit_training: a run config with a 4-bit quantization_config turns
// gradient checkpointing on unless the config (or the command line) sets it.
TEST(Bnb4Config, QuantizationTurnsCheckpointingOnUnlessSet) {
  const std::string dir = testing::TempDir() + "onyx-bnb4-config";
  std::filesystem::create_directories(dir);
  auto load = [&](const std::string& extra,
                  const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
    const std::string path = dir + "/run.yaml";
    std::ofstream(path) << "model: {config: {model_type: llama}}\n" << extra;
    return config::load_run_config(path, overrides).args.gradient_checkpointing;
  };
  const std::string q = "model_init_kwargs: {quantization_config: {load_in_4bit: true}}\n";
  EXPECT_TRUE(load(q));
  EXPECT_FALSE(load(q + "gradient_checkpointing: false\n"));
  EXPECT_FALSE(load(q, {{"gradient_checkpointing", "false"}}));
  EXPECT_FALSE(load(""));
  EXPECT_TRUE(load("gradient_checkpointing: true\n"));
  std::filesystem::remove_all(dir);
}
