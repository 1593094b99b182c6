// runtime/plan_stats.h — what a planned step costs, before it runs: floating-point operations
// counted from the static shapes of its GEMM-like nodes (multiply-add = 2 FLOPs; elementwise,
// normalization and reduction work is memory bound and not counted, the same convention as the
// benchmark's analytic count), and the peak of bytes alive at once.
#pragma once
#include <map>
#include <set>
#include <string>

#include "ir/graph.h"
#include "runtime/session.h"

namespace onyx::runtime {

struct FlopCount {
  double total = 0;
  std::map<std::string, double> by_op;  // "MatMul", "onyx.MatMulT", ...
};

// Counts every planned step of `plan` (a plan of `g`).
FlopCount count_flops(const ir::Graph& g, const Plan& plan);

// Peak of the bytes alive at once when every value produced by a step is allocated when produced
// and freed after its last use: what any arena must hold at least. Values in `exclude` (e.g.
// gradients written into the flat buffer) are not counted.
double peak_live_bytes(const ir::Graph& g, const Plan& plan, const std::set<std::string>& exclude);

}  // namespace onyx::runtime
