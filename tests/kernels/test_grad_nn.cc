// tests/kernels/test_grad_nn.cc — the fused nn gradient kernels ("onyx" domain) in every dtype
// path: the float32 AVX2 paths (checked by finite differences in tests/autodiff/gradcheck_nn.inc)
// against the double / float16 generic paths on the same values, plus a naive LayerNormGrad
// reference with many rows and threads (the per-block dscale/dbias partial sums).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "runtime/parallel.h"
#include "runtime/session.h"

using namespace onyx;
using onyx::runtime::run_node;

namespace {

ir::Attribute ai(int64_t v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Int;
  a.i = v;
  return a;
}
ir::Attribute as(const std::string& v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::String;
  a.s = v;
  return a;
}
ir::Attribute aints(std::vector<int64_t> v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Ints;
  a.ints = std::move(v);
  return a;
}

ir::Node node(const std::string& op, const std::string& domain, int nin, int nout,
              std::map<std::string, ir::Attribute> attrs = {}) {
  ir::Node n;
  n.name = op + "_test";
  n.op_type = op;
  n.domain = domain;
  for (int i = 0; i < nin; i++) n.inputs.push_back("in" + std::to_string(i));
  for (int i = 0; i < nout; i++) n.outputs.push_back("out" + std::to_string(i));
  n.attrs = std::move(attrs);
  return n;
}

Tensor rand_f32(Shape s, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(g);
  return Tensor::from_vector(DType::Float32, s, v);
}

// a and b hold the same elements, bit for bit, in the same type and shape.
void bits_equal(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  int64_t diff = 0;
  for (int64_t i = 0; i < a.numel(); i++) diff += a.get_as_double(i) != b.get_as_double(i);
  EXPECT_EQ(diff, 0) << what << ": " << diff << " of " << a.numel() << " differ";
}

Tensor cast(const Tensor& t, DType dt) {
  if (!t.defined() || t.dtype() == dt) return t;
  return run_node(node("Cast", "", 1, 1, {{"to", ai((int64_t)dt)}}), 13, {t})[0];
}

// Runs `n` on the float32 inputs and again with the float inputs listed in `convert` cast to `dt`;
// compares every output within tol.
void expect_same_in(DType dt, const ir::Node& n, const std::vector<Tensor>& in,
                    const std::vector<int>& convert, double tol,
                    const runtime::RunOptions& opts = {}) {
  auto ref = run_node(n, 1, in, opts);
  std::vector<Tensor> in2 = in;
  for (int i : convert) in2[i] = cast(in[i], dt);
  auto got = run_node(n, 1, in2, opts);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t o = 0; o < ref.size(); o++) {
    ASSERT_EQ(ref[o].shape(), got[o].shape()) << n.op_type << " output " << o;
    for (int64_t i = 0; i < ref[o].numel(); i++)
      ASSERT_NEAR(ref[o].get_as_double(i), got[o].get_as_double(i),
                  tol * (1 + std::fabs(ref[o].get_as_double(i))))
          << n.op_type << " " << dtype_name(dt) << " output " << o << " [" << i << "]";
  }
}

Tensor forward1(const std::string& op, std::map<std::string, ir::Attribute> attrs,
                const std::vector<Tensor>& in, int64_t opset = 13) {
  return run_node(node(op, "", (int)in.size(), 1, std::move(attrs)), opset, in)[0];
}

}  // namespace

TEST(NnGradKernels, SoftmaxGradDtypes) {
  for (int64_t axis : {0, 1, 2}) {
    Tensor x = rand_f32({3, 4, 21}, 1, -3, 3), dy = rand_f32({3, 4, 21}, 2);
    Tensor y = forward1("Softmax", {{"axis", ai(axis)}}, {x});
    Tensor ly = forward1("LogSoftmax", {{"axis", ai(axis)}}, {x});
    auto sg = node("SoftmaxGrad", "onyx", 2, 1, {{"axis", ai(axis)}});
    auto lg = node("LogSoftmaxGrad", "onyx", 2, 1, {{"axis", ai(axis)}});
    expect_same_in(DType::Float64, sg, {dy, y}, {0, 1}, 1e-5);
    expect_same_in(DType::Float64, lg, {dy, ly}, {0, 1}, 1e-5);
    expect_same_in(DType::Float16, sg, {dy, y}, {0, 1}, 1e-2);
  }
  // opset < 13 semantics: reduce over axes [1, rank)
  Tensor x = rand_f32({3, 4, 5}, 3), dy = rand_f32({3, 4, 5}, 4);
  Tensor y = forward1("Softmax", {}, {x}, 11);
  auto sg = node("SoftmaxGrad", "onyx", 2, 1, {{"axis", ai(1)}, {"flatten", ai(1)}});
  expect_same_in(DType::Float64, sg, {dy, y}, {0, 1}, 1e-5);
}

TEST(NnGradKernels, LayerNormGradMatchesNaiveAndDtypes) {
  const int64_t rows = 700, cols = 37;
  Tensor x = rand_f32({7, 100, cols}, 5, -2, 2), dy = rand_f32({7, 100, cols}, 6);
  Tensor scale = rand_f32({cols}, 7), bias = rand_f32({cols}, 8);
  auto fwd = node("LayerNormalization", "", 3, 3, {{"axis", ai(-1)}});
  auto f = run_node(fwd, 17, {x, scale, bias});
  auto g = node("LayerNormGrad", "onyx", 5, 3, {{"axis", ai(2)}});
  for (int threads : {1, 3, 8}) {
    int saved = runtime::num_threads();
    runtime::set_num_threads(threads);
    auto out = run_node(g, 1, {dy, x, scale, f[1], f[2]});
    runtime::set_num_threads(saved);
    // naive double reference
    std::vector<double> ds(cols, 0), db(cols, 0);
    const float *xp = x.data<float>(), *dyp = dy.data<float>(), *sp = scale.data<float>();
    for (int64_t r = 0; r < rows; r++) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < cols; c++) m += xp[r * cols + c];
      m /= cols;
      for (int64_t c = 0; c < cols; c++) v += (xp[r * cols + c] - m) * (xp[r * cols + c] - m);
      double inv = 1 / std::sqrt(v / cols + 1e-5);
      double sg = 0, sgx = 0;
      for (int64_t c = 0; c < cols; c++) {
        double xh = (xp[r * cols + c] - m) * inv, gg = dyp[r * cols + c] * sp[c];
        sg += gg;
        sgx += gg * xh;
        ds[c] += dyp[r * cols + c] * xh;
        db[c] += dyp[r * cols + c];
      }
      for (int64_t c = 0; c < cols; c++) {
        double xh = (xp[r * cols + c] - m) * inv, gg = dyp[r * cols + c] * sp[c];
        double dx = (gg - sg / cols - xh * sgx / cols) * inv;
        ASSERT_NEAR(out[0].data<float>()[r * cols + c], dx, 1e-4 * (1 + std::fabs(dx)));
      }
    }
    for (int64_t c = 0; c < cols; c++) {
      EXPECT_NEAR(out[1].data<float>()[c], ds[c], 1e-3 * (1 + std::fabs(ds[c]))) << threads;
      EXPECT_NEAR(out[2].data<float>()[c], db[c], 1e-3 * (1 + std::fabs(db[c]))) << threads;
    }
  }
  // double x with float32 statistics: the generic path
  expect_same_in(DType::Float64, g, {dy, x, scale, f[1], f[2]}, {0, 1}, 1e-4);
  expect_same_in(DType::Float64, g, {dy, x, scale, f[1], f[2]}, {0, 1, 3, 4}, 1e-4);
}

// Mixed precision's normalized form (passes/mixed_precision.cc, save_normalized_inputs): the norm
// writes xhat = (x - mean) * inv (LayerNorm) / x * inv (RMSNorm) as a bf16 output, and the
// gradient reads it instead of x (normalized = 1). With a float32 xhat the gradient is bit-
// identical to the one reading x (the same xhat arithmetic); with the forward's bf16 xhat it
// differs by xhat's one rounding. The forward's other outputs are unchanged by the extra output.
TEST(NnGradKernels, NormGradsFromTheSavedNormalizedInput) {
  auto rel_frobenius = [](const Tensor& ref, const Tensor& got) {
    double dd = 0, rr = 0;
    for (int64_t i = 0; i < ref.numel(); i++) {
      double a = ref.get_as_double(i), b = got.get_as_double(i);
      dd += (a - b) * (a - b), rr += a * a;
    }
    return std::sqrt(dd / rr);
  };
  for (int64_t cols : {37, 256}) {
    const int64_t rows = 300;
    Tensor x = rand_f32({3, 100, cols}, 21, -2, 3), dy = rand_f32({3, 100, cols}, 22);
    Tensor scale = rand_f32({cols}, 23, 0.5f, 1.5f), bias = rand_f32({cols}, 24);
    // LayerNorm
    auto plain =
        run_node(node("LayerNormalization", "onyx", 3, 3, {{"axis", ai(-1)}}), 1, {x, scale, bias});
    auto with =
        run_node(node("LayerNormalization", "onyx", 3, 4, {{"axis", ai(-1)}}), 1, {x, scale, bias});
    ASSERT_EQ(with.size(), 4u);
    for (int o = 0; o < 3; o++) bits_equal(plain[o], with[o], "LayerNormalization outputs 0-2");
    Tensor xhat = rand_f32({3, 100, cols}, 0);  // float32 (x - mean) * inv, as the row computes it
    const float *xp = x.data<float>(), *mp = plain[1].data<float>(), *ip = plain[2].data<float>();
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        xhat.data<float>()[r * cols + c] = (xp[r * cols + c] - mp[r]) * ip[r];
    ASSERT_EQ(with[3].dtype(), DType::BFloat16);
    bits_equal(with[3], cast(xhat, DType::BFloat16), "LayerNormalization's bf16 xhat");
    auto g = node("LayerNormGrad", "onyx", 5, 3, {{"axis", ai(2)}});
    auto gn = g;
    gn.attrs["normalized"] = ai(1);
    gn.inputs[3] = "";  // no mean
    for (int threads : {1, 3}) {
      int saved = runtime::num_threads();
      runtime::set_num_threads(threads);
      auto ref = run_node(g, 1, {dy, x, scale, plain[1], plain[2]});
      auto from32 = run_node(gn, 1, {dy, xhat, scale, Tensor(), plain[2]});
      auto from16 = run_node(gn, 1, {dy, with[3], scale, Tensor(), plain[2]});
      runtime::set_num_threads(saved);
      for (int o = 0; o < 3; o++) {
        bits_equal(ref[o], from32[o], "LayerNormGrad from float32 xhat");
        EXPECT_EQ(from16[o].dtype(), DType::Float32);
        const double e = rel_frobenius(ref[o], from16[o]);
        EXPECT_LT(e, 1e-2) << "LayerNormGrad output " << o << " from bf16 xhat";
        if (o != 2) {
          EXPECT_GT(e, 0) << "output " << o << " must see xhat's bf16 rounding";
        }
      }
    }
    // RMSNorm
    auto rplain = run_node(node("RMSNorm", "onyx", 2, 2), 1, {x, scale});
    auto rwith = run_node(node("RMSNorm", "onyx", 2, 3), 1, {x, scale});
    for (int o = 0; o < 2; o++) bits_equal(rplain[o], rwith[o], "RMSNorm outputs 0-1");
    Tensor rxhat = xhat.clone();
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        rxhat.data<float>()[r * cols + c] = xp[r * cols + c] * rplain[1].data<float>()[r];
    bits_equal(rwith[2], cast(rxhat, DType::BFloat16), "RMSNorm's bf16 xhat");
    auto rg = node("RMSNormGrad", "onyx", 4, 2);
    auto rgn = rg;
    rgn.attrs["normalized"] = ai(1);
    auto rref = run_node(rg, 1, {dy, x, scale, rplain[1]});
    auto r32 = run_node(rgn, 1, {dy, rxhat, scale, rplain[1]});
    auto r16 = run_node(rgn, 1, {dy, rwith[2], scale, rplain[1]});
    for (int o = 0; o < 2; o++) {
      bits_equal(rref[o], r32[o], "RMSNormGrad from float32 xhat");
      const double e = rel_frobenius(rref[o], r16[o]);
      EXPECT_LT(e, 1e-2) << "RMSNormGrad output " << o << " from bf16 xhat";
      EXPECT_GT(e, 0) << "RMSNormGrad output " << o << " must see xhat's bf16 rounding";
    }
  }
  // Clear errors: the output on the standard-domain op, float64 inputs, a float64 gradient.
  Tensor x = rand_f32({4, 8}, 25), s = rand_f32({8}, 26);
  try {
    run_node(node("LayerNormalization", "", 2, 4), 17, {x, s});
    ADD_FAILURE() << "a standard LayerNormalization with 4 outputs ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("onyx-domain only"), std::string::npos) << e.what();
  }
  try {
    run_node(node("RMSNorm", "onyx", 2, 3), 1, {cast(x, DType::Float64), cast(s, DType::Float64)});
    ADD_FAILURE() << "a float64 RMSNorm wrote a bf16 xhat";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs float32 x"), std::string::npos) << e.what();
  }
  auto f = run_node(node("LayerNormalization", "onyx", 2, 4), 1, {x, s});
  auto gn = node("LayerNormGrad", "onyx", 5, 3, {{"axis", ai(1)}, {"normalized", ai(1)}});
  gn.inputs[3] = "";
  try {
    run_node(gn, 1, {cast(x, DType::Float64), f[3], s, Tensor(), f[2]});
    ADD_FAILURE() << "a float64 dy ran through the normalized LayerNormGrad";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("normalized = 1 takes float32 dy"), std::string::npos)
        << e.what();
  }
}

// onyx.LayerNormalization's output 4 (passes/mixed_precision.cc: a post-LN output read by the
// residual stream in float32 and by GEMMs in bf16): Y rounded to bf16 as each row is written,
// bit-identical to Cast(Y, BFLOAT16), with or without the xhat output beside it, on 1 and 3
// threads; the other outputs are unchanged. Clear errors where it cannot apply.
TEST(NnGradKernels, LayerNormWritesABf16CopyOfItsOutput) {
  for (int64_t cols : {37, 256}) {
    Tensor x = rand_f32({3, 50, cols}, 31, -2, 3);
    Tensor scale = rand_f32({cols}, 32, 0.5f, 1.5f), bias = rand_f32({cols}, 33);
    auto plain =
        run_node(node("LayerNormalization", "onyx", 3, 4, {{"axis", ai(-1)}}), 1, {x, scale, bias});
    for (bool xhat : {false, true}) {
      auto n = node("LayerNormalization", "onyx", 3, 5, {{"axis", ai(-1)}});
      if (!xhat) n.outputs[3] = "";
      for (int threads : {1, 3}) {
        int saved = runtime::num_threads();
        runtime::set_num_threads(threads);
        auto with = run_node(n, 1, {x, scale, bias});
        runtime::set_num_threads(saved);
        ASSERT_EQ(with.size(), 5u);
        for (int o = 0; o < 3; o++) bits_equal(plain[o], with[o], "LayerNormalization outputs 0-2");
        if (xhat) bits_equal(plain[3], with[3], "LayerNormalization's bf16 xhat");
        bits_equal(with[4], cast(plain[0], DType::BFloat16), "the bf16 copy of Y");
      }
    }
  }
  Tensor x = rand_f32({4, 8}, 34), s = rand_f32({8}, 35);
  auto expect_error = [&](const ir::Node& n, const std::vector<Tensor>& in, const char* want) {
    try {
      run_node(n, n.domain.empty() ? 17 : 1, in);
      ADD_FAILURE() << n.describe() << " ran; wanted an error with '" << want << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  auto n = node("LayerNormalization", "onyx", 2, 5);
  auto std_domain = n;
  std_domain.domain = "";
  expect_error(std_domain, {x, s}, "onyx-domain only");
  auto bf16_y = n;  // Y itself written bf16: no float32 Y to copy
  bf16_y.attrs["output_dtype"] = ai((int64_t)DType::BFloat16);
  expect_error(bf16_y, {x, s}, "needs float32 x, Y and statistics");
  auto f64_stats = n;
  f64_stats.attrs["stash_type"] = ai(11);
  f64_stats.outputs[3] = "";
  expect_error(f64_stats, {x, s}, "needs float32 x, Y and statistics");
  auto six = node("LayerNormalization", "onyx", 2, 6);
  expect_error(six, {x, s}, "at most 5");
}

// Mixed precision's bf16 operands of the Llama ops (passes/mixed_precision.cc): SwiGLU reading bf16
// (or mixed) gate / up, SwiGLUGrad reading them with a float32 dy, Rotary rotating a bf16 x with
// float32 tables — each bit-identical to the float32 kernel on the widened values (then rounded
// to bf16 where the output is bf16): the bf16 paths only widen and round, the arithmetic is the
// float32 path's.
TEST(NnGradKernels, LlamaOpsTakeBf16Operands) {
  const DType bf = DType::BFloat16, f32 = DType::Float32;
  Tensor g16 = cast(rand_f32({4, 2101}, 31, -6, 6), bf), u16 = cast(rand_f32({4, 2101}, 32), bf);
  Tensor g = cast(g16, f32), u = cast(u16, f32), dy = rand_f32({4, 2101}, 33);
  auto sw = node("SwiGLU", "onyx", 2, 1, {{"output_dtype", ai((int64_t)bf)}});
  for (int threads : {1, 3}) {
    int saved = runtime::num_threads();
    runtime::set_num_threads(threads);
    Tensor ref = run_node(sw, 1, {g, u})[0];  // float32 operands, bf16 output
    bits_equal(ref, run_node(sw, 1, {g16, u16})[0], "SwiGLU bf16 gate and up");
    bits_equal(ref, run_node(sw, 1, {g16, u})[0], "SwiGLU bf16 gate, float32 up");
    auto gg = node("SwiGLUGrad", "onyx", 3, 2);
    auto r = run_node(gg, 1, {dy, g, u}), h = run_node(gg, 1, {dy, g16, u16});
    bits_equal(r[0], h[0], "SwiGLUGrad dgate from bf16 operands");
    bits_equal(r[1], h[1], "SwiGLUGrad dup from bf16 operands");
    // RoPE over (B, heads, T, hd) with (B, 1, T, hd) float32 tables; hd 36 reaches the tails
    Tensor x16 = cast(rand_f32({2, 3, 50, 36}, 34), bf);
    Tensor c = rand_f32({2, 1, 50, 36}, 35), s = rand_f32({2, 1, 50, 36}, 36);
    Tensor rot = run_node(node("Rotary", "onyx", 3, 1), 1, {x16, c, s})[0];
    bits_equal(cast(run_node(node("Rotary", "onyx", 3, 1), 1, {cast(x16, f32), c, s})[0], bf), rot,
               "Rotary of a bf16 x with float32 tables");
    runtime::set_num_threads(saved);
  }
  try {  // gate and up of different dtypes without the bf16 output
    run_node(node("SwiGLU", "onyx", 2, 1), 1, {g16, u});
    ADD_FAILURE() << "SwiGLU ran on mixed operands without output_dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need output_dtype = BFLOAT16"), std::string::npos)
        << e.what();
  }
}

TEST(NnGradKernels, DropoutGradDtypes) {
  Tensor dy = rand_f32({5, 13}, 9);
  std::vector<uint8_t> m(65);
  for (size_t i = 0; i < m.size(); i++) m[i] = (i * 7) % 3 != 0;
  Tensor mask = Tensor::from_vector<uint8_t>(DType::Bool, {5, 13}, m);
  auto g = node("DropoutGrad", "onyx", 3, 1);
  Tensor ratio = Tensor::scalar_f32(0.2f);
  runtime::RunOptions train;
  train.training = true;  // a training run: dropout active where the node asks for it
  auto out = run_node(g, 1, {dy, mask, ratio}, train);
  for (int64_t i = 0; i < 65; i++)
    EXPECT_FLOAT_EQ(out[0].data<float>()[i], m[i] ? dy.data<float>()[i] * (float)(1 / 0.8) : 0.f);
  expect_same_in(DType::Float64, g, {dy, mask, ratio}, {0}, 1e-6, train);
  // identity: training_mode false at run time, or not a training run
  auto g4 = node("DropoutGrad", "onyx", 4, 1);
  auto id =
      run_node(g4, 1, {dy, mask, ratio, Tensor::from_vector<uint8_t>(DType::Bool, {}, {0})}, train);
  auto eval = run_node(g, 1, {dy, mask, ratio});
  for (int64_t i = 0; i < 65; i++) {
    EXPECT_EQ(id[0].data<float>()[i], dy.data<float>()[i]);
    EXPECT_EQ(eval[0].data<float>()[i], dy.data<float>()[i]);
  }
}

TEST(NnGradKernels, LossGradsDtypes) {
  Tensor x = rand_f32({6, 19}, 10, -3, 3);
  Tensor labels = Tensor::from_vector<int64_t>(DType::Int64, {6}, {0, 18, -100, 4, 4, 9});
  Tensor w = rand_f32({19}, 11, 0.2f, 2);
  Tensor lp = forward1("LogSoftmax", {{"axis", ai(1)}}, {x});
  for (std::string red : {"none", "sum", "mean"}) {
    Tensor dl = red == "none" ? rand_f32({6}, 12) : Tensor::scalar_f32(0.7f);
    std::map<std::string, ir::Attribute> a{{"reduction", as(red)}, {"ignore_index", ai(-100)}};
    auto sce = node("SoftmaxCrossEntropyLossGrad", "onyx", 4, 1, a);
    expect_same_in(DType::Float64, sce, {dl, x, labels, w}, {0, 1, 3}, 1e-5);
    // from log_prob gives the same gradient as from logits
    auto sce_lp = sce;
    sce_lp.attrs["log_prob"] = ai(1);
    auto g1 = run_node(sce, 1, {dl, x, labels, w})[0];
    auto g2 = run_node(sce_lp, 1, {dl, lp, labels, w})[0];
    for (int64_t i = 0; i < g1.numel(); i++)
      EXPECT_NEAR(g1.data<float>()[i], g2.data<float>()[i], 1e-5);
    auto nll_a = a;
    nll_a["input_shape"] = aints({6, 19});
    auto nll = node("NLLLossGrad", "onyx", 3, 1, nll_a);
    expect_same_in(DType::Float64, nll, {dl, labels, w}, {0, 2}, 1e-6);
    expect_same_in(DType::Float16, nll, {dl, labels, w}, {0, 2}, 1e-2);
  }
  // all targets ignored with mean: zero gradient, not NaN
  Tensor ign =
      Tensor::from_vector<int64_t>(DType::Int64, {6}, {-100, -100, -100, -100, -100, -100});
  auto sce = node("SoftmaxCrossEntropyLossGrad", "onyx", 3, 1, {{"ignore_index", ai(-100)}});
  auto z = run_node(sce, 1, {Tensor::scalar_f32(1.0f), x, ign})[0];
  for (int64_t i = 0; i < z.numel(); i++) EXPECT_EQ(z.data<float>()[i], 0.0f);
}

TEST(NnGradKernels, BatchNormGradDtypes) {
  Tensor x = rand_f32({3, 4, 5}, 13), dy = rand_f32({3, 4, 5}, 14);
  Tensor scale = rand_f32({4}, 15), mean = rand_f32({4}, 16), var = rand_f32({4}, 17, 0.5f, 1.5f);
  for (int training : {0, 1}) {
    auto g = node("BatchNormGrad", "onyx", 5, 3, {{"training_mode", ai(training)}});
    expect_same_in(DType::Float64, g, {dy, x, scale, mean, var}, {0, 1, 2, 3, 4}, 1e-5);
  }
}
