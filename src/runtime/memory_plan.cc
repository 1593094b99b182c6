// memory_plan.cc — arena offsets from lifetimes (DESIGN decision 4). Hand-written: the packing is
// a few dozen lines of interval placement, and the graph layer encodes onyx's own rules (graph
// outputs off the arena, view ops alias, declared in-place kernels reuse a dying input's slot).
#include "runtime/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "runtime/session.h"

namespace onyx::runtime {

// ---- packing ---------------------------------------------------------------------------------

namespace {

bool lifetimes_intersect(const BufferRequest& a, const BufferRequest& b) {
  return a.first <= b.last && b.first <= a.last;
}

struct Placed {
  size_t offset, bytes;
};

// Placed buffers whose lifetimes intersect `r`, sorted by offset.
std::vector<Placed> conflicts(const std::vector<BufferRequest>& reqs, const std::vector<int>& done,
                              const std::vector<size_t>& offsets, const BufferRequest& r) {
  std::vector<Placed> c;
  for (int j : done)
    if (reqs[j].bytes && lifetimes_intersect(reqs[j], r)) c.push_back({offsets[j], reqs[j].bytes});
  std::sort(c.begin(), c.end(),
            [](const Placed& a, const Placed& b) { return a.offset < b.offset; });
  return c;
}

}  // namespace

Packing pack_buffers(const std::vector<BufferRequest>& reqs, PackStrategy strategy) {
  const int n = (int)reqs.size();
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (strategy == PackStrategy::GreedyBySize)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return reqs[a].bytes != reqs[b].bytes ? reqs[a].bytes > reqs[b].bytes
                                            : reqs[a].first < reqs[b].first;
    });
  else
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return reqs[a].first != reqs[b].first ? reqs[a].first < reqs[b].first
                                            : reqs[a].bytes > reqs[b].bytes;
    });
  Packing p;
  p.offsets.assign(n, 0);
  std::vector<int> done;
  done.reserve(n);
  for (int i : order) {
    const BufferRequest& r = reqs[i];
    if (r.bytes == 0) continue;  // occupies nothing; offset 0
    std::vector<Placed> c = conflicts(reqs, done, p.offsets, r);
    size_t chosen = 0;
    if (strategy == PackStrategy::GreedyBySize) {
      // Lowest offset where r fits between the conflicting buffers.
      size_t cand = 0;
      for (auto& q : c) {
        if (cand + r.bytes <= q.offset) break;
        cand = std::max(cand, q.offset + q.bytes);
      }
      chosen = cand;
    } else {
      // Smallest gap that holds r; above every conflicting buffer when none does.
      size_t top = 0, best_gap = SIZE_MAX;
      bool found = false;
      for (auto& q : c) {
        if (q.offset > top && q.offset - top >= r.bytes && q.offset - top < best_gap) {
          best_gap = q.offset - top;
          chosen = top;
          found = true;
        }
        top = std::max(top, q.offset + q.bytes);
      }
      if (!found) chosen = top;
    }
    p.offsets[i] = chosen;
    p.arena_bytes = std::max(p.arena_bytes, chosen + r.bytes);
    done.push_back(i);
  }
  return p;
}

size_t live_peak_bytes(const std::vector<BufferRequest>& reqs, int* peak_step) {
  int steps = 0;
  for (auto& r : reqs) steps = std::max(steps, r.last + 1);
  std::vector<int64_t> delta(steps + 1, 0);
  for (auto& r : reqs) {
    delta[r.first] += (int64_t)r.bytes;
    delta[r.last + 1] -= (int64_t)r.bytes;
  }
  int64_t live = 0, best = 0;
  int at = -1;
  for (int s = 0; s < steps; s++) {
    live += delta[s];
    if (live > best) {
      best = live;
      at = s;
    }
  }
  if (peak_step) *peak_step = at;
  return (size_t)best;
}

std::string MemoryPlan::summary(const std::set<std::string>& bound) const {
  auto mib = [](size_t b) { return b / (1024.0 * 1024.0); };
  size_t bound_bytes = 0;
  for (auto& [name, bytes] : heap_outputs)
    if (bound.count(name)) bound_bytes += bytes;
  char outputs[160];
  if (bound.empty())
    std::snprintf(outputs, sizeof outputs,
                  "graph outputs %.1f MiB (heap, or caller storage when bound)",
                  mib(heap_output_bytes));
  else
    std::snprintf(outputs, sizeof outputs,
                  "graph outputs %.1f MiB on the heap (%.1f MiB more bound to caller storage)",
                  mib(heap_output_bytes - bound_bytes), mib(bound_bytes));
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "planned peak %.1f MiB: arena %.1f MiB (live peak %.1f MiB at step %d; kept for "
                "backward %.1f MiB; %s) + %s; %zu in-place, %zu views, %zu dynamic values on the "
                "heap",
                mib(planned_peak_bytes - bound_bytes), mib(arena_bytes), mib(live_peak_bytes),
                peak_step, mib(kept_bytes), strategy.c_str(), outputs, inplace_of.size(),
                alias_of.size(), heap_dynamic_values);
  return buf;
}

// ---- the graph layer -------------------------------------------------------------------------

namespace {

// Ops whose output is the input's bytes under another shape: a view, never a copy.
bool is_view_op(const ir::Node& n) { return op_traits(n).view; }

bool fixed_size(DType t) {
  try {
    dtype_size(t);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

void plan_memory(const ir::Graph& g, Plan& plan, const std::set<std::string>& graph_outputs) {
  MemoryPlan& mp = plan.memory;
  mp = MemoryPlan{};
  const int nsteps = (int)plan.steps.size();

  // Last reader of every value; graph outputs live to the end.
  std::unordered_map<std::string, int> last_use;
  for (int s = 0; s < nsteps; s++)
    for (auto& in : g.nodes[plan.steps[s].node].inputs)
      if (!in.empty()) last_use[in] = s;
  for (auto& o : graph_outputs) last_use[o] = nsteps;
  auto last_of = [&](const std::string& v, int def) {
    auto it = last_use.find(v);
    return it == last_use.end() ? def : std::max(def, it->second);
  };

  // Buffers: each arena value belongs to one; views and in-place outputs join their input's.
  std::vector<BufferRequest> bufs;
  std::unordered_map<std::string, int> buffer_of;
  int loss_step = -1;
  for (int s = 0; s < nsteps; s++) {
    PlanStep& step = plan.steps[s];
    const ir::Node& node = g.nodes[step.node];
    step.output_offsets.assign(node.outputs.size(), -1);
    step.alias = false;
    if (!g.outputs.empty())
      for (auto& o : node.outputs)
        if (o == g.outputs[0].name) loss_step = s;
    if (step.dynamic) {
      for (auto& o : node.outputs) mp.heap_dynamic_values += !o.empty();
      continue;
    }
    // A view: output 0 shares input 0's bytes (and extends its buffer's lifetime). Graph outputs
    // stay copies so that the caller never holds a view of a parameter or of the arena.
    if (is_view_op(node) && !node.inputs.empty() && !node.inputs[0].empty() &&
        node.outputs.size() == 1 && !graph_outputs.count(node.outputs[0]) &&
        plan.metas.count(node.inputs[0]) &&
        plan.metas.at(node.inputs[0]).dtype == step.output_metas[0].dtype &&
        plan.metas.at(node.inputs[0]).numel() == step.output_metas[0].numel()) {
      const std::string& in = node.inputs[0];
      const std::string& out = node.outputs[0];
      step.alias = true;
      mp.alias_of[out] = in;
      auto b = buffer_of.find(in);
      if (b != buffer_of.end()) {
        buffer_of[out] = b->second;
        bufs[b->second].last = std::max(bufs[b->second].last, last_of(out, s));
      }
      continue;
    }
    std::vector<int> taken;  // buffers already reused in place by an output of this step
    for (size_t i = 0; i < node.outputs.size(); i++) {
      const std::string& out = node.outputs[i];
      if (out.empty()) continue;
      const TensorMeta& m = step.output_metas[i];
      if (!fixed_size(m.dtype)) continue;  // stays on the heap
      size_t bytes = arena_round((size_t)m.numel() * dtype_size(m.dtype));
      if (graph_outputs.count(out)) {
        mp.heap_output_bytes += bytes;
        mp.heap_outputs[out] += bytes;
        continue;
      }
      int buf = -1;
      for (auto [oi, j] : step.kernel->inplace) {
        if (oi != (int)i || j >= (int)node.inputs.size() || node.inputs[j].empty()) continue;
        auto b = buffer_of.find(node.inputs[j]);
        if (b == buffer_of.end()) continue;  // not an arena value (input, parameter, constant...)
        int r = b->second;
        if (bufs[r].last != s || bufs[r].bytes != bytes || bufs[r].first >= s) continue;
        // Element i of the output over element i of the input: same element count and size
        // (a broadcast operand, e.g. (B,1) under (B,C), or float under bool, has fewer elements
        // and would be overwritten before it is read).
        auto im = plan.metas.find(node.inputs[j]);
        if (im == plan.metas.end() || !fixed_size(im->second.dtype) ||
            im->second.numel() != m.numel() || dtype_size(im->second.dtype) != dtype_size(m.dtype))
          continue;
        if (std::find(taken.begin(), taken.end(), r) != taken.end()) continue;
        // The same bytes read through another input too (x*x, GeluGrad(dy, x) with x viewing
        // dy): a kernel may read that input after writing the output, so no in-place.
        bool shared = false;
        for (size_t k = 0; k < node.inputs.size(); k++) {
          if ((int)k == j || node.inputs[k].empty()) continue;
          auto bk = buffer_of.find(node.inputs[k]);
          if (bk != buffer_of.end() && bk->second == r) shared = true;
        }
        if (shared) continue;
        buf = r;
        mp.inplace_of[out] = node.inputs[j];
        break;
      }
      if (buf >= 0) {
        taken.push_back(buf);
        bufs[buf].last = std::max(bufs[buf].last, last_of(out, s));
      } else {
        buf = (int)bufs.size();
        bufs.push_back({bytes, s, last_of(out, s)});
      }
      buffer_of[out] = buf;
    }
  }

  // Pack both ways and keep the smaller arena.
  Packing a = pack_buffers(bufs, PackStrategy::GreedyBySize);
  Packing b = pack_buffers(bufs, PackStrategy::BestFitInOrder);
  const bool use_a = a.arena_bytes <= b.arena_bytes;
  const Packing& p = use_a ? a : b;
  mp.strategy = use_a ? "greedy by size" : "best fit in order";
  mp.arena_bytes = p.arena_bytes;
  mp.live_peak_bytes = live_peak_bytes(bufs, &mp.peak_step);
  mp.planned_peak_bytes = mp.arena_bytes + mp.heap_output_bytes;
  for (auto& r : bufs)
    if (loss_step >= 0 && r.first <= loss_step && r.last > loss_step) mp.kept_bytes += r.bytes;
  for (auto& [name, buf] : buffer_of) mp.offset[name] = p.offsets[buf];
  // ONYX_PLAN_DUMP=1: the buffers live at the peak step, largest first (stderr), each with the
  // values it holds in turn (in-place writes over it): producer op, value, dtype.
  static const bool dump = std::getenv("ONYX_PLAN_DUMP") != nullptr;
  if (dump && mp.live_peak_bytes > (1 << 20)) {
    std::vector<std::pair<size_t, std::string>> rows;
    std::unordered_map<int, std::string> root_name;
    for (int s = 0; s < nsteps; s++)
      for (auto& o : g.nodes[plan.steps[s].node].outputs) {
        auto it = buffer_of.find(o);
        if (it == buffer_of.end()) continue;
        auto m = plan.metas.find(o);
        std::string& r = root_name[it->second];
        r += (r.empty() ? "" : " | ") + g.nodes[plan.steps[s].node].op_type + " " + o +
             (m != plan.metas.end() ? std::string(" ") + dtype_name(m->second.dtype) : "");
      }
    for (size_t r = 0; r < bufs.size(); r++)
      if (bufs[r].first <= mp.peak_step && bufs[r].last >= mp.peak_step)
        rows.push_back({bufs[r].bytes, std::to_string(bufs[r].first) + ".." +
                                           std::to_string(bufs[r].last) + " " + root_name[r]});
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "live at step %d (%s):\n", mp.peak_step,
                 g.nodes[plan.steps[mp.peak_step].node].op_type.c_str());
    for (auto& [b, n] : rows) std::fprintf(stderr, "  %10.3f MiB  %s\n", b / 1048576.0, n.c_str());
  }
  for (auto& step : plan.steps) {
    if (step.dynamic || step.alias) continue;
    const ir::Node& node = g.nodes[step.node];
    for (size_t i = 0; i < node.outputs.size(); i++) {
      auto it = mp.offset.find(node.outputs[i]);
      if (!node.outputs[i].empty() && it != mp.offset.end())
        step.output_offsets[i] = (int64_t)it->second;
    }
  }
}

}  // namespace onyx::runtime
