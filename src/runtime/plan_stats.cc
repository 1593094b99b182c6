// plan_stats.cc — see plan_stats.h. One FLOP formula per GEMM-like op; ops not listed count 0.
#include "runtime/plan_stats.h"

namespace onyx::runtime {
namespace {

double prod(const Shape& s, size_t from = 0, size_t to = SIZE_MAX) {
  double p = 1;
  for (size_t i = from; i < std::min(to, s.size()); i++) p *= (double)s[i];
  return p;
}

}  // namespace

FlopCount count_flops(const ir::Graph& g, const Plan& plan) {
  FlopCount fc;
  auto meta = [&](const std::string& v) -> const TensorMeta* {
    auto it = plan.metas.find(v);
    return v.empty() || it == plan.metas.end() ? nullptr : &it->second;
  };
  for (auto& step : plan.steps) {
    const ir::Node& n = g.nodes[step.node];
    const std::string op = n.domain.empty() ? n.op_type : n.domain + "." + n.op_type;
    const TensorMeta* a = n.inputs.empty() ? nullptr : meta(n.inputs[0]);
    const TensorMeta* b = n.inputs.size() > 1 ? meta(n.inputs[1]) : nullptr;
    const TensorMeta* y = n.outputs.empty() ? nullptr : meta(n.outputs[0]);
    if (!a || !y) continue;
    const Shape& as = a->shape;
    double f = 0;
    if (op == "MatMul" && !as.empty()) {
      f = 2 * prod(y->shape) * (double)as.back();
    } else if ((op == "onyx.MatMulT" || op == "Gemm") && as.size() >= 2) {
      bool ta = n.attr_int("transA", 0) != 0;
      f = 2 * prod(y->shape) * (double)(ta ? as[as.size() - 2] : as.back());
    } else if (op == "onyx.MatMulGradB" && !as.empty()) {
      f = 2 * prod(as) * (double)y->shape.back();  // (K,N) = A(R,K)^T dY(R,N): 2·R·K·N
    } else if (op == "Conv" && b && b->shape.size() >= 2) {
      f = 2 * prod(y->shape) * prod(b->shape, 1);  // per output: C/group · kernel
    } else if (op == "onyx.ConvGradInput" && b && b->shape.size() >= 2) {
      f = 2 * prod(as) * prod(b->shape, 1);  // dY (N,M,out...) against W (M,C/g,k...)
    } else if (op == "onyx.ConvGradWeight" && b) {
      f = 2 * prod(y->shape) * prod(as) / std::max<double>(1, (double)y->shape[0]);
    } else if (op == "onyx.Attention" && as.size() == 3 && b) {
      // Q (B,T,C), K (B,S,C): S = Q·Kᵀ and O = P·V, 2·B·T·S·C each
      f = 4 * prod(as) * (double)b->shape[1];
    } else if (op == "onyx.AttentionGrad" && n.inputs.size() > 2) {
      const TensorMeta* q = meta(n.inputs[1]);
      const TensorMeta* k = meta(n.inputs[2]);
      // S = Q·Kᵀ again (P is recomputed from the saved log-sum-exp), dP = dO·Vᵀ, dV = Pᵀ·dO,
      // dQ = dS·K, dK = dSᵀ·Q: five GEMMs of 2·B·T·S·C (causal masking skips none of the count)
      if (q && k && q->shape.size() == 3) f = 10 * prod(q->shape) * (double)k->shape[1];
    } else if (op == "onyx.LinearCrossEntropy" && b && as.size() == 2 && b->shape.size() == 2) {
      // logits, dH and dW: three (N × V × C) GEMMs
      double v = n.attr_int("transB", 1) ? (double)b->shape[0] : (double)b->shape[1];
      f = 6 * (double)as[0] * (double)as[1] * v;
    }
    if (f > 0) {
      fc.total += f;
      fc.by_op[op] += f;
    }
  }
  return fc;
}

double peak_live_bytes(const ir::Graph& g, const Plan& plan, const std::set<std::string>& exclude) {
  std::map<std::string, double> live;
  double cur = 0, peak = 0;
  for (auto& st : plan.steps) {
    const ir::Node& n = g.nodes[st.node];
    for (auto& o : n.outputs) {
      auto m = plan.metas.find(o);
      if (o.empty() || exclude.count(o) || m == plan.metas.end()) continue;
      double b = (double)m->second.numel() * (double)dtype_size(m->second.dtype);
      live[o] = b;
      cur += b;
    }
    peak = std::max(peak, cur);
    for (auto& f : st.free_after) {
      auto it = live.find(f);
      if (it == live.end()) continue;
      cur -= it->second;
      live.erase(it);
    }
  }
  return peak;
}

}  // namespace onyx::runtime
