// session.cc — planner (order, constant folding, static shape inference, lifetimes, memory plan)
// and executor (kernels over the session's arena; view ops as views).
#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <unordered_set>

namespace onyx::runtime {
namespace {

// ONYX_PROFILE=1: time every executed node by op type; the table prints at exit (stderr).
// ONYX_PROFILE=shapes: by op type, input shapes and attributes (which GEMM shapes cost what).
struct OpProfile {
  bool enabled = std::getenv("ONYX_PROFILE") != nullptr;
  bool by_shape = enabled && std::string(std::getenv("ONYX_PROFILE")) == "shapes";
  std::mutex mu;
  std::map<std::string, std::pair<double, int64_t>> by_op;  // seconds, calls
  ~OpProfile() {
    if (!enabled || by_op.empty()) return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto& [op, v] : by_op) {
      rows.push_back({v.first, op});
      total += v.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "onyx profile: %.3f s in kernels\n", total);
    for (auto& [t, op] : rows)
      std::fprintf(stderr, "  %-32s %9.3f s %5.1f%% %8lld calls\n", op.c_str(), t, 100 * t / total,
                   (long long)by_op[op].second);
  }
};
OpProfile g_profile;

// Inputs of which an op reads only the meta (OpTraits::meta_only_inputs: Shape's, Size's,
// CastLike's target). Such a node folds when its other inputs are constants and these inputs'
// metas are static: the dynamo exporter writes every masking fill as CastLike(constant, scores).
bool meta_only_input(const ir::Node& n, size_t i) {
  const auto& m = op_traits(n).meta_only_inputs;
  return std::find(m.begin(), m.end(), (int)i) != m.end();
}

std::string input_shapes(const std::vector<const TensorMeta*>& metas) {
  std::string s;
  for (size_t i = 0; i < metas.size(); i++) {
    s += i ? ", " : "";
    s += metas[i] ? cat(dtype_name(metas[i]->dtype), shape_str(metas[i]->shape)) : "absent";
  }
  return s;
}

[[noreturn]] void rethrow_with_context(const ir::Node& node, int64_t opset,
                                       const std::vector<const TensorMeta*>& metas,
                                       const Error& e) {
  std::string prefix = node.describe();
  std::string msg = e.what();
  // Kernels usually start their message with the node's description already.
  if (msg.rfind(prefix, 0) != 0) msg = prefix + ": " + msg;
  msg += cat(" [opset ", opset, "; inputs: ", input_shapes(metas), "]");
  if (dynamic_cast<const Unsupported*>(&e)) throw Unsupported(msg);
  throw Error(msg);
}

std::vector<Tensor> infer_and_compute(const ir::Node& node, const OpKernel& k, int64_t opset,
                                      const std::vector<const Tensor*>& in,
                                      const std::vector<bool>& want_output,
                                      const RunOptions& opts) {
  std::vector<TensorMeta> in_metas(in.size());
  std::vector<const TensorMeta*> meta_ptrs;
  for (size_t i = 0; i < in.size(); i++) {
    if (in[i]) in_metas[i] = in[i]->meta();
    meta_ptrs.push_back(in[i] ? &in_metas[i] : nullptr);
  }
  std::vector<TensorMeta> out_metas;
  try {
    out_metas = infer_node(k, node, opset, meta_ptrs, in);
  } catch (NeedValue&) {
    throw Error(cat(node.describe(), ": infer needs a value that is not available"));
  }
  std::vector<Tensor> out(node.outputs.size());
  KernelContext kc{node, opset, in, {}, opts.seed, opts.training};
  kc.bf16_gemm = opts.bf16_gemm;
  kc.fp16_gemm = opts.fp16_gemm && !opts.bf16_gemm;
  for (size_t i = 0; i < node.outputs.size(); i++) {
    if (want_output[i]) {
      ONYX_CHECK(out_metas[i].dtype != DType::Undefined, node.describe(), ": output ", i,
                 " was not inferred");
      out[i] = Tensor(out_metas[i].dtype, out_metas[i].shape);
      kc.outputs.push_back(&out[i]);
    } else {
      kc.outputs.push_back(nullptr);
    }
  }
  k.compute(kc);
  return out;
}

}  // namespace

bool never_fold(const ir::Node& n) {
  const OpTraits& t = op_traits(n);
  return t.random || t.side_effects;
}

std::vector<Tensor> run_node(const ir::Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                             const RunOptions& opts) {
  const OpKernel* k = KernelRegistry::instance().find(node.domain, node.op_type);
  if (!k) ONYX_UNSUPPORTED(node.describe(), ": no kernel for op '", node.op_type, "'");
  std::vector<const Tensor*> in;
  for (auto& t : inputs) in.push_back(t.defined() ? &t : nullptr);
  std::vector<bool> want(node.outputs.size());
  for (size_t i = 0; i < node.outputs.size(); i++) want[i] = !node.outputs[i].empty();
  std::vector<const TensorMeta*> metas;
  std::vector<TensorMeta> ms(in.size());
  for (size_t i = 0; i < in.size(); i++) {
    if (in[i]) ms[i] = in[i]->meta();
    metas.push_back(in[i] ? &ms[i] : nullptr);
  }
  try {
    return infer_and_compute(node, *k, opset, in, want, opts);
  } catch (const Error& e) {
    rethrow_with_context(node, opset, metas, e);
  }
}

Session::Session(std::shared_ptr<const ir::Graph> graph, std::set<std::string> parameters)
    : graph_(std::move(graph)), parameters_(std::move(parameters)) {
  order_ = ir::topological_order(*graph_);
  const char* mp = std::getenv("ONYX_MEMORY_PLAN");  // ONYX_MEMORY_PLAN=0: heap per value
  memory_planning_ = !(mp && std::string(mp) == "0");
  for (auto& p : parameters_)
    ONYX_CHECK(graph_->initializers.count(p), "parameter '", p, "' is not an initializer");
}

void Session::check_supported() const {
  auto& reg = KernelRegistry::instance();
  for (auto& n : graph_->nodes)
    if (!reg.find(n.domain, n.op_type))
      ONYX_UNSUPPORTED(n.describe(), ": unknown op '", n.domain.empty() ? "" : n.domain + ".",
                       n.op_type, "' (opset ", graph_->opset(n.domain),
                       "): onyx has no kernel for it");
}

static std::string signature_key(const std::map<std::string, TensorMeta>& sig) {
  std::string k;
  for (auto& [name, m] : sig) k += cat(name, ":", (int)m.dtype, shape_str(m.shape), ";");
  return k;
}

const Plan& Session::plan_for(const std::map<std::string, TensorMeta>& signature) {
  std::string key = signature_key(signature);
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  check_supported();
  const ir::Graph& g = *graph_;
  auto plan = std::make_unique<Plan>();
  auto& reg = KernelRegistry::instance();
  for (auto& [name, t] : g.initializers) {
    if (!parameters_.count(name)) plan->constants[name] = t;
    plan->metas[name] = t.meta();
  }
  for (auto& [name, m] : signature) plan->metas[name] = m;

  std::set<std::string> graph_outputs;
  for (auto& o : g.outputs) graph_outputs.insert(o.name);

  for (int idx : order_) {
    const ir::Node& node = g.nodes[idx];
    const OpKernel* k = reg.find(node.domain, node.op_type);
    int64_t opset = g.opset(node.domain);
    std::vector<const TensorMeta*> metas;
    std::vector<const Tensor*> values;
    bool all_meta = true, all_const = true, known = true;  // known: const, or meta where enough
    for (size_t i = 0; i < node.inputs.size(); i++) {
      const std::string& in = node.inputs[i];
      if (in.empty()) {
        metas.push_back(nullptr);
        values.push_back(nullptr);
        continue;
      }
      auto m = plan->metas.find(in);
      auto c = plan->constants.find(in);
      metas.push_back(m == plan->metas.end() ? nullptr : &m->second);
      values.push_back(c == plan->constants.end() ? nullptr : &c->second);
      if (m == plan->metas.end()) all_meta = false;
      if (c == plan->constants.end()) all_const = false;
      if (c == plan->constants.end() && !(m != plan->metas.end() && meta_only_input(node, i)))
        known = false;
    }
    bool foldable = !never_fold(node) && (all_const || known);
    // Folding: run the node now, keep its outputs as constants.
    if (foldable) {
      std::vector<Tensor> meta_tensors;  // Shape/Size read only shapes: wrap metas without data
      std::vector<const Tensor*> in = values;
      if (!all_const) {
        meta_tensors.resize(metas.size());
        for (size_t i = 0; i < metas.size(); i++)
          if (metas[i] && !values[i]) {
            meta_tensors[i] = Tensor::wrap(metas[i]->dtype, metas[i]->shape, nullptr, nullptr);
            in[i] = &meta_tensors[i];
          }
      }
      std::vector<bool> want(node.outputs.size());
      for (size_t i = 0; i < node.outputs.size(); i++) want[i] = !node.outputs[i].empty();
      std::vector<Tensor> outs;
      try {
        outs = infer_and_compute(node, *k, opset, in, want, {});
      } catch (const Error& e) {
        rethrow_with_context(node, opset, metas, e);
      }
      for (size_t i = 0; i < outs.size(); i++)
        if (want[i]) {
          plan->constants[node.outputs[i]] = outs[i];
          plan->metas[node.outputs[i]] = outs[i].meta();
        }
      plan->folded_nodes++;
      continue;
    }
    PlanStep step{idx, k, true, {}, {}};
    if (all_meta) {
      try {
        step.output_metas = infer_node(*k, node, opset, metas, values);
        step.dynamic = false;
        for (size_t i = 0; i < node.outputs.size(); i++)
          if (!node.outputs[i].empty()) plan->metas[node.outputs[i]] = step.output_metas[i];
      } catch (NeedValue&) {
        step.dynamic = true;
      } catch (const Error& e) {
        rethrow_with_context(node, opset, metas, e);
      }
    }
    plan->steps.push_back(std::move(step));
  }

  // Lifetimes: a value is freed after the last step that reads it, unless it is a graph output
  // or a constant.
  std::unordered_map<std::string, int> last_use;
  for (int s = 0; s < (int)plan->steps.size(); s++)
    for (auto& in : g.nodes[plan->steps[s].node].inputs)
      if (!in.empty()) last_use[in] = s;
  for (auto& [name, s] : last_use)
    if (!graph_outputs.count(name) && !plan->constants.count(name))
      plan->steps[s].free_after.push_back(name);
  if (memory_planning_) plan_memory(g, *plan, graph_outputs);

  auto& ref = *plan;
  plans_[key] = std::move(plan);
  return ref;
}

namespace {

// The declared shape as a user reads it: [2, seq, ?].
std::string declared_shape(const ir::ValueInfo& vi) {
  std::string want = "[";
  for (size_t i = 0; i < vi.shape.size(); i++)
    want +=
        (i ? ", " : "") + (vi.shape[i] >= 0 ? std::to_string(vi.shape[i])
                                            : (vi.dim_params[i].empty() ? "?" : vi.dim_params[i]));
  return want + "]";
}

void check_declared_shape(const std::string& name, const ir::ValueInfo& vi, const Tensor& t) {
  bool ok = vi.shape.size() == t.shape().size();
  for (size_t i = 0; ok && i < vi.shape.size(); i++)
    if (vi.shape[i] >= 0 && vi.shape[i] != t.shape()[i]) ok = false;
  if (!ok)
    throw Error(cat("input '", name, "' has shape ", shape_str(t.shape()),
                    " but the model expects ", declared_shape(vi)));
}

// Runs the kernel; under ONYX_PROFILE, timed into the profile table.
void compute_profiled(const OpKernel& kernel, KernelContext& kc,
                      const std::vector<const TensorMeta*>& meta_ptrs) {
  if (!g_profile.enabled) {
    kernel.compute(kc);
    return;
  }
  const ir::Node& node = kc.node;
  auto t0 = std::chrono::steady_clock::now();
  kernel.compute(kc);
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string key = (node.domain.empty() ? "" : node.domain + ".") + node.op_type;
  if (g_profile.by_shape) {
    key += " " + input_shapes(meta_ptrs);
    for (auto& [name, a] : node.attrs)
      if (a.kind == ir::Attribute::Kind::Int) key += cat(" ", name, "=", a.i);
  }
  std::lock_guard<std::mutex> lock(g_profile.mu);
  auto& e = g_profile.by_op[key];
  e.first += dt;
  e.second++;
}

}  // namespace

// A run's values by name: the inputs, the parameters and what the steps produced so far, then the
// plan's constants.
struct Session::RunValues {
  std::unordered_map<std::string, Tensor> values;
  const Plan& plan;
  const Tensor* lookup(const std::string& n) const {
    auto it = values.find(n);
    if (it != values.end()) return &it->second;
    auto c = plan.constants.find(n);
    if (c != plan.constants.end()) return &c->second;
    return nullptr;
  }
};

// Checks every given input against the model (a parameter's replacement against its initializer)
// and returns the signature that picks the plan.
std::map<std::string, TensorMeta> Session::signature(const std::map<std::string, Tensor>& inputs,
                                                     const RunOptions& opts) const {
  const ir::Graph& g = *graph_;
  std::map<std::string, TensorMeta> sig;
  for (auto& [name, t] : inputs) {
    const ir::ValueInfo* vi = g.find_input(name);
    if (!vi) {
      check_parameter(name, t);
      continue;
    }
    ONYX_CHECK(vi->dtype == DType::Undefined || vi->dtype == t.dtype(), "input '", name,
               "' has dtype ", dtype_name(t.dtype()), " but the model expects ",
               dtype_name(vi->dtype));
    if (vi->has_shape && opts.check_declared_shapes) check_declared_shape(name, *vi, t);
    sig[name] = t.meta();
  }
  for (auto& v : g.inputs)
    ONYX_CHECK(inputs.count(v.name), "input '", v.name, "' (", dtype_name(v.dtype), ") is missing");
  return sig;
}

// A run's value for `name`, which is not a graph input: it must be a parameter, with its meta.
void Session::check_parameter(const std::string& name, const Tensor& t) const {
  const ir::Graph& g = *graph_;
  if (parameters_.count(name)) {
    const Tensor& init = g.initializers.at(name);
    ONYX_CHECK(t.meta() == init.meta(), "parameter '", name, "' is given as ",
               dtype_name(t.dtype()), shape_str(t.shape()), " but the model has ",
               dtype_name(init.dtype()), shape_str(init.shape()));
    return;
  }
  ONYX_CHECK(!g.is_initializer(name), "input '", name, "' names an initializer of the model, ",
             "which is a constant here and cannot be replaced");
  std::string known;
  for (auto& v : g.inputs) known += (known.empty() ? "" : ", ") + v.name;
  throw Error(cat("input '", name, "' is not an input of the model (inputs: ", known, ")"));
}

// The arena grows once per larger plan, then is reused.
void Session::reserve_arena(const Plan& plan) {
  if (g_profile.enabled && reported_.insert(&plan).second && plan.memory.arena_bytes > (1 << 20))
    std::fprintf(stderr, "onyx plan (%zu steps): %s\n", plan.steps.size(),
                 plan.memory.summary().c_str());
  if (plan.memory.arena_bytes <= arena_bytes_) return;
  arena_.reset();
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kArenaAlignment, plan.memory.arena_bytes));
  ONYX_CHECK(p != nullptr, "out of memory allocating the ", plan.memory.arena_bytes,
             "-byte activation arena");
  arena_ = std::shared_ptr<uint8_t>(p, [](uint8_t* q) { std::free(q); });
  arena_bytes_ = plan.memory.arena_bytes;
}

std::map<std::string, Tensor> Session::run(const std::map<std::string, Tensor>& inputs,
                                           const RunOptions& opts) {
  const Plan& plan = plan_for(signature(inputs, opts));
  reserve_arena(plan);
  RunValues rv{{}, plan};
  for (auto& [name, t] : inputs) rv.values[name] = t;
  for (auto& p : parameters_)
    if (!rv.values.count(p)) rv.values[p] = graph_->initializers.at(p);
  for (auto& step : plan.steps) run_step(step, rv, opts);
  return collect_outputs(rv);
}

void Session::run_step(const PlanStep& step, RunValues& rv, const RunOptions& opts) {
  const ir::Node& node = graph_->nodes[step.node];
  // A view op: output 0 is input 0 under another shape (unless it must land in bound storage).
  if (step.alias && !opts.bound_outputs.count(node.outputs[0])) {
    const Tensor* x = rv.lookup(node.inputs[0]);
    ONYX_CHECK(x, node.describe(), ": input '", node.inputs[0], "' has no value");
    rv.values[node.outputs[0]] = x->reshaped(step.output_metas[0].shape);
    for (auto& name : step.free_after) rv.values.erase(name);
    return;
  }
  const int64_t opset = graph_->opset(node.domain);
  std::vector<const Tensor*> in;
  std::vector<TensorMeta> in_metas(node.inputs.size());
  std::vector<const TensorMeta*> meta_ptrs;
  for (size_t i = 0; i < node.inputs.size(); i++) {
    const Tensor* t = node.inputs[i].empty() ? nullptr : rv.lookup(node.inputs[i]);
    ONYX_CHECK(node.inputs[i].empty() || t, node.describe(), ": input '", node.inputs[i],
               "' has no value");
    in.push_back(t);
    if (t) in_metas[i] = t->meta();
    meta_ptrs.push_back(t ? &in_metas[i] : nullptr);
  }
  try {
    std::vector<TensorMeta> out_metas;
    if (step.dynamic) {
      try {
        out_metas = infer_node(*step.kernel, node, opset, meta_ptrs, in);
      } catch (NeedValue&) {
        throw Error("shape inference needs a value that is not available");
      }
    }
    KernelContext kc{node, opset, in, {}, opts.seed, opts.training};
    kc.bf16_gemm = opts.bf16_gemm;
    kc.fp16_gemm = opts.fp16_gemm && !opts.bf16_gemm;
    std::vector<Tensor> outs(node.outputs.size());
    allocate_outputs(step, step.dynamic ? out_metas : step.output_metas, opts, kc, outs);
    compute_profiled(*step.kernel, kc, meta_ptrs);
    for (size_t i = 0; i < node.outputs.size(); i++)
      if (!node.outputs[i].empty()) rv.values[node.outputs[i]] = std::move(outs[i]);
  } catch (const Error& e) {
    rethrow_with_context(node, opset, meta_ptrs, e);
  }
  if (opts.on_bound_output)
    for (auto& o : node.outputs)
      if (!o.empty() && opts.bound_outputs.count(o)) opts.on_bound_output(o);
  for (auto& name : step.free_after) rv.values.erase(name);
}

// The step's outputs, each in caller storage (bound; added into where the kernel and the run
// accumulate), at its planned arena offset, or freshly allocated; kc.outputs point to them.
void Session::allocate_outputs(const PlanStep& step, const std::vector<TensorMeta>& metas,
                               const RunOptions& opts, KernelContext& kc,
                               std::vector<Tensor>& outs) {
  const ir::Node& node = kc.node;
  for (size_t i = 0; i < node.outputs.size(); i++) {
    if (node.outputs[i].empty()) {
      kc.outputs.push_back(nullptr);
      continue;
    }
    ONYX_CHECK(metas[i].dtype != DType::Undefined, "output ", i, " was not inferred");
    auto bound = opts.bound_outputs.find(node.outputs[i]);
    if (bound != opts.bound_outputs.end()) {
      ONYX_CHECK(bound->second.meta() == metas[i], "bound output '", node.outputs[i], "' is ",
                 dtype_name(bound->second.dtype()), shape_str(bound->second.shape()),
                 " but the graph produces ", dtype_name(metas[i].dtype), shape_str(metas[i].shape));
      outs[i] = bound->second;
      kc.accumulate = opts.accumulate;
      const auto& acc = step.kernel->accumulate_outputs;
      // onyx_accumulate = 1 (passes/gradient_into_buffer.cc's tied gradients): this output adds
      // into its storage in every run
      const bool adds = opts.accumulate || node.attr_int("onyx_accumulate", 0) != 0;
      if (adds && std::find(acc.begin(), acc.end(), (int)i) != acc.end())
        kc.accumulate_mask |= uint64_t(1) << i;
    } else if (!step.dynamic && i < step.output_offsets.size() && step.output_offsets[i] >= 0) {
      outs[i] = Tensor::wrap(metas[i].dtype, metas[i].shape, arena_.get() + step.output_offsets[i],
                             arena_);
    } else {
      outs[i] = Tensor(metas[i].dtype, metas[i].shape);
    }
    kc.outputs.push_back(&outs[i]);
  }
}

std::map<std::string, Tensor> Session::collect_outputs(const RunValues& rv) const {
  std::map<std::string, Tensor> result;
  for (auto& o : graph_->outputs) {
    const Tensor* t = rv.lookup(o.name);
    ONYX_CHECK(t, "graph output '", o.name, "' was not produced");
    // The next run reuses the arena: what the caller keeps must not live there.
    const uint8_t* p = static_cast<const uint8_t*>(t->raw());
    bool in_arena = arena_ && p >= arena_.get() && p < arena_.get() + arena_bytes_;
    result[o.name] = in_arena ? t->clone() : *t;
  }
  return result;
}

}  // namespace onyx::runtime
