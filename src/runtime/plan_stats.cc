// plan_stats.cc — see plan_stats.h. FLOPs come from each op's OpTraits::flops (declared where
// its kernel registers); ops without one count 0.
#include "runtime/plan_stats.h"

namespace onyx::runtime {

FlopCount count_flops(const ir::Graph& g, const Plan& plan) {
  FlopCount fc;
  auto meta = [&](const std::string& v) -> const TensorMeta* {
    auto it = plan.metas.find(v);
    return v.empty() || it == plan.metas.end() ? nullptr : &it->second;
  };
  for (auto& step : plan.steps) {
    const ir::Node& n = g.nodes[step.node];
    const OpTraits& t = op_traits(n);
    if (!t.flops) continue;
    std::vector<const TensorMeta*> in, out;
    for (auto& v : n.inputs) in.push_back(meta(v));
    for (auto& v : n.outputs) out.push_back(meta(v));
    if (in.empty() || out.empty()) continue;
    double f = t.flops(n, in, out);
    if (f > 0) {
      fc.total += f;
      fc.by_op[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type] += f;
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
