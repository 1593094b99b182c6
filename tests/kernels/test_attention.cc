// tests/kernels/test_attention.cc — onyx.Attention / onyx.AttentionGrad
// (kernels/attention/attention.cc) against the unfused exported subgraph
// (Reshape/Transpose/MatMul/Div/Add/Where/Softmax/...) run through runtime::Session: forward
// outputs, and dQ/dK/dV against autodiff of the unfused graph, for several B/H/T/D, with and
// without masks, causal, cross-attention (Tq != Tk) and Dv != D, query-block boundaries (T > 64, T
// not a multiple of 8; 128-row blocks over 512+ keys). Also: the saved LSE, determinism across
// thread counts, and errors for bad shapes. Finite differences:
// tests/autodiff/gradcheck_attention.inc. Attention dropout (dropout_ratio): inert outside training
// runs, the same mask as the unfused Softmax → Dropout → MatMul for a run seed (forward and
// backward), drop fraction and expectation, finite differences for a fixed seed, bit-identical
// repeats over thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ctime>

#include "../passes/attention_graphs.h"
#include "autodiff/gradient.h"
#include "kernels/cpu/gemm.h"
#include "runtime/parallel.h"
#include "runtime/session.h"

using namespace onyx;
using namespace onyx::attn_test;
using onyx::runtime::run_node;

namespace {

ir::Node attention_node(const Spec& s, bool grad) {
  ir::Node n;
  n.name = grad ? "attn_grad" : "attn";
  n.op_type = grad ? "AttentionGrad" : "Attention";
  n.domain = "onyx";
  n.attrs["num_heads"] = int_attr(s.H);
  if (s.Hk > 0) n.attrs["num_kv_heads"] = int_attr(s.Hk);
  ir::Attribute sc;
  sc.kind = ir::Attribute::Kind::Float;
  sc.f = 1.0f / std::sqrt((float)s.D);
  n.attrs["scale"] = sc;
  n.attrs["causal"] = int_attr(s.causal ? 1 : 0);
  if (s.nan_guard) n.attrs["zero_masked_rows"] = int_attr(1);
  if (s.dropout > 0) {  // the identity of the Dropout the unfused graph has (attention_graphs.h)
    ir::Attribute r, key;
    r.kind = ir::Attribute::Kind::Float;
    r.f = s.dropout;
    key.kind = ir::Attribute::Kind::String;
    key.s = kDropoutOut;
    n.attrs["dropout_ratio"] = r;
    n.attrs["rng_key"] = key;
  }
  if (grad) {
    n.inputs = {"dO", "Q", "K", "V", s.mask != Mask::None ? "mask" : "", "lse"};
    n.outputs = {"dQ", "dK", "dV"};
  } else {
    n.inputs = {"Q", "K", "V"};
    if (s.mask != Mask::None) n.inputs.push_back("mask");
    n.outputs = {"O", "lse"};
  }
  return n;
}

struct Inputs {
  Tensor Q, K, V, mask;
};
Inputs make_inputs(const Spec& s, uint32_t seed) {
  Inputs in;
  in.Q = random_tensor({s.B, s.Tq, s.H * s.D}, seed, -2, 2);
  in.K = random_tensor({s.B, s.Tk, s.kv_heads() * s.D}, seed + 1, -2, 2);
  in.V = random_tensor({s.B, s.Tk, s.kv_heads() * s.Dv}, seed + 2);
  if (s.mask != Mask::None) in.mask = padding_mask(s);
  return in;
}

std::vector<Tensor> fused_forward(const Spec& s, const Inputs& in,
                                  const runtime::RunOptions& ro = {}) {
  std::vector<Tensor> args = {in.Q, in.K, in.V};
  if (s.mask != Mask::None) args.push_back(in.mask);
  return run_node(attention_node(s, false), 1, args, ro);
}

Tensor unfused_forward(const Spec& s, const Inputs& in, const runtime::RunOptions& ro = {}) {
  runtime::Session sess(std::make_shared<ir::Graph>(unfused_attention(s)));
  std::map<std::string, Tensor> feeds = {{"Q", in.Q}, {"K", in.K}, {"V", in.V}};
  if (s.mask != Mask::None) feeds["mask"] = in.mask;
  return sess.run(feeds, ro).at("out");
}

runtime::RunOptions training_run(uint64_t seed) {
  runtime::RunOptions ro;
  ro.training = true;
  ro.seed = seed;
  return ro;
}

void expect_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  // relative error, with a floor of a tenth of the largest magnitude (entries near zero come from
  // cancelling sums and carry the absolute error of the large ones)
  double big = 0;
  for (int64_t i = 0; i < want.numel(); i++)
    big = std::max(big, (double)std::fabs(want.data<float>()[i]));
  double worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < want.numel(); i++) {
    double g = got.data<float>()[i], w = want.data<float>()[i];
    double err = std::fabs(g - w) / (0.1 * big + std::fabs(w) + 1e-30);
    if (!(err <= worst)) worst = err, at = i;
  }
  EXPECT_LE(worst, rtol) << what << ": element " << at << " got " << got.data<float>()[at]
                         << " want " << want.data<float>()[at];
}

std::string spec_name(const Spec& s) {
  return cat("B", s.B, "_Tq", s.Tq, "_Tk", s.Tk, "_H", s.H, "_Hk", s.kv_heads(), "_D", s.D, "_Dv",
             s.Dv, "_mask", (int)s.mask, s.causal ? "_causal" : "");
}

std::vector<Spec> specs() {
  std::vector<Spec> v;
  auto add = [&](int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, int64_t Dv, Mask m,
                 bool causal, int64_t Hk = 0) {
    Spec s;
    s.B = B, s.Tq = Tq, s.Tk = Tk, s.H = H, s.D = D, s.Dv = Dv, s.mask = m, s.causal = causal;
    s.Hk = Hk;
    v.push_back(s);
  };
  add(1, 1, 1, 1, 1, 1, Mask::None, false);
  add(2, 5, 5, 2, 4, 4, Mask::None, false);
  add(2, 5, 5, 2, 4, 4, Mask::Padding, false);
  add(2, 9, 9, 3, 8, 8, Mask::None, true);
  add(3, 17, 17, 2, 16, 16, Mask::Padding, true);
  add(2, 7, 11, 2, 8, 5, Mask::Full, false);          // cross-attention, Dv != D
  add(2, 130, 130, 2, 16, 16, Mask::Padding, false);  // three query blocks, ragged last one
  add(1, 130, 130, 3, 8, 8, Mask::None, true);
  add(2, 64, 64, 4, 32, 32, Mask::Full, true);
  // grouped-query attention: 2 and 3 query heads per key/value head, and multi-query (Hk = 1)
  add(2, 9, 9, 4, 8, 8, Mask::Padding, true, 2);
  add(2, 130, 130, 6, 16, 16, Mask::Full, true, 2);
  add(1, 7, 11, 4, 8, 5, Mask::None, false, 1);
  // 512 keys or more without a causal mask: 128-row query blocks (300 = 128 + 128 + 44)
  add(1, 300, 520, 2, 8, 8, Mask::Padding, false);
  return v;
}

}  // namespace

TEST(Attention, ForwardMatchesUnfusedGraph) {
  uint32_t seed = 1;
  for (const Spec& s : specs()) {
    Inputs in = make_inputs(s, seed += 10);
    auto fused = fused_forward(s, in);
    expect_close(fused[0], unfused_forward(s, in), 1e-5, spec_name(s));
    // LSE: the row log-sum-exp of the masked, scaled scores (checked for row 0 of every head).
    const float* Q = in.Q.data<float>();
    const float* K = in.K.data<float>();
    float scale = 1.0f / std::sqrt((float)s.D);
    int64_t C = s.H * s.D, Ck = s.kv_heads() * s.D, G = s.H / s.kv_heads();
    for (int64_t b = 0; b < s.B; b++)
      for (int64_t h = 0; h < s.H; h++) {
        double mx = -1e300, sum = 0;
        std::vector<double> row;
        int64_t nk = s.causal ? 1 : s.Tk;
        for (int64_t j = 0; j < nk; j++) {
          double d = 0;
          for (int64_t c = 0; c < s.D; c++)
            d += Q[b * s.Tq * C + h * s.D + c] * K[(b * s.Tk + j) * Ck + (h / G) * s.D + c];
          d *= scale;
          if (s.mask == Mask::Padding) d += in.mask.data<float>()[b * s.Tk + j];
          if (s.mask == Mask::Full) d += in.mask.data<float>()[((b * s.H + h) * s.Tq) * s.Tk + j];
          row.push_back(d);
          mx = std::max(mx, d);
        }
        for (double d : row) sum += std::exp(d - mx);
        double want = mx + std::log(sum);
        EXPECT_NEAR(fused[1].data<float>()[(b * s.H + h) * s.Tq], want,
                    1e-4 * (1 + std::fabs(want)))
            << spec_name(s);
      }
  }
}

// dQ, dK, dV of loss = sum(out * W): AttentionGrad(dO = W) against autodiff of the unfused graph.
TEST(Attention, BackwardMatchesAutodiffOfUnfusedGraph) {
  uint32_t seed = 500;
  for (const Spec& s : specs()) {
    Inputs in = make_inputs(s, seed += 10);
    Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, seed + 5);
    // Unfused forward with Q/K/V/mask as initializers, loss = ReduceSum(out * W).
    ir::Graph g = unfused_attention(s);
    g.inputs.clear();
    g.add_initializer("Q", in.Q);
    g.add_initializer("K", in.K);
    g.add_initializer("V", in.V);
    if (s.mask != Mask::None) g.add_initializer("mask", in.mask);
    g.add_initializer("W", W);
    ir::Node mul, sum;
    mul.name = "mul", mul.op_type = "Mul", mul.inputs = {"out", "W"}, mul.outputs = {"ow"};
    sum.name = "sum", sum.op_type = "ReduceSum", sum.inputs = {"ow"}, sum.outputs = {"loss"};
    sum.attrs["keepdims"] = int_attr(0);
    g.nodes.push_back(mul);
    g.nodes.push_back(sum);
    g.outputs.clear();
    ir::ValueInfo lo;
    lo.name = "loss";
    lo.dtype = DType::Float32;
    g.outputs.push_back(lo);
    autodiff::GradientOptions opts;
    opts.trainable = {"Q", "K", "V"};
    auto tg = autodiff::build_training_graph(g, {}, opts);
    runtime::Session sess(tg.graph, {"Q", "K", "V"});
    auto res = sess.run({});
    std::map<std::string, Tensor> ref;
    for (auto& [p, gname] : tg.gradients) ref[p] = res.at(gname);

    auto fwd = fused_forward(s, in);
    auto grads = run_node(attention_node(s, true), 1,
                          {W, in.Q, in.K, in.V, s.mask != Mask::None ? in.mask : Tensor(), fwd[1]});
    expect_close(grads[0], ref.at("Q"), 2e-4, spec_name(s) + " dQ");
    expect_close(grads[1], ref.at("K"), 2e-4, spec_name(s) + " dK");
    expect_close(grads[2], ref.at("V"), 2e-4, spec_name(s) + " dV");
  }
}

// ---- bf16 tiles (KernelContext::bf16_gemm) ---------------------------------------------------

// x rounded to bf16 as the kernels round GEMM inputs (kernels::f32_to_bf16), held in a double.
std::vector<double> rounded(const float* x, int64_t n) {
  std::vector<uint16_t> h((size_t)n);
  std::vector<float> f((size_t)n);
  kernels::f32_to_bf16(x, h.data(), n);
  kernels::bf16_to_f32(h.data(), f.data(), n);
  return std::vector<double>(f.begin(), f.end());
}
double rounded(double x) {
  float f = (float)x;
  return rounded(&f, 1)[0];
}

// A float32 tensor rounded to a bf16 one, as kernels::f32_to_bf16 rounds.
Tensor to_bf16(const Tensor& f32) {
  Tensor t(DType::BFloat16, f32.shape());
  kernels::f32_to_bf16(f32.data<float>(), t.data<uint16_t>(), f32.numel());
  return t;
}

// Attention and its gradients in double with the bf16 tiles' roundings: Q, K, V, P (for P·V and
// dV), dO and dS rounded to bf16, everything else exact.
struct Bf16Reference {
  std::vector<double> O, lse, dQ, dK, dV;
};
Bf16Reference bf16_reference(const Spec& s, const Inputs& in, const Tensor& dO) {
  const int64_t Hk = s.kv_heads(), G = s.H / Hk, C = s.H * s.D, Ck = Hk * s.D, Cv = Hk * s.Dv,
                Co = s.H * s.Dv;
  const double scale = 1.0f / std::sqrt((float)s.D);
  auto q = rounded(in.Q.data<float>(), in.Q.numel()), k = rounded(in.K.data<float>(), in.K.numel()),
       v = rounded(in.V.data<float>(), in.V.numel()), dout = rounded(dO.data<float>(), dO.numel());
  Bf16Reference r;
  r.O.assign((size_t)(s.B * s.Tq * Co), 0.0);
  r.lse.assign((size_t)(s.B * s.H * s.Tq), 0.0);
  r.dQ.assign(q.size(), 0.0);
  r.dK.assign(k.size(), 0.0);
  r.dV.assign(v.size(), 0.0);
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t h = 0; h < s.H; h++)
      for (int64_t i = 0; i < s.Tq; i++) {
        const int64_t nk = s.causal ? i + 1 : s.Tk, kh = h / G;
        std::vector<double> S((size_t)nk), P((size_t)nk), dP((size_t)nk);
        double mx = -1e300;
        for (int64_t j = 0; j < nk; j++) {
          double d = 0;
          for (int64_t c = 0; c < s.D; c++)
            d += q[(b * s.Tq + i) * C + h * s.D + c] * k[(b * s.Tk + j) * Ck + kh * s.D + c];
          d *= scale;
          if (s.mask == Mask::Padding) d += in.mask.data<float>()[b * s.Tk + j];
          if (s.mask == Mask::Full)
            d += in.mask.data<float>()[((b * s.H + h) * s.Tq + i) * s.Tk + j];
          S[j] = d;
          mx = std::max(mx, d);
        }
        double sum = 0;
        for (int64_t j = 0; j < nk; j++) sum += std::exp(S[j] - mx);
        r.lse[(b * s.H + h) * s.Tq + i] = mx + std::log(sum);
        double rowsum = 0;
        for (int64_t j = 0; j < nk; j++) {
          P[j] = std::exp(S[j] - mx) / sum;
          const double pr = rounded(P[j]);
          double dp = 0;
          for (int64_t e = 0; e < s.Dv; e++) {
            const double vv = v[(b * s.Tk + j) * Cv + kh * s.Dv + e],
                         go = dout[(b * s.Tq + i) * Co + h * s.Dv + e];
            r.O[(b * s.Tq + i) * Co + h * s.Dv + e] += pr * vv;
            dp += go * vv;
            r.dV[(b * s.Tk + j) * Cv + kh * s.Dv + e] += pr * go;
          }
          dP[j] = dp;
          rowsum += dp * P[j];
        }
        for (int64_t j = 0; j < nk; j++) {
          const double ds = rounded(P[j] * (dP[j] - rowsum) * scale);
          for (int64_t c = 0; c < s.D; c++) {
            r.dQ[(b * s.Tq + i) * C + h * s.D + c] += ds * k[(b * s.Tk + j) * Ck + kh * s.D + c];
            r.dK[(b * s.Tk + j) * Ck + kh * s.D + c] += ds * q[(b * s.Tq + i) * C + h * s.D + c];
          }
        }
      }
  return r;
}

// The fraction of got's elements off want by more than tol, relative with a floor of a tenth of
// want's largest magnitude (as expect_close). A bf16 rounding of the kernel's float32 P or dS can
// land on the other side of a rounding boundary than the double reference's (about one element
// in 10^4): that moves its row by up to 2^-8 of the element, so single elements are compared by
// how many are off, not by the worst.
double fraction_off(const Tensor& got, const std::vector<double>& want, double tol) {
  double big = 0;
  int64_t off = 0;
  for (double w : want) big = std::max(big, std::fabs(w));
  for (size_t i = 0; i < want.size(); i++)
    off += std::fabs(got.data<float>()[i] - want[i]) > tol * (0.1 * big + std::fabs(want[i]));
  return (double)off / (double)want.size();
}

// Under bf16_gemm the tile GEMMs read bf16 operands (Q, K, V, the softmax P, dO, dS) and
// accumulate in float32, as PyTorch's CPU flash attention runs a bf16 SDPA: the outputs match a
// double-precision reference with exactly those roundings, on both ways of running them (native
// gemm_bf16 on bf16 arrays, widened float32 sgemm), while the float32 tiles are measurably off it
// (so the check would notice a rounding left out); bf16 Q/K/V inputs give the same bits as the
// float32 inputs they widen to.
TEST(AttentionBf16, TilesRoundTheirOperandsToBf16OnBothPaths) {
  std::vector<Spec> v;
  for (const Spec& s : specs())
    if (s.Tq * s.Tk * s.H >= 8 * 8 * 2) v.push_back(s);
  ASSERT_GE(v.size(), 6u);
  uint32_t seed = 900;
  for (const Spec& s : v) {
    Inputs in = make_inputs(s, seed += 10);
    Tensor dO = random_tensor({s.B, s.Tq, s.H * s.Dv}, seed + 5);
    Bf16Reference ref = bf16_reference(s, in, dO);
    Tensor mask = s.mask != Mask::None ? in.mask : Tensor();
    auto grads_of = [&](const Inputs& x, const Tensor& lse, const runtime::RunOptions& ro) {
      return run_node(attention_node(s, true), 1, {dO, x.Q, x.K, x.V, mask, lse}, ro);
    };
    runtime::RunOptions bf16;
    bf16.bf16_gemm = true;
    // float32 tiles: off the rounded reference by the rounding they skip
    const double tol = 5e-5;
    auto f32 = fused_forward(s, in);
    auto f32g = grads_of(in, f32[1], {});
    const double f32_off =
        std::min({fraction_off(f32[0], ref.O, tol), fraction_off(f32g[0], ref.dQ, tol),
                  fraction_off(f32g[1], ref.dK, tol), fraction_off(f32g[2], ref.dV, tol)});
    EXPECT_GT(f32_off, 0.3) << spec_name(s);
    for (int native : {1, 0}) {
      kernels::force_bf16_gemm_native(native);
      const std::string what = spec_name(s) + (native ? " native" : " widened");
      auto fwd = fused_forward(s, in, bf16);
      EXPECT_LE(fraction_off(fwd[0], ref.O, tol), 0.01) << what << " O";
      EXPECT_EQ(fraction_off(fwd[1], ref.lse, 1e-5), 0.0) << what << " LSE";
      auto g = grads_of(in, fwd[1], bf16);
      EXPECT_LE(fraction_off(g[0], ref.dQ, tol), 0.01) << what << " dQ";
      EXPECT_LE(fraction_off(g[1], ref.dK, tol), 0.01) << what << " dK";
      EXPECT_LE(fraction_off(g[2], ref.dV, tol), 0.01) << what << " dV";
      // bf16 inputs: the same bits as the float32 inputs (rounded in the kernel)
      Inputs in16 = in;
      in16.Q = to_bf16(in.Q);
      in16.K = to_bf16(in.K);
      in16.V = to_bf16(in.V);
      auto fwd16 = fused_forward(s, in16, bf16);
      auto g16 = grads_of(in16, fwd[1], bf16);
      EXPECT_EQ(std::memcmp(fwd16[0].raw(), fwd[0].raw(), fwd[0].nbytes()), 0) << what;
      for (int i = 0; i < 3; i++)
        EXPECT_EQ(std::memcmp(g16[i].raw(), g[i].raw(), g[i].nbytes()), 0) << what << " grad " << i;
    }
    kernels::force_bf16_gemm_native(-1);
  }
}

// zero_masked_rows: the last batch's mask hides every key (-inf), so its softmax rows are NaN in
// the unfused graph and 0 behind the dynamo exporter's Where(IsNaN(P), 0, P). The fused op gives
// O = 0 and zero gradients there, LSE = +inf, and on the other batches exactly what it gives
// without that batch (checked against the unfused graph by the tests above).
TEST(Attention, FullyMaskedRowsAreZeroWithZeroMaskedRows) {
  Spec s;
  s.B = 3, s.Tq = s.Tk = 6, s.H = 2, s.D = 4, s.Dv = 4, s.mask = Mask::Padding, s.nan_guard = true;
  Inputs in = make_inputs(s, 900);
  Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, 901);
  auto fwd = fused_forward(s, in);
  auto grads = run_node(attention_node(s, true), 1, {W, in.Q, in.K, in.V, in.mask, fwd[1]});
  Spec s2 = s;
  s2.B = 2;
  auto first2 = [](const Tensor& t) {
    Shape sh = t.shape();
    int64_t per = t.numel() / sh[0];
    sh[0] = 2;
    std::vector<float> v(t.data<float>(), t.data<float>() + 2 * per);
    return Tensor::from_vector(DType::Float32, sh, v);
  };
  Inputs in2{first2(in.Q), first2(in.K), first2(in.V), first2(in.mask)};
  auto fwd2 = fused_forward(s2, in2);
  auto grads2 =
      run_node(attention_node(s2, true), 1, {first2(W), in2.Q, in2.K, in2.V, in2.mask, fwd2[1]});
  auto check = [&](const Tensor& full, const Tensor& two, const char* what) {
    int64_t per = full.numel() / s.B;
    for (int64_t i = 0; i < full.numel(); i++) {
      float g = full.data<float>()[i];
      if (i < 2 * per)
        ASSERT_EQ(g, two.data<float>()[i]) << what << " element " << i;
      else
        ASSERT_EQ(g, 0.0f) << what << " element " << i << " of the fully masked batch";
    }
  };
  check(fwd[0], fwd2[0], "O");
  check(grads[0], grads2[0], "dQ");
  check(grads[1], grads2[1], "dK");
  check(grads[2], grads2[2], "dV");
  for (int64_t i = 2 * s.H * s.Tq; i < 3 * s.H * s.Tq; i++)
    EXPECT_EQ(fwd[1].data<float>()[i], INFINITY) << "LSE of a fully masked row";
}

// The mask is a stop-gradient input: a graph that wants its gradient is refused by name.
TEST(Attention, MaskNeedingAGradientIsAnError) {
  Spec s;
  s.mask = Mask::Full;
  Inputs in = make_inputs(s, 2);
  auto g = std::make_shared<ir::Graph>();
  for (auto [name, t] : {std::pair{"Q", in.Q}, {"K", in.K}, {"V", in.V}, {"mask", in.mask}})
    g->add_initializer(name, t);
  ir::Node n = attention_node(s, false);
  n.outputs = {"O"};
  g->nodes.push_back(n);
  ir::Node sum;
  sum.name = "sum", sum.op_type = "ReduceSum", sum.inputs = {"O"}, sum.outputs = {"loss"};
  sum.attrs["keepdims"] = int_attr(0);
  g->nodes.push_back(sum);
  ir::ValueInfo lo;
  lo.name = "loss";
  g->outputs.push_back(lo);
  g->opsets[""] = 17;
  autodiff::GradientOptions opts;
  opts.trainable = {"Q", "mask"};
  try {
    autodiff::build_training_graph(*g, {}, opts);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no gradient"), std::string::npos) << e.what();
  }
}

TEST(Attention, SameBitsForAnyThreadCount) {
  Spec s;
  s.B = 3, s.Tq = s.Tk = 100, s.H = 3, s.D = 16, s.Dv = 16, s.mask = Mask::Padding, s.causal = true;
  Inputs in = make_inputs(s, 9);
  Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, 3);
  int saved = runtime::num_threads();
  std::vector<std::vector<Tensor>> outs;
  for (int t : {1, 2, 3}) {
    runtime::set_num_threads(t);
    auto f = fused_forward(s, in);
    auto g = run_node(attention_node(s, true), 1, {W, in.Q, in.K, in.V, in.mask, f[1]});
    outs.push_back({f[0], f[1], g[0], g[1], g[2]});
  }
  runtime::set_num_threads(saved);
  for (size_t r = 1; r < outs.size(); r++)
    for (size_t i = 0; i < outs[0].size(); i++)
      EXPECT_EQ(0, std::memcmp(outs[0][i].raw(), outs[r][i].raw(), outs[0][i].nbytes()))
          << "output " << i << " differs between 1 and " << r + 1 << " threads";
}

TEST(Attention, BadInputsNameTheNode) {
  Spec s;
  Inputs in = make_inputs(s, 4);
  ir::Node n = attention_node(s, false);
  n.attrs["num_heads"] = int_attr(3);  // 3 does not divide C = 8
  try {
    run_node(n, 1, {in.Q, in.K, in.V});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("num_heads"), std::string::npos) << e.what();
  }
  ir::Node ok = attention_node(s, false);
  Tensor badK = random_tensor({s.B, s.Tk, 6}, 1);
  EXPECT_THROW(run_node(ok, 1, {in.Q, badK, in.V}), Error);
  Tensor badMask = random_tensor({s.B, 3, 1, s.Tk}, 1);  // 3 heads != 2
  EXPECT_THROW(run_node(ok, 1, {in.Q, in.K, in.V, badMask}), Error);
  s.causal = true;
  s.Tk = s.Tq + 1;
  Inputs cross = make_inputs(s, 5);
  EXPECT_THROW(run_node(attention_node(s, false), 1, {cross.Q, cross.K, cross.V}), Error);
}

// Timing at bert-mini's attention shape (B16, T128, H4, D64): fused forward+backward against the
// unfused subgraph's forward + autodiff backward. Not a test: run with
// --gtest_also_run_disabled_tests --gtest_filter='*AttentionBench*'.
TEST(Attention, DISABLED_AttentionBench) {
  for (int variant = 0; variant < 4; variant++) {
    bool causal = variant & 1;
    Spec s;
    s.B = causal ? 8 : 16, s.Tq = s.Tk = causal ? 256 : 128, s.H = 4, s.D = 64, s.Dv = 64;
    s.mask = causal ? Mask::None : Mask::Padding;
    s.causal = causal;
    s.dropout = variant >= 2 ? 0.1f : 0.0f;  // attention dropout, in a training run
    const runtime::RunOptions ro = training_run(1);
    Inputs in = make_inputs(s, 1);
    Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, 2);
    ir::Graph g = unfused_attention(s);
    g.inputs.clear();
    g.add_initializer("Q", in.Q);
    g.add_initializer("K", in.K);
    g.add_initializer("V", in.V);
    if (s.mask != Mask::None) g.add_initializer("mask", in.mask);
    g.add_initializer("W", W);
    ir::Node mul, sum;
    mul.name = "mul", mul.op_type = "Mul", mul.inputs = {"out", "W"}, mul.outputs = {"ow"};
    sum.name = "sum", sum.op_type = "ReduceSum", sum.inputs = {"ow"}, sum.outputs = {"loss"};
    g.nodes.push_back(mul);
    g.nodes.push_back(sum);
    g.outputs.clear();
    ir::ValueInfo lo;
    lo.name = "loss";
    g.outputs.push_back(lo);
    autodiff::GradientOptions opts;
    opts.trainable = {"Q", "K", "V"};
    auto tg = autodiff::build_training_graph(g, {}, opts);
    runtime::Session sess(tg.graph, {"Q", "K", "V"});
    // One thread, process CPU time (the shared machines are noisy; CPU time is not counted while
    // other processes hold the cores), best of 5 after a warm-up.
    int saved = runtime::num_threads();
    runtime::set_num_threads(1);
    auto cpu_now = [] {
      timespec ts;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return ts.tv_sec + 1e-9 * ts.tv_nsec;
    };
    auto time = [&](auto&& f) {
      f();
      double best = 1e9;
      for (int r = 0; r < 5; r++) {
        double t0 = cpu_now();
        f();
        best = std::min(best, cpu_now() - t0);
      }
      return best * 1e3;
    };
    double unfused = time([&] { sess.run({}, ro); });
    double fused_f = time([&] { fused_forward(s, in, ro); });
    auto f = fused_forward(s, in, ro);
    double fused_b = time([&] {
      run_node(attention_node(s, true), 1,
               {W, in.Q, in.K, in.V, s.mask != Mask::None ? in.mask : Tensor(), f[1]}, ro);
    });
    runtime::set_num_threads(saved);
    std::printf(
        "%s dropout %.1f, 1 thread CPU time: unfused fwd+bwd %.2f ms; fused fwd %.2f ms + bwd %.2f "
        "ms = %.2f ms\n",
        spec_name(s).c_str(), s.dropout, unfused, fused_f, fused_b, fused_f + fused_b);
  }
}

// ---- attention dropout (dropout_ratio) ----------------------------------------------------------

namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<Spec> dropout_specs() {
  std::vector<Spec> v;
  for (Spec s : specs()) {
    if (s.Tq == 1) continue;
    s.dropout = 0.25f;
    v.push_back(s);
  }
  return v;
}

// The unfused graph (with its Dropout) plus loss = ReduceSum(out * W); Q/K/V are initializers.
ir::Graph unfused_with_loss(const Spec& s, const Inputs& in, const Tensor& W) {
  ir::Graph g = unfused_attention(s);
  g.inputs.clear();
  g.add_initializer("Q", in.Q);
  g.add_initializer("K", in.K);
  g.add_initializer("V", in.V);
  if (s.mask != Mask::None) g.add_initializer("mask", in.mask);
  g.add_initializer("W", W);
  ir::Node mul, sum;
  mul.name = "mul", mul.op_type = "Mul", mul.inputs = {"out", "W"}, mul.outputs = {"ow"};
  sum.name = "sum", sum.op_type = "ReduceSum", sum.inputs = {"ow"}, sum.outputs = {"loss"};
  sum.attrs["keepdims"] = int_attr(0);
  g.nodes.push_back(mul);
  g.nodes.push_back(sum);
  g.outputs.clear();
  ir::ValueInfo lo;
  lo.name = "loss";
  lo.dtype = DType::Float32;
  g.outputs.push_back(lo);
  return g;
}

}  // namespace

// Outside training runs, or with dropout_ratio 0, the op is the plain attention, bit for bit.
TEST(AttentionDropout, InertOutsideTrainingRunsAndAtRatioZero) {
  for (Spec s : dropout_specs()) {
    Spec plain = s;
    plain.dropout = 0;
    Inputs in = make_inputs(s, 31);
    Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, 32);
    auto want = fused_forward(plain, in, training_run(5));
    auto eval = fused_forward(s, in);  // training = false
    EXPECT_TRUE(same_bits(eval[0], want[0]) && same_bits(eval[1], want[1])) << spec_name(s);
    ir::Node zero = attention_node(s, false);
    zero.attrs["dropout_ratio"].f = 0;
    std::vector<Tensor> args = {in.Q, in.K, in.V};
    if (s.mask != Mask::None) args.push_back(in.mask);
    auto z = run_node(zero, 1, args, training_run(5));
    EXPECT_TRUE(same_bits(z[0], want[0])) << spec_name(s);
    std::vector<Tensor> gargs = {
        W, in.Q, in.K, in.V, s.mask != Mask::None ? in.mask : Tensor(), want[1]};
    auto gw = run_node(attention_node(plain, true), 1, gargs, training_run(5));
    auto ge = run_node(attention_node(s, true), 1, gargs);
    for (int i = 0; i < 3; i++)
      EXPECT_TRUE(same_bits(ge[i], gw[i])) << spec_name(s) << " grad " << i;
  }
}

// In a training run the fused op drops exactly the probabilities the unfused graph's Dropout drops
// (same run seed, same rng identity): outputs agree to float rounding, and differ from no dropout.
TEST(AttentionDropout, ForwardMatchesUnfusedGraphWithTheSameMask) {
  uint32_t seed = 700;
  for (const Spec& s : dropout_specs()) {
    Inputs in = make_inputs(s, seed += 10);
    for (uint64_t run_seed : {1ull, 12345ull}) {
      auto ro = training_run(run_seed);
      auto fused = fused_forward(s, in, ro);
      expect_close(fused[0], unfused_forward(s, in, ro), 1e-5, spec_name(s) + " dropout");
      Spec plain = s;
      plain.dropout = 0;
      EXPECT_FALSE(same_bits(fused[0], fused_forward(plain, in, ro)[0])) << spec_name(s);
      // the saved LSE is the softmax's, before dropout
      EXPECT_TRUE(same_bits(fused[1], fused_forward(plain, in, ro)[1])) << spec_name(s);
    }
  }
}

// With V = one identity block per head (Dv = Tk), O_h = P' itself: about a fraction r of the
// probabilities are zero, the others are P / (1 - r), and the mean over run seeds is P.
TEST(AttentionDropout, DropsAFractionRAndKeepsTheExpectation) {
  Spec s;
  s.B = 2, s.Tq = s.Tk = 48, s.H = 2, s.D = 8, s.Dv = 48, s.dropout = 0.3f;
  Inputs in = make_inputs(s, 3);
  std::vector<float> v((size_t)(s.B * s.Tk * s.H * s.Dv), 0.0f);
  for (int64_t b = 0; b < s.B; b++)
    for (int64_t j = 0; j < s.Tk; j++)
      for (int64_t h = 0; h < s.H; h++) v[(b * s.Tk + j) * s.H * s.Dv + h * s.Dv + j] = 1.0f;
  in.V = Tensor::from_vector(DType::Float32, {s.B, s.Tk, s.H * s.Dv}, v);
  Spec plain = s;
  plain.dropout = 0;
  Tensor P = fused_forward(plain, in)[0];
  const int64_t n = P.numel();
  const int runs = 100;
  std::vector<double> mean((size_t)n, 0.0);
  int64_t dropped = 0, wrong = 0;
  for (int r = 0; r < runs; r++) {
    Tensor O = fused_forward(s, in, training_run(1000 + r))[0];
    for (int64_t i = 0; i < n; i++) {
      float o = O.data<float>()[i], p = P.data<float>()[i];
      mean[i] += o / runs;
      if (o == 0) {
        dropped++;
      } else if (std::fabs(o - p / (1 - s.dropout)) > 1e-6f * (1 + p)) {
        wrong++;
      }
    }
  }
  double frac = (double)dropped / ((double)n * runs);
  EXPECT_NEAR(frac, 0.3, 0.005);
  EXPECT_EQ(wrong, 0);
  double ratio_sum = 0;
  for (int64_t i = 0; i < n; i++) ratio_sum += mean[i] / P.data<float>()[i];
  EXPECT_NEAR(ratio_sum / n, 1.0, 0.01);
}

// dQ, dK, dV with dropout: AttentionGrad (redrawing the mask) against autodiff of the unfused graph
// (Softmax → Dropout → MatMul, DropoutGrad on the stored mask) in the same training run.
TEST(AttentionDropout, BackwardMatchesAutodiffOfUnfusedGraph) {
  uint32_t seed = 900;
  for (const Spec& s : dropout_specs()) {
    Inputs in = make_inputs(s, seed += 10);
    Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, seed + 5);
    ir::Graph g = unfused_with_loss(s, in, W);
    autodiff::GradientOptions opts;
    opts.trainable = {"Q", "K", "V"};
    auto tg = autodiff::build_training_graph(g, {}, opts);
    runtime::Session sess(tg.graph, {"Q", "K", "V"});
    auto ro = training_run(77);
    auto res = sess.run({}, ro);
    std::map<std::string, Tensor> ref;
    for (auto& [p, gname] : tg.gradients) ref[p] = res.at(gname);
    auto fwd = fused_forward(s, in, ro);
    auto grads =
        run_node(attention_node(s, true), 1,
                 {W, in.Q, in.K, in.V, s.mask != Mask::None ? in.mask : Tensor(), fwd[1]}, ro);
    expect_close(grads[0], ref.at("Q"), 2e-4, spec_name(s) + " dQ");
    expect_close(grads[1], ref.at("K"), 2e-4, spec_name(s) + " dK");
    expect_close(grads[2], ref.at("V"), 2e-4, spec_name(s) + " dV");
  }
}

// Finite differences through the rule (onyx.Attention → autodiff → onyx.AttentionGrad): for a fixed
// run seed the mask is fixed, so loss(Q, K, V) is smooth and central differences apply.
TEST(AttentionDropout, GradientMatchesFiniteDifferencesForAFixedSeed) {
  for (bool causal : {false, true}) {
    Spec s;
    s.B = 2, s.Tq = s.Tk = 6, s.H = 2, s.D = 3, s.Dv = 3, s.dropout = 0.4f, s.causal = causal;
    if (causal) s.H = 4, s.Hk = 2;  // grouped-query heads: dK, dV sum over two query heads
    s.mask = causal ? Mask::None : Mask::Padding;
    Inputs in = make_inputs(s, 51);
    Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, 52);
    auto g = std::make_shared<ir::Graph>();
    g->opsets[""] = 17;
    g->add_initializer("Q", in.Q);
    g->add_initializer("K", in.K);
    g->add_initializer("V", in.V);
    g->add_initializer("W", W);
    if (s.mask != Mask::None) g->add_initializer("mask", in.mask);
    ir::Node att = attention_node(s, false);
    att.outputs = {"O"};
    g->nodes.push_back(att);
    ir::Node mul, sum;
    mul.name = "mul", mul.op_type = "Mul", mul.inputs = {"O", "W"}, mul.outputs = {"ow"};
    sum.name = "sum", sum.op_type = "ReduceSum", sum.inputs = {"ow"}, sum.outputs = {"loss"};
    sum.attrs["keepdims"] = int_attr(0);
    g->nodes.push_back(mul);
    g->nodes.push_back(sum);
    ir::ValueInfo lo;
    lo.name = "loss";
    lo.dtype = DType::Float32;
    g->outputs.push_back(lo);
    autodiff::GradientOptions opts;
    opts.trainable = {"Q", "K", "V"};
    auto tg = autodiff::build_training_graph(*g, {}, opts);
    auto ro = training_run(2024);
    runtime::Session ts(tg.graph, {"Q", "K", "V"});
    auto res = ts.run({}, ro);
    auto loss_at = [&](const std::string& name, const Tensor& t) {
      runtime::Session fs(g, {"Q", "K", "V"});
      return fs.run({{name, t}}, ro).at("loss").get_as_double(0);
    };
    int checked = 0;
    for (auto& [param, gname] : tg.gradients) {
      const Tensor& grad = res.at(gname);
      Tensor x = g->initializers.at(param);
      for (int64_t k = 0; k < x.numel(); k += 5) {
        Tensor xp = x.clone(), xm = x.clone();
        const float eps = 1e-2f;
        xp.data<float>()[k] += eps;
        xm.data<float>()[k] -= eps;
        double numeric = (loss_at(param, xp) - loss_at(param, xm)) / (2.0 * eps);
        EXPECT_NEAR(grad.get_as_double(k), numeric, 2e-3 + 2e-2 * std::fabs(numeric))
            << (causal ? "causal " : "") << "d loss / d " << param << "[" << k << "]";
        checked++;
      }
    }
    EXPECT_GT(checked, 20);
  }
}

// Same run seed: the same bits, whatever the thread count; another run seed: another mask.
TEST(AttentionDropout, SameBitsForASeedAndAnyThreadCount) {
  Spec s;
  s.B = 3, s.Tq = s.Tk = 100, s.H = 3, s.D = 16, s.Dv = 16, s.mask = Mask::Padding, s.causal = true;
  s.dropout = 0.1f;
  Inputs in = make_inputs(s, 9);
  Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, 3);
  int saved = runtime::num_threads();
  std::vector<std::vector<Tensor>> outs;
  for (int t : {1, 2, 3, 2}) {
    runtime::set_num_threads(t);
    auto ro = training_run(42);
    auto f = fused_forward(s, in, ro);
    auto g = run_node(attention_node(s, true), 1, {W, in.Q, in.K, in.V, in.mask, f[1]}, ro);
    outs.push_back({f[0], f[1], g[0], g[1], g[2]});
  }
  auto other = fused_forward(s, in, training_run(43));
  runtime::set_num_threads(saved);
  for (size_t r = 1; r < outs.size(); r++)
    for (size_t i = 0; i < outs[0].size(); i++)
      EXPECT_TRUE(same_bits(outs[0][i], outs[r][i])) << "output " << i << ", run " << r;
  EXPECT_FALSE(same_bits(other[0], outs[0][0]));
}

// AttentionGrad cannot redraw the forward's mask without the forward's identity.
TEST(AttentionDropout, GradWithoutRngKeyIsAnError) {
  Spec s;
  s.dropout = 0.2f;
  Inputs in = make_inputs(s, 4);
  auto ro = training_run(1);
  auto f = fused_forward(s, in, ro);
  ir::Node n = attention_node(s, true);
  n.attrs.erase("rng_key");
  Tensor W = random_tensor({s.B, s.Tq, s.H * s.Dv}, 3);
  try {
    run_node(n, 1, {W, in.Q, in.K, in.V, Tensor(), f[1]}, ro);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rng_key"), std::string::npos) << e.what();
  }
}
