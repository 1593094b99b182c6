// test_matmul.cc — MatMul, Gemm and Conv kernels and the sgemm wrapper against naive loops.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu/gemm.h"
#include "runtime/session.h"

namespace onyx {
namespace {

using runtime::run_node;

ir::Node make_node(const std::string& op, int n_inputs) {
  ir::Node n;
  n.name = "n";
  n.op_type = op;
  for (int i = 0; i < n_inputs; i++) n.inputs.push_back("in" + std::to_string(i));
  n.outputs = {"y"};
  return n;
}

void set_int(ir::Node& n, const std::string& k, int64_t v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Int;
  a.i = v;
  n.attrs[k] = a;
}
void set_float(ir::Node& n, const std::string& k, float v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Float;
  a.f = v;
  n.attrs[k] = a;
}
void set_ints(ir::Node& n, const std::string& k, std::vector<int64_t> v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Ints;
  a.ints = std::move(v);
  n.attrs[k] = a;
}
void set_string(ir::Node& n, const std::string& k, const std::string& v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::String;
  a.s = v;
  n.attrs[k] = a;
}

Tensor random_tensor(Shape s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = u(rng);
  return Tensor::from_vector(DType::Float32, std::move(s), v);
}

void expect_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-4) {
  ASSERT_EQ((size_t)got.numel(), want.size());
  auto g = got.to_double_vector();
  for (size_t i = 0; i < want.size(); i++)
    ASSERT_NEAR(g[i], want[i], tol * (1 + std::abs(want[i]))) << "at flat index " << i;
}

// numpy.matmul by definition, on double.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, Shape& out) {
  Shape as = a.shape(), bs = b.shape();
  bool av = as.size() == 1, bv = bs.size() == 1;
  if (av) as.insert(as.begin(), 1);
  if (bv) bs.push_back(1);
  int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  size_t r = std::max(ab.size(), bb.size());
  ab.insert(ab.begin(), r - ab.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  Shape batch(r);
  for (size_t i = 0; i < r; i++) batch[i] = std::max(ab[i], bb[i]);
  out = batch;
  if (!av) out.push_back(M);
  if (!bv) out.push_back(N);
  auto A = a.to_double_vector(), B = b.to_double_vector();
  int64_t nb = shape_numel(batch);
  std::vector<double> C(nb * M * N, 0.0);
  for (int64_t i = 0; i < nb; i++) {
    int64_t rem = i, ia = 0, ib = 0, sa = 1, sb = 1;
    for (int d = (int)r - 1; d >= 0; d--) {
      int64_t idx = rem % batch[d];
      rem /= batch[d];
      ia += (ab[d] == 1 ? 0 : idx) * sa;
      ib += (bb[d] == 1 ? 0 : idx) * sb;
      sa *= ab[d];
      sb *= bb[d];
    }
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double acc = 0;
        for (int64_t k = 0; k < K; k++)
          acc += A[ia * M * K + m * K + k] * B[ib * K * N + k * N + n];
        C[i * M * N + m * N + n] = acc;
      }
  }
  return C;
}

class MatMulTest : public ::testing::TestWithParam<std::pair<Shape, Shape>> {};

TEST_P(MatMulTest, MatchesNaive) {
  auto [sa, sb] = GetParam();
  for (auto be : kernels::available_gemm_backends()) {
    kernels::set_gemm_backend(be);
    Tensor a = random_tensor(sa, 1), b = random_tensor(sb, 2);
    auto out = run_node(make_node("MatMul", 2), 13, {a, b});
    Shape want_shape;
    auto want = naive_matmul(a, b, want_shape);
    EXPECT_EQ(out[0].shape(), want_shape) << kernels::gemm_backend_name(be);
    expect_close(out[0], want);
  }
  kernels::set_gemm_backend(kernels::GemmBackend::OneDNN);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatMulTest,
    ::testing::Values(std::pair<Shape, Shape>{{3, 4}, {4, 5}},
                      std::pair<Shape, Shape>{{1, 1}, {1, 1}},
                      std::pair<Shape, Shape>{{4}, {4}},              // dot → scalar
                      std::pair<Shape, Shape>{{4}, {4, 3}},           // 1-D A
                      std::pair<Shape, Shape>{{2, 3, 4}, {4}},        // 1-D B
                      std::pair<Shape, Shape>{{5}, {2, 5, 3}},        // 1-D A, batched B
                      std::pair<Shape, Shape>{{2, 7, 8}, {8, 9}},     // shared weight
                      std::pair<Shape, Shape>{{2, 3, 7, 8}, {8, 9}},  // shared weight, 2 batch dims
                      std::pair<Shape, Shape>{{7, 8}, {3, 8, 9}},     // shared A
                      std::pair<Shape, Shape>{{3, 7, 8}, {3, 8, 9}},  // same batch
                      std::pair<Shape, Shape>{{2, 1, 7, 8}, {3, 8, 9}},     // mixed broadcast
                      std::pair<Shape, Shape>{{2, 1, 7, 8}, {1, 3, 8, 9}},  // mixed broadcast
                      std::pair<Shape, Shape>{{1, 3, 7, 8}, {2, 1, 8, 9}},
                      std::pair<Shape, Shape>{{2, 3, 0, 8}, {8, 4}},  // empty M
                      std::pair<Shape, Shape>{{2, 3, 5, 0}, {0, 4}},  // K = 0: zeros
                      std::pair<Shape, Shape>{{64, 33, 65}, {64, 65, 17}},
                      std::pair<Shape, Shape>{{4, 130, 70}, {70, 129}}));

TEST(MatMul, Int64AndDouble) {
  auto a = Tensor::from_vector<int64_t>(DType::Int64, {2, 2, 3},
                                        {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  auto b = Tensor::from_vector<int64_t>(DType::Int64, {3, 1}, {1, 10, 100});
  auto out = run_node(make_node("MatMul", 2), 13, {a, b});
  EXPECT_EQ(out[0].dtype(), DType::Int64);
  EXPECT_EQ(out[0].shape(), (Shape{2, 2, 1}));
  EXPECT_EQ(out[0].to_int64_vector(), (std::vector<int64_t>{321, 654, 987, 1320}));
  auto ad = Tensor::from_vector<double>(DType::Float64, {3}, {1, 2, 3});
  auto bd = Tensor::from_vector<double>(DType::Float64, {3}, {4, 5, 6});
  auto od = run_node(make_node("MatMul", 2), 13, {ad, bd});
  EXPECT_EQ(od[0].shape(), Shape{});
  EXPECT_DOUBLE_EQ(od[0].get_as_double(0), 32.0);
}

TEST(MatMul, Float16) {
  std::vector<uint16_t> av, bv;
  for (float f : {1.f, 2.f, 3.f, 4.f}) av.push_back(float_to_half(f));
  for (float f : {0.5f, -1.f}) bv.push_back(float_to_half(f));
  auto a = Tensor::from_vector(DType::Float16, {2, 2}, av);
  auto b = Tensor::from_vector(DType::Float16, {2, 1}, bv);
  auto out = run_node(make_node("MatMul", 2), 13, {a, b});
  EXPECT_EQ(out[0].dtype(), DType::Float16);
  expect_close(out[0], {-1.5, -2.5});
}

TEST(MatMul, BadShapesThrowWithShapes) {
  try {
    run_node(make_node("MatMul", 2), 13, {random_tensor({2, 3}, 1), random_tensor({4, 5}, 2)});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run_node(make_node("MatMul", 2), 13,
                        {random_tensor({2, 3, 4}, 1), random_tensor({3, 4, 5}, 2)}),
               Error);
}

// ---- Gemm ------------------------------------------------------------------------------------

std::vector<double> naive_gemm(const Tensor& A, const Tensor& B, const Tensor* C, bool ta, bool tb,
                               double alpha, double beta) {
  auto a = A.to_double_vector(), b = B.to_double_vector();
  int64_t M = ta ? A.dim(1) : A.dim(0), K = ta ? A.dim(0) : A.dim(1), N = tb ? B.dim(0) : B.dim(1);
  std::vector<double> y(M * N);
  std::vector<double> c = C ? C->to_double_vector() : std::vector<double>{};
  int64_t cr = C && C->rank() == 2 ? C->dim(0) : 1, cc = C && C->rank() >= 1 ? C->dim(-1) : 1;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double acc = 0;
      for (int64_t k = 0; k < K; k++)
        acc += (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
      double v = alpha * acc;
      if (C) v += beta * c[(cr == 1 ? 0 : i) * cc + (cc == 1 ? 0 : j)];
      y[i * N + j] = v;
    }
  return y;
}

TEST(Gemm, AllAttributesAndBiasShapes) {
  const int64_t M = 13, N = 17, K = 9;
  std::vector<Shape> c_shapes = {{}, {1}, {N}, {1, N}, {M, 1}, {M, N}, {1, 1}};
  uint32_t seed = 10;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int ci = -1; ci < (int)c_shapes.size(); ci++) {
        Tensor A = random_tensor(ta ? Shape{K, M} : Shape{M, K}, seed++);
        Tensor B = random_tensor(tb ? Shape{N, K} : Shape{K, N}, seed++);
        Tensor C = ci >= 0 ? random_tensor(c_shapes[ci], seed++) : Tensor();
        auto node = make_node("Gemm", ci >= 0 ? 3 : 2);
        set_int(node, "transA", ta);
        set_int(node, "transB", tb);
        set_float(node, "alpha", 0.25f);
        set_float(node, "beta", 0.35f);
        std::vector<Tensor> in = {A, B};
        if (ci >= 0) in.push_back(C);
        auto out = run_node(node, 13, in);
        EXPECT_EQ(out[0].shape(), (Shape{M, N}));
        expect_close(out[0], naive_gemm(A, B, ci >= 0 ? &C : nullptr, ta, tb, 0.25, 0.35));
      }
}

TEST(Gemm, DefaultsAndInt32) {
  auto A = Tensor::from_vector<int32_t>(DType::Int32, {2, 2}, {1, 2, 3, 4});
  auto B = Tensor::from_vector<int32_t>(DType::Int32, {2, 2}, {5, 6, 7, 8});
  auto C = Tensor::from_vector<int32_t>(DType::Int32, {2}, {100, 200});
  auto out = run_node(make_node("Gemm", 3), 13, {A, B, C});
  EXPECT_EQ(out[0].to_int64_vector(), (std::vector<int64_t>{119, 222, 143, 250}));
}

TEST(Gemm, BadBiasShapeThrows) {
  EXPECT_THROW(
      run_node(make_node("Gemm", 3), 13,
               {random_tensor({2, 3}, 1), random_tensor({3, 4}, 2), random_tensor({3}, 3)}),
      Error);
}

// ---- sgemm wrapper: strides and batches --------------------------------------------------------

TEST(Sgemm, LeadingDimensionsBetaAndBatches) {
  const int64_t M = 5, N = 6, K = 7, lda = 11, ldb = 9, ldc = 8, batch = 3;
  for (auto be : kernels::available_gemm_backends()) {
    kernels::set_gemm_backend(be);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t sa : {(int64_t)0, (int64_t)100})
          for (float beta : {0.f, 1.f, 0.5f}) {
            std::mt19937 rng(7);
            std::uniform_real_distribution<float> u(-1, 1);
            std::vector<float> A(batch * 100 + 100), B(batch * 100 + 100), C(batch * 64);
            for (auto& x : A) x = u(rng);
            for (auto& x : B) x = u(rng);
            for (auto& x : C) x = u(rng);
            std::vector<float> C0 = C;
            kernels::sgemm_strided_batched(ta, tb, M, N, K, 1.5f, A.data(), lda, sa, B.data(), ldb,
                                           100, beta, C.data(), ldc, 64, batch);
            for (int64_t bi = 0; bi < batch; bi++)
              for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                  double acc = 0;
                  for (int64_t k = 0; k < K; k++) {
                    double av = ta ? A[bi * sa + k * lda + i] : A[bi * sa + i * lda + k];
                    double bv = tb ? B[bi * 100 + j * ldb + k] : B[bi * 100 + k * ldb + j];
                    acc += av * bv;
                  }
                  double want = 1.5 * acc + beta * C0[bi * 64 + i * ldc + j];
                  ASSERT_NEAR(C[bi * 64 + i * ldc + j], want, 1e-4)
                      << kernels::gemm_backend_name(be) << " ta=" << ta << " tb=" << tb
                      << " sa=" << sa << " beta=" << beta;
                }
            // Padding between rows of C is untouched.
            for (int64_t bi = 0; bi < batch; bi++)
              for (int64_t i = 0; i < M; i++)
                for (int64_t j = N; j < ldc && i * ldc + j < 64; j++)
                  ASSERT_EQ(C[bi * 64 + i * ldc + j], C0[bi * 64 + i * ldc + j]);
          }
  }
  kernels::set_gemm_backend(kernels::GemmBackend::OneDNN);
}

TEST(Sgemm, BetaZeroIgnoresNaN) {
  std::vector<float> A(4, 1.f), B(4, 1.f), C(4, NAN);
  kernels::sgemm(false, false, 2, 2, 2, 1.f, A.data(), 2, B.data(), 2, 0.f, C.data(), 2);
  for (float c : C) EXPECT_EQ(c, 2.f);
}

// Aᵀ·B over thousands of rows into a small output: sgemm splits the rows over the threads
// (split_rows_tn in gemm.cc) on a multi-threaded full build; the sum is the same product.
TEST(Sgemm, ManyRowsTransposedA) {
  const int64_t M = 37, N = 29, K = 3001, lda = 40, ldb = 31, ldc = 33;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> A(K * lda), B(K * ldb);
  for (auto& x : A) x = u(rng);
  for (auto& x : B) x = u(rng);
  for (float beta : {0.f, 0.5f}) {
    std::vector<float> C(M * ldc);
    for (auto& x : C) x = beta == 0.f ? NAN : u(rng);
    const std::vector<float> C0 = C;
    kernels::sgemm(true, false, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    for (int64_t i = 0; i < M; i++) {
      for (int64_t j = 0; j < N; j++) {
        double acc = 0;
        for (int64_t k = 0; k < K; k++) acc += (double)A[k * lda + i] * B[k * ldb + j];
        const double want = 0.75 * acc + (beta == 0.f ? 0.0 : beta * C0[i * ldc + j]);
        ASSERT_NEAR(C[i * ldc + j], want, 1e-3) << "beta " << beta << " at " << i << "," << j;
      }
      for (int64_t j = N; j < ldc; j++)  // padding untouched
        ASSERT_TRUE(std::isnan(C[i * ldc + j]) == std::isnan(C0[i * ldc + j]));
    }
  }
}

// ---- Conv ------------------------------------------------------------------------------------

struct ConvCase {
  Shape x, w;
  std::vector<int64_t> strides, dilations, pads;
  int64_t group;
  bool bias;
  std::string auto_pad;
};

// Readable test names in ctest output: "x[1, 3, 8, 8] w[4, 3, 3, 3] g1 SAME_UPPER".
void PrintTo(const ConvCase& c, std::ostream* os) {
  *os << "x" << shape_str(c.x) << " w" << shape_str(c.w) << " g" << c.group << " "
      << (c.auto_pad.empty() ? "NOTSET" : c.auto_pad) << (c.bias ? " bias" : "");
}

// Direct definition on double with explicit pads (auto_pad resolved by the caller's case).
std::vector<double> naive_conv(const Tensor& X, const Tensor& W, const Tensor* B, const ConvCase& c,
                               Shape& out_shape) {
  int nsp = (int)c.x.size() - 2;
  std::vector<int64_t> in(c.x.begin() + 2, c.x.end()), k(c.w.begin() + 2, c.w.end());
  std::vector<int64_t> pb(nsp), pe(nsp), out(nsp);
  for (int i = 0; i < nsp; i++) {
    int64_t ek = (k[i] - 1) * c.dilations[i] + 1;
    if (c.auto_pad == "SAME_UPPER" || c.auto_pad == "SAME_LOWER") {
      int64_t o = (in[i] + c.strides[i] - 1) / c.strides[i];
      int64_t total = std::max<int64_t>(0, (o - 1) * c.strides[i] + ek - in[i]);
      pb[i] = c.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe[i] = total - pb[i];
    } else if (c.auto_pad == "VALID") {
      pb[i] = pe[i] = 0;
    } else {
      pb[i] = c.pads[i];
      pe[i] = c.pads[i + nsp];
    }
    out[i] = (in[i] + pb[i] + pe[i] - ek) / c.strides[i] + 1;
  }
  int64_t N = c.x[0], C = c.x[1], M = c.w[0], Cg = C / c.group, Mg = M / c.group;
  out_shape = {N, M};
  out_shape.insert(out_shape.end(), out.begin(), out.end());
  auto x = X.to_double_vector(), w = W.to_double_vector();
  auto b = B ? B->to_double_vector() : std::vector<double>{};
  int64_t osz = shape_numel(Shape(out.begin(), out.end()));
  int64_t isz = shape_numel(Shape(in.begin(), in.end())),
          ksz = shape_numel(Shape(k.begin(), k.end()));
  std::vector<double> y(N * M * osz);
  for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t o = 0; o < osz; o++) {
        std::vector<int64_t> oi(nsp);
        for (int64_t r = o, d = nsp - 1; d >= 0; d--) oi[d] = r % out[d], r /= out[d];
        double acc = B ? b[m] : 0;
        for (int64_t ci = 0; ci < Cg; ci++)
          for (int64_t kk = 0; kk < ksz; kk++) {
            int64_t xoff = 0;
            bool inside = true;
            for (int64_t r = kk, d = nsp - 1, mul = 1; d >= 0; d--) {
              int64_t kd = r % k[d];
              r /= k[d];
              int64_t id = oi[d] * c.strides[d] - pb[d] + kd * c.dilations[d];
              if (id < 0 || id >= in[d]) inside = false;
              xoff += id * mul;
              mul *= in[d];
            }
            if (!inside) continue;
            acc += x[(n * C + (m / Mg) * Cg + ci) * isz + xoff] * w[(m * Cg + ci) * ksz + kk];
          }
        y[(n * M + m) * osz + o] = acc;
      }
  return y;
}

class ConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvTest, MatchesNaive) {
  const ConvCase& c = GetParam();
  Tensor X = random_tensor(c.x, 3), W = random_tensor(c.w, 4), B = random_tensor({c.w[0]}, 5);
  auto node = make_node("Conv", c.bias ? 3 : 2);
  set_ints(node, "strides", c.strides);
  set_ints(node, "dilations", c.dilations);
  if (!c.pads.empty()) set_ints(node, "pads", c.pads);
  set_int(node, "group", c.group);
  if (!c.auto_pad.empty()) set_string(node, "auto_pad", c.auto_pad);
  std::vector<Tensor> in = {X, W};
  if (c.bias) in.push_back(B);
  Shape want_shape;
  auto want = naive_conv(X, W, c.bias ? &B : nullptr, c, want_shape);
  auto out = run_node(node, 11, in);
  EXPECT_EQ(out[0].shape(), want_shape);
  expect_close(out[0], want);
  // float64 takes the direct loop: same numbers.
  auto to64 = [](const Tensor& t) {
    return Tensor::from_vector(DType::Float64, t.shape(), t.to_double_vector());
  };
  std::vector<Tensor> in64 = {to64(X), to64(W)};
  if (c.bias) in64.push_back(to64(B));
  auto out64 = run_node(node, 11, in64);
  EXPECT_EQ(out64[0].dtype(), DType::Float64);
  expect_close(out64[0], want, 1e-9);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConvTest,
    ::testing::Values(
        ConvCase{{1, 1, 5, 5}, {1, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 1, false, ""},
        ConvCase{{2, 3, 9, 8}, {4, 3, 3, 2}, {2, 1}, {1, 1}, {1, 0, 2, 1}, 1, true, ""},
        ConvCase{{2, 4, 11, 10}, {6, 2, 3, 3}, {2, 3}, {2, 1}, {0, 1, 1, 2}, 2, true, ""},
        ConvCase{
            {1, 6, 7, 7}, {6, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, 6, true, ""},  // depthwise
        ConvCase{{1, 2, 7, 6}, {3, 2, 3, 2}, {2, 2}, {1, 2}, {}, 1, false, "SAME_UPPER"},
        ConvCase{{1, 2, 7, 6}, {3, 2, 2, 3}, {2, 3}, {1, 1}, {}, 1, true, "SAME_LOWER"},
        ConvCase{{1, 2, 7, 6}, {3, 2, 3, 3}, {2, 1}, {1, 1}, {}, 1, false, "VALID"},
        ConvCase{{2, 3, 16}, {5, 3, 4}, {3}, {2}, {2, 1}, 1, true, ""},         // 1-D
        ConvCase{{1, 4, 10}, {4, 2, 3}, {1}, {1}, {}, 2, false, "SAME_LOWER"},  // 1-D grouped
        ConvCase{{1, 2, 5, 6, 4},
                 {3, 2, 2, 3, 2},
                 {1, 2, 1},
                 {2, 1, 1},
                 {1, 0, 1, 0, 1, 1},
                 1,
                 true,
                 ""},  // 3-D
        ConvCase{
            {1, 3, 32, 32}, {8, 3, 8, 8}, {8, 8}, {1, 1}, {0, 0, 0, 0}, 1, true, ""}));  // patches

TEST(Conv, BadChannelsThrow) {
  EXPECT_THROW(run_node(make_node("Conv", 2), 11,
                        {random_tensor({1, 3, 5, 5}, 1), random_tensor({2, 2, 3, 3}, 2)}),
               Error);
}

TEST(Conv, KernelLargerThanInputThrows) {
  EXPECT_THROW(run_node(make_node("Conv", 2), 11,
                        {random_tensor({1, 1, 2, 2}, 1), random_tensor({1, 1, 3, 3}, 2)}),
               Error);
}

}  // namespace
}  // namespace onyx
