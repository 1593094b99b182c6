// test_conv_winograd.cc — the float32 3×3 convolutions a UNet runs (stride 1, channels in blocks
// of 16), which take oneDNN's Winograd kernels on an AVX-512 CPU (conv_onednn.cc) and its direct
// ones elsewhere: the forward, the input gradient and the weight gradient against float64 loops,
// within 1e-5 of the largest value (the Winograd transforms add some rounding: ~1e-6 here
// against ~5e-7 direct). The first geometry has enough positions
// (N·H·W >= 1,024) for the blocked forward, the second only for the gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/session.h"

namespace onyx {
namespace {

std::vector<float> randoms(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v((size_t)n);
  for (auto& x : v) x = d(g);
  return v;
}

// max |got - want| / max |want|
double rel_err(const Tensor& got, const std::vector<double>& want) {
  double big = 0, worst = 0;
  for (double w : want) big = std::max(big, std::fabs(w));
  for (size_t i = 0; i < want.size(); i++)
    worst = std::max(worst, std::fabs((double)got.data<float>()[i] - want[i]));
  return worst / std::max(big, 1e-30);
}

struct Geometry {
  int64_t N, C, H, W, M;  // 3×3, stride 1, pad 1: the output is N,M,H,W
};

// Calls f(n, m, c, y, x, ky, kx, iy, ix) for every product of the convolution.
template <class F>
void each_product(const Geometry& g, F f) {
  for (int64_t n = 0; n < g.N; n++)
    for (int64_t m = 0; m < g.M; m++)
      for (int64_t c = 0; c < g.C; c++)
        for (int64_t y = 0; y < g.H; y++)
          for (int64_t x = 0; x < g.W; x++)
            for (int64_t ky = 0; ky < 3; ky++)
              for (int64_t kx = 0; kx < 3; kx++) {
                const int64_t iy = y + ky - 1, ix = x + kx - 1;
                if (iy >= 0 && iy < g.H && ix >= 0 && ix < g.W) f(n, m, c, y, x, ky, kx, iy, ix);
              }
}

ir::Node conv_node(const std::string& op, int inputs) {
  ir::Node n;
  n.op_type = op;
  n.name = "n";
  n.domain = op == "Conv" ? "" : "onyx";
  for (int i = 0; i < inputs; i++) n.inputs.push_back("i" + std::to_string(i));
  n.outputs = {"o"};
  n.attrs["strides"] = ir::Attribute::of_ints({1, 1});
  n.attrs["pads"] = ir::Attribute::of_ints({1, 1, 1, 1});
  return n;
}

TEST(ConvWinograd, UnetGeometriesMatchFloat64) {
  for (const Geometry g : {Geometry{8, 32, 14, 14, 32}, Geometry{8, 16, 9, 7, 48}}) {
    const Shape xs{g.N, g.C, g.H, g.W}, ws{g.M, g.C, 3, 3}, ys{g.N, g.M, g.H, g.W};
    Tensor x = Tensor::from_vector(DType::Float32, xs, randoms(shape_numel(xs), 1));
    Tensor w = Tensor::from_vector(DType::Float32, ws, randoms(shape_numel(ws), 2));
    Tensor b = Tensor::from_vector(DType::Float32, {g.M}, randoms(g.M, 3));
    Tensor dy = Tensor::from_vector(DType::Float32, ys, randoms(shape_numel(ys), 4));
    const float *X = x.data<float>(), *Wt = w.data<float>(), *B = b.data<float>(),
                *dY = dy.data<float>();
    std::vector<double> y((size_t)shape_numel(ys)), dx((size_t)shape_numel(xs)),
        dw((size_t)shape_numel(ws));
    for (int64_t i = 0; i < shape_numel(ys); i++) y[i] = B[(i / (g.H * g.W)) % g.M];
    each_product(g, [&](int64_t n, int64_t m, int64_t c, int64_t oy, int64_t ox, int64_t ky,
                        int64_t kx, int64_t iy, int64_t ix) {
      const int64_t yi = ((n * g.M + m) * g.H + oy) * g.W + ox;
      const int64_t xi = ((n * g.C + c) * g.H + iy) * g.W + ix;
      const int64_t wi = ((m * g.C + c) * 3 + ky) * 3 + kx;
      y[yi] += (double)X[xi] * Wt[wi];
      dx[xi] += (double)dY[yi] * Wt[wi];
      dw[wi] += (double)dY[yi] * X[xi];
    });
    EXPECT_LE(rel_err(runtime::run_node(conv_node("Conv", 3), 17, {x, w, b})[0], y), 1e-5)
        << "Conv C=" << g.C;
    ir::Node gi = conv_node("ConvGradInput", 2);
    gi.attrs["input_shape"] = ir::Attribute::of_ints(xs);
    EXPECT_LE(rel_err(runtime::run_node(gi, 17, {dy, w})[0], dx), 1e-5)
        << "ConvGradInput C=" << g.C;
    ir::Node gw = conv_node("ConvGradWeight", 2);
    gw.attrs["kernel_shape"] = ir::Attribute::of_ints({3, 3});
    EXPECT_LE(rel_err(runtime::run_node(gw, 17, {dy, x})[0], dw), 1e-5)
        << "ConvGradWeight C=" << g.C;
  }
}

}  // namespace
}  // namespace onyx
