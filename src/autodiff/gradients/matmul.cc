// matmul.cc — gradient rules for MatMul, Gemm and Conv.
//
// MatMul (numpy semantics): 1-D operands are promoted to (1,K) / (K,1), dY gets the dropped dims
// back, and the promoted gradients are reduced over broadcast batch dims and reshaped back.
//   dA = dY · B^T  → onyx MatMulT(dY, B, transB=1): with a 2-D B this is ONE GEMM over every row
//   dB = A^T · dY  → onyx MatMulGradB(A, dY) when B has no batch (a weight): ONE GEMM over B·T rows
//                    with transA; else onyx MatMulT(A, dY, transA=1) per batch, then reduced.
// Gemm: the transposes become Gemm flags of the emitted Gemms (no Transpose nodes); dC = beta·dY.
// onyx MatMulT(A, B, bias?) (the Linear layers of passes/linear_fusion.cc): Y = alpha·op(A)·op(B)
//   + bias. dA and dB are MatMulTs with flags; when B is one matrix (a weight), dB is ONE
//   MatMulGradB GEMM over every leading row (transB: dW = dY^T·X = MatMulGradB(dY, X)); the bias
//   gradient is dY summed over every leading dim (onyx BiasGrad, a column-sum kernel).
// Conv: onyx ConvGradInput / ConvGradWeight (im2col + GEMM, kernels/conv/conv.cc) with auto_pad
// resolved to explicit pads here; the bias gradient is ReduceSum over N and the spatial dims.
#include "autodiff/gradient.h"

namespace onyx::autodiff {
namespace {

// Contributes `g` (computed for the 1-D-promoted operand, shape `promoted`, possibly with extra
// broadcast batch dims) to input i.
void finish(GradContext& c, int i, std::string g, const Shape& promoted) {
  const Shape& gs = c.meta(g).shape;
  if (gs != promoted) {
    // Same element count: only size-1 dims differ (e.g. (K,N) for a (1,K,N) operand).
    if (shape_numel(gs) == shape_numel(promoted))
      g = c.reshape(g, promoted);
    else
      g = c.reduce_to_shape(g, gs, promoted);
  }
  c.set(i, c.reshape(g, c.meta(c.I(i)).shape));
}

int64_t batch_numel(const Shape& s) {  // elements of the dims before the last two
  int64_t n = 1;
  for (size_t i = 0; i + 2 < s.size(); i++) n *= s[i];
  return n;
}

void matmul_rule(GradContext& c) {
  std::string dy = c.GO(0);
  Shape a = c.meta(c.I(0)).shape, b = c.meta(c.I(1)).shape, y = c.meta(c.O(0)).shape;
  bool av = a.size() == 1, bv = b.size() == 1;
  int64_t K = a.back();
  Shape a2 = av ? Shape{1, K} : a;
  Shape b2 = bv ? Shape{K, 1} : b;
  int64_t M = a2[a2.size() - 2], N = b2.back();
  Shape y2(y.begin(), y.end() - (av ? 0 : 1) - (bv ? 0 : 1));
  y2.push_back(M);
  y2.push_back(N);
  std::string dy2 = c.reshape(dy, y2);
  if (c.needs(0)) {
    std::string B2 = c.reshape(c.I(1), b2);
    finish(c, 0, c.emit1("MatMulT", {dy2, B2}, {{"transB", attr_i(1)}}, "onyx"), a2);
  }
  if (c.needs(1)) {
    std::string A2 = c.reshape(c.I(0), a2);
    std::string g = batch_numel(b2) == 1
                        ? c.emit1("MatMulGradB", {A2, dy2}, {}, "onyx")
                        : c.emit1("MatMulT", {A2, dy2}, {{"transA", attr_i(1)}}, "onyx");
    finish(c, 1, g, b2);
  }
}

// Y = alpha · op(A) · op(B) + beta · C. With op(X)^T folded into flags:
//   dA = alpha · dY · op(B)^T   (transA = 0)      dA = alpha · op(B) · dY^T   (transA = 1)
//   dB = alpha · op(A)^T · dY   (transB = 0)      dB = alpha · dY^T · op(A)   (transB = 1)
void gemm_rule(GradContext& c) {
  const ir::Node& n = c.node();
  bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  float alpha = n.attr_float("alpha", 1.f), beta = n.attr_float("beta", 1.f);
  std::string dy = c.GO(0);
  auto gemm = [&](const std::string& x, bool tx, const std::string& z, bool tz) {
    std::map<std::string, ir::Attribute> at{{"transA", attr_i(tx)}, {"transB", attr_i(tz)}};
    if (alpha != 1.f) at["alpha"] = attr_f(alpha);
    return c.emit1("Gemm", {x, z}, at);
  };
  std::string A = c.I(0), B = c.I(1);
  if (c.needs(0)) {
    // op(B)^T is B^T when !tb (flag 1 on B), B itself when tb (flag 0).
    c.set(0, ta ? gemm(B, tb, dy, true) : gemm(dy, false, B, !tb));
  }
  if (c.needs(1)) c.set(1, tb ? gemm(dy, true, A, ta) : gemm(A, !ta, dy, false));
  if (c.needs(2)) {
    // The usual Linear bias, C (N) or (1,N): one ReduceSum straight to C's shape; other
    // broadcasts are reduced by GradContext::set. beta scales the reduced (smaller) tensor.
    const Shape& cs = c.meta(c.I(2)).shape;
    const Shape& ys = c.meta(dy).shape;
    std::string g = dy;
    if ((cs.size() == 1 || (cs.size() == 2 && cs[0] == 1 && ys[0] != 1)) && cs.back() == ys[1])
      g = c.reduce_sum(dy, {0}, cs.size() == 2);
    if (beta != 1.f) g = c.emit1("Mul", {g, c.const_scalar(beta, c.meta(g).dtype)});
    c.set(2, g);
  }
}

// onyx MatMulT: Y (...,M,N) = alpha · op(A) · op(B) + bias, op(X) = X or X^T (last two dims).
//   dA = alpha · dY · op(B)^T   (transA = 0)      dA = alpha · op(B) · dY^T   (transA = 1)
//   dB = alpha · op(A)^T · dY   (transB = 0)      dB = alpha · dY^T · op(A)   (transB = 1)
// Each product is one MatMulT with flags (op(B)^T is B with the flag flipped). The results have
// the broadcast batch shape; GradContext::set sums them down to the operand's own batch dims.
void matmul_t_rule(GradContext& c) {
  // Read everything from the node first: emitting nodes may reallocate the graph's node list.
  const bool ta = c.node().attr_int("transA", 0) != 0, tb = c.node().attr_int("transB", 0) != 0;
  const float alpha = c.node().attr_float("alpha", 1.f);
  const bool has_bias = c.num_inputs() > 2 && !c.I(2).empty();
  std::string dy = c.GO(0);  // (...,M,N)
  std::string A = c.I(0), B = c.I(1);
  auto mmt = [&](const std::string& x, bool tx, const std::string& z, bool tz) {
    std::map<std::string, ir::Attribute> at;
    if (tx) at["transA"] = attr_i(1);
    if (tz) at["transB"] = attr_i(1);
    if (alpha != 1.f) at["alpha"] = attr_f(alpha);
    return c.emit1("MatMulT", {x, z}, at, "onyx");
  };
  // Contributes g to input i: a reshape when only size-1 dims differ, else a batch reduction.
  auto give = [&](int i, const std::string& g) {
    const Shape& want = c.meta(c.I(i)).shape;
    if (c.meta(g).shape != want && shape_numel(c.meta(g).shape) == shape_numel(want))
      return c.set(i, c.reshape(g, want));
    c.set(i, g);
  };
  if (c.needs(0)) give(0, ta ? mmt(B, tb, dy, true) : mmt(dy, false, B, !tb));
  if (c.needs(1)) {
    const Shape& bs = c.meta(B).shape;
    const Shape& as = c.meta(A).shape;
    if (batch_numel(bs) == 1 && !ta && batch_numel(as) == batch_numel(c.meta(dy).shape)) {
      // One weight matrix: ONE GEMM over every leading row of A and dY.
      std::map<std::string, ir::Attribute> at;
      if (alpha != 1.f) at["alpha"] = attr_f(alpha);
      give(1, tb ? c.emit1("MatMulGradB", {dy, A}, at, "onyx")    // (N,K) = dY^T · A
                 : c.emit1("MatMulGradB", {A, dy}, at, "onyx"));  // (K,N) = A^T · dY
    } else {
      give(1, tb ? mmt(dy, true, A, ta) : mmt(A, !ta, dy, false));
    }
  }
  if (has_bias && c.needs(2)) {
    // bias (N): dY summed over every leading dim, one streaming column-sum kernel.
    c.set(2, c.emit1("BiasGrad", {dy}, {}, "onyx"));
  }
}

// Explicit begin/end pads of a Conv (auto_pad resolved the way the forward kernel does).
std::vector<int64_t> conv_pads(GradContext& c, const Shape& x, const Shape& w) {
  const ir::Node& n = c.node();
  int nsp = (int)x.size() - 2;
  auto st = n.attr_ints("strides", std::vector<int64_t>(nsp, 1));
  auto dl = n.attr_ints("dilations", std::vector<int64_t>(nsp, 1));
  auto pads = n.attr_ints("pads", std::vector<int64_t>(2 * nsp, 0));
  std::string ap = n.attr_string("auto_pad", "NOTSET");
  if (ap == "NOTSET" || ap.empty()) return pads;
  std::vector<int64_t> out(2 * nsp, 0);
  if (ap == "VALID") return out;
  ONYX_CHECK(ap == "SAME_UPPER" || ap == "SAME_LOWER", n.describe(), ": auto_pad '", ap, "'");
  for (int i = 0; i < nsp; i++) {
    int64_t in = x[2 + i], ek = (w[2 + i] - 1) * dl[i] + 1;
    int64_t o = (in + st[i] - 1) / st[i];
    int64_t total = std::max<int64_t>(0, (o - 1) * st[i] + ek - in);
    int64_t small = total / 2;
    out[i] = ap == "SAME_UPPER" ? small : total - small;
    out[i + nsp] = total - out[i];
  }
  return out;
}

void conv_rule(GradContext& c) {
  const ir::Node& n = c.node();
  std::string dy = c.GO(0);
  Shape x = c.meta(c.I(0)).shape, w = c.meta(c.I(1)).shape;
  int nsp = (int)x.size() - 2;
  std::map<std::string, ir::Attribute> at{
      {"strides", attr_ints(n.attr_ints("strides", std::vector<int64_t>(nsp, 1)))},
      {"dilations", attr_ints(n.attr_ints("dilations", std::vector<int64_t>(nsp, 1)))},
      {"pads", attr_ints(conv_pads(c, x, w))},
      {"group", attr_i(n.attr_int("group", 1))}};
  if (c.needs(0)) {
    auto a = at;
    a["input_shape"] = attr_ints(x);
    c.set(0, c.emit1("ConvGradInput", {dy, c.I(1)}, a, "onyx"));
  }
  if (c.needs(1)) {
    auto a = at;
    a["kernel_shape"] = attr_ints(Shape(w.begin() + 2, w.end()));
    c.set(1, c.emit1("ConvGradWeight", {dy, c.I(0)}, a, "onyx"));
  }
  if (c.needs(2)) {
    std::vector<int64_t> axes{0};
    for (int i = 0; i < nsp; i++) axes.push_back(2 + i);
    c.set(2, c.reduce_sum(dy, axes, false));
  }
}

}  // namespace

ONYX_REGISTER_GRADIENTS(matmul) {
  r.add("", "MatMul", matmul_rule);
  r.add("", "Gemm", gemm_rule);
  r.add("", "Conv", conv_rule);
  r.add("onyx", "MatMulT", matmul_t_rule);
}

}  // namespace onyx::autodiff
