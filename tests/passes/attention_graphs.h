// attention_graphs.h — builds the unfused multi-head attention subgraph the way PyTorch's opset-14
// export writes it (Reshape → Transpose → MatMul → scale → mask → Softmax → MatMul → Transpose →
// Reshape), for the fused-attention kernel test (tests/kernels/test_attention.cc) and the pass test
// (tests/passes/test_attention_fusion.cc). Hand-written test scaffolding; the variants cover what
// attention_fusion.cc claims to match (scale placement, mask kinds, causal Where, K transposes,
// grouped-query K/V heads repeated as Transformers' repeat_kv).
#pragma once
#include <cfloat>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onyx/tensor.h"

namespace onyx::attn_test {

enum class Mask { None, Padding, Full };  // Padding: (B,1,1,Tk); Full: (B,H,Tq,Tk)
enum class Scale { DivAfter, MulAfter, MulOnQ, MulOnBoth };
enum class KLayout { Perm0231, DoubleTranspose };

struct Spec {
  int64_t B = 2, Tq = 5, Tk = 5, H = 2, D = 4, Dv = 4;
  Mask mask = Mask::None;
  bool causal = false;
  Scale scale = Scale::DivAfter;
  KLayout k = KLayout::Perm0231;
  bool projections = false;  // Q/K/V = x·W + b from one input x (B,Tq,E) (self-attention)
  int64_t E = 8;
  float dropout = 0;  // > 0: Dropout(p, dropout, training_mode=true) named kDropoutOut before P·V
  // The dynamo exporter's SDPA: P = Where(IsNaN(P), 0, P) after the Softmax, and a padding mask of
  // -inf whose last batch hides every key (those rows' softmax is NaN, the Where makes them 0).
  bool nan_guard = false;
  // > 0: grouped-query attention, K and V at Hk heads, each repeated for H / Hk query heads by
  // Unsqueeze → Expand → Reshape after the head transpose (K then takes the DoubleTranspose form).
  int64_t Hk = 0;
  int64_t kv_heads() const { return Hk > 0 ? Hk : H; }
};

// The attention-dropout node's output name (the rng identity a fused op must carry).
inline const char* kDropoutOut = "attn_dropout_out";

inline ir::Attribute ints_attr(std::vector<int64_t> v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Ints;
  a.ints = std::move(v);
  return a;
}
inline ir::Attribute int_attr(int64_t v) {
  ir::Attribute a;
  a.kind = ir::Attribute::Kind::Int;
  a.i = v;
  return a;
}

inline Tensor random_tensor(Shape s, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(shape_numel(s));
  for (auto& x : v) x = d(g);
  return Tensor::from_vector(DType::Float32, s, v);
}

struct Builder {
  ir::Graph g;
  int n = 0;
  std::string add(const std::string& op, std::vector<std::string> in,
                  std::map<std::string, ir::Attribute> attrs = {}) {
    ir::Node nd;
    nd.name = op + "_" + std::to_string(n++);
    nd.op_type = op;
    nd.inputs = std::move(in);
    nd.outputs = {nd.name + "_out"};
    nd.attrs = std::move(attrs);
    g.nodes.push_back(nd);
    return nd.outputs[0];
  }
  std::string i64(const std::string& name, std::vector<int64_t> v) {
    g.add_initializer(name, Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)v.size()}, v));
    return name;
  }
  std::string f32(const std::string& name, float v) {
    g.add_initializer(name, Tensor::scalar_f32(v));
    return name;
  }
  void input(const std::string& name, Shape s) {
    ir::ValueInfo vi;
    vi.name = name;
    vi.dtype = DType::Float32;
    vi.shape = s;
    vi.has_shape = true;
    g.inputs.push_back(vi);
  }
};

// The graph: inputs Q (B,Tq,H·D), K (B,Tk,Hk·D), V (B,Tk,Hk·Dv) [, mask] — or x (B,Tq,E) with
// projection weights Wq/Wk/Wv (variables) and biases when `projections` — and output "out"
// (B,Tq,H·Dv). Every value is float32.
inline ir::Graph unfused_attention(const Spec& s) {
  Builder b;
  b.g.name = "attention";
  b.g.opsets[""] = 14;
  const int64_t Hk = s.kv_heads(), C = s.H * s.D, Ck = Hk * s.D, Cv = s.H * s.Dv, Ckv = Hk * s.Dv;
  std::string Q = "Q", K = "K", V = "V";
  if (s.projections) {
    b.input("x", {s.B, s.Tq, s.E});
    auto proj = [&](const char* w, int64_t out, uint32_t seed) {
      b.g.add_initializer(std::string(w) + ".weight", random_tensor({s.E, out}, seed));
      b.g.add_initializer(std::string(w) + ".bias", random_tensor({out}, seed + 1));
      std::string mm = b.add("MatMul", {"x", std::string(w) + ".weight"});
      return b.add("Add", {std::string(w) + ".bias", mm});
    };
    Q = proj("q", C, 11);
    K = proj("k", Ck, 21);
    V = proj("v", Ckv, 31);
  } else {
    b.input("Q", {s.B, s.Tq, C});
    b.input("K", {s.B, s.Tk, Ck});
    b.input("V", {s.B, s.Tk, Ckv});
  }
  std::string qs = b.i64("q_shape", {s.B, s.Tq, s.H, s.D});
  std::string ks = b.i64("k_shape", {s.B, s.Tk, Hk, s.D});
  std::string vs = b.i64("v_shape", {s.B, s.Tk, Hk, s.Dv});
  // repeat_kv: (B,Hk,Tk,d) -> (B,H,Tk,d)
  auto repeat = [&](const std::string& x, int64_t d, const char* tag) {
    if (Hk == s.H) return x;
    std::string u = b.add("Unsqueeze", {x, b.i64(std::string(tag) + "_axis", {2})});
    std::string e =
        b.add("Expand", {u, b.i64(std::string(tag) + "_5d", {s.B, Hk, s.H / Hk, s.Tk, d})});
    return b.add("Reshape", {e, b.i64(std::string(tag) + "_4d", {s.B, s.H, s.Tk, d})});
  };
  std::string q =
      b.add("Transpose", {b.add("Reshape", {Q, qs})}, {{"perm", ints_attr({0, 2, 1, 3})}});
  std::string k4 = b.add("Reshape", {K, ks});
  std::string kT;
  if (s.k == KLayout::Perm0231 && Hk == s.H) {
    kT = b.add("Transpose", {k4}, {{"perm", ints_attr({0, 2, 3, 1})}});
  } else {
    std::string k = b.add("Transpose", {k4}, {{"perm", ints_attr({0, 2, 1, 3})}});
    kT = b.add("Transpose", {repeat(k, s.D, "k_rep")}, {{"perm", ints_attr({0, 1, 3, 2})}});
  }
  std::string v =
      repeat(b.add("Transpose", {b.add("Reshape", {V, vs})}, {{"perm", ints_attr({0, 2, 1, 3})}}),
             s.Dv, "v_rep");
  float inv = 1.0f / std::sqrt((float)s.D);
  if (s.scale == Scale::MulOnQ) q = b.add("Mul", {q, b.f32("scale_q", inv)});
  if (s.scale == Scale::MulOnBoth) {
    float r = std::sqrt(inv);
    q = b.add("Mul", {q, b.f32("scale_q", r)});
    kT = b.add("Mul", {b.f32("scale_k", r), kT});
  }
  std::string sc = b.add("MatMul", {q, kT});
  if (s.scale == Scale::DivAfter) sc = b.add("Div", {sc, b.f32("sqrt_d", std::sqrt((float)s.D))});
  if (s.scale == Scale::MulAfter) sc = b.add("Mul", {sc, b.f32("inv_sqrt_d", inv)});
  if (s.mask != Mask::None) {
    Shape ms = s.mask == Mask::Padding ? Shape{s.B, 1, 1, s.Tk} : Shape{s.B, s.H, s.Tq, s.Tk};
    b.input("mask", ms);
    sc = b.add("Add", {sc, "mask"});
  }
  if (s.causal) {
    std::vector<uint8_t> upper(s.Tq * s.Tk);
    for (int64_t i = 0; i < s.Tq; i++)
      for (int64_t j = 0; j < s.Tk; j++) upper[i * s.Tk + j] = j > i;
    b.g.add_initializer("causal_cond",
                        Tensor::from_vector<uint8_t>(DType::Bool, {s.Tq, s.Tk}, upper));
    sc = b.add("Where", {"causal_cond", b.f32("neg_fill", -FLT_MAX), sc});
  }
  std::string p = b.add("Softmax", {sc}, {{"axis", int_attr(-1)}});
  if (s.nan_guard) p = b.add("Where", {b.add("IsNaN", {p}), b.f32("nan_fill", 0.0f), p});
  if (s.dropout > 0) {
    b.g.add_initializer("attn_dropout_ratio", Tensor::scalar_f32(s.dropout));
    b.g.add_initializer("attn_dropout_training",
                        Tensor::from_vector<uint8_t>(DType::Bool, {}, {1}));
    ir::Node d;
    d.name = "attn_dropout";
    d.op_type = "Dropout";
    d.inputs = {p, "attn_dropout_ratio", "attn_dropout_training"};
    d.outputs = {kDropoutOut};
    b.g.nodes.push_back(d);
    p = kDropoutOut;
  }
  std::string o = b.add("MatMul", {p, v});
  std::string ot = b.add("Transpose", {o}, {{"perm", ints_attr({0, 2, 1, 3})}});
  std::string out = b.add("Reshape", {ot, b.i64("out_shape", {s.B, s.Tq, Cv})});
  ir::Node id;
  id.name = "to_out";
  id.op_type = "Identity";
  id.inputs = {out};
  id.outputs = {"out"};
  b.g.nodes.push_back(id);
  ir::ValueInfo vo;
  vo.name = "out";
  vo.dtype = DType::Float32;
  b.g.outputs.push_back(vo);
  return b.g;
}

// Padding masks as BERT builds them: 0 for kept keys, -10000 for the last `pad` keys of batch b>0.
inline Tensor padding_mask(const Spec& s) {
  Shape ms = s.mask == Mask::Padding ? Shape{s.B, 1, 1, s.Tk} : Shape{s.B, s.H, s.Tq, s.Tk};
  Tensor m =
      s.mask == Mask::Full ? random_tensor(ms, 77, -3, 0) : Tensor::zeros(DType::Float32, ms);
  if (s.mask == Mask::Padding)
    for (int64_t b = 1; b < s.B; b++)
      for (int64_t j = s.Tk - std::min<int64_t>(b, s.Tk - 1); j < s.Tk; j++)
        m.data<float>()[b * s.Tk + j] = s.nan_guard ? -INFINITY : -10000.0f;
  if (s.mask == Mask::Padding && s.nan_guard)  // the last batch: every key hidden
    for (int64_t j = 0; j < s.Tk; j++) m.data<float>()[(s.B - 1) * s.Tk + j] = -INFINITY;
  return m;
}

}  // namespace onyx::attn_test
