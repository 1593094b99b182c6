// training_session.cc — builds/caches training graphs per signature and runs them over flat
// buffers.
#include "train/training_session.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "kernels/cpu/gemm.h"
#include "passes/inference_export.h"
#include "runtime/plan_stats.h"

namespace onyx::train {

TrainingSession::TrainingSession(std::shared_ptr<const ir::Graph> forward,
                                 autodiff::GradientOptions opts)
    : forward_(std::move(forward)), opts_(std::move(opts)) {
  kernels::check_gemm_environment();  // a bad ONYX_GEMM / ONYX_PREPACK fails here, not mid-run
  const char* env = std::getenv("ONYX_PASSES");  // ONYX_PASSES=0: no graph optimization
  optimize_ = !(env && std::string(env) == "0");
  std::vector<std::pair<std::string, Shape>> layout;
  params_ = autodiff::trainable_parameters(*forward_, opts_);
  ONYX_CHECK(!params_.empty(), "the model has no trainable parameter: no float initializer",
             opts_.frozen.empty() ? "" : " that is not frozen",
             opts_.trainable.empty() ? "" : " among the trainable names given",
             " (export the model with its weights as initializers, e.g. torch.onnx.export with "
             "export_params=True)");
  for (auto& p : params_) {
    const Tensor& t = forward_->initializers.at(p);
    ONYX_CHECK(t.dtype() == DType::Float32, "parameter '", p, "' is ", dtype_name(t.dtype()),
               ": training supports float32 parameters (mixed precision comes later)");
    layout.push_back({p, t.shape()});
  }
  opts_.trainable = params_;
  FlatLayout l = FlatLayout::of(layout);
  param_buf_ = FlatBuffer(l);
  grad_buf_ = FlatBuffer(l);
  for (auto& p : params_) {
    const Tensor& t = forward_->initializers.at(p);
    std::memcpy(param_buf_.view(p).raw(), t.raw(), t.nbytes());
  }
  std::set<std::string> trained(params_.begin(), params_.end());
  for (auto& b : autodiff::batch_norm_buffers(*forward_))
    if (!trained.count(b)) buffers_[b] = forward_->initializers.at(b).clone();
  // A damaged or diverged file trains "successfully" on NaN (loss 0 or NaN from step 1): the
  // parameters must be finite, and frozen weights free of NaN (an infinity can be a mask).
  for (auto& p : params_)
    check_finite(forward_->initializers.at(p), p, "the model's parameter", true);
  for (auto& f : opts_.frozen)
    if (auto it = forward_->initializers.find(f); it != forward_->initializers.end())
      check_finite(it->second, f, "the model's frozen weight", false);
  // Inputs that index an embedding table (Gather on axis 0 of a weight): PyTorch's embedding
  // refuses an id outside the table, where ONNX's Gather would count a negative one from the end.
  for (auto& n : forward_->nodes)
    if (n.op_type == "Gather" && n.domain.empty() && n.num_inputs() == 2 &&
        n.attr_int("axis", 0) == 0 && forward_->find_input(n.inputs[1]))
      if (auto it = forward_->initializers.find(n.inputs[0]);
          it != forward_->initializers.end() && it->second.rank() >= 1)
        embedding_inputs_[n.inputs[1]] = {n.inputs[0], it->second.dim(0)};
}

void TrainingSession::check_embedding_inputs(const std::map<std::string, Tensor>& batch) const {
  for (auto& [input, table] : embedding_inputs_) {
    auto it = batch.find(input);
    if (it == batch.end()) continue;
    const Tensor& ids = it->second;
    const int64_t row = ids.rank() ? ids.dim(-1) : 1;
    for (int64_t i = 0; i < ids.numel(); i++) {
      const int64_t id = (int64_t)ids.get_as_double(i);
      if (id < 0 || id >= table.second)
        throw Error(cat("input '", input, "' holds id ", id, " at row ", i / row, ", position ",
                        i % row, ": outside the embedding '", table.first, "' of ", table.second,
                        " rows (ids are 0..", table.second - 1, ")"));
    }
  }
}

void TrainingSession::check_finite(const Tensor& t, const std::string& name, const char* what,
                                   bool no_infinity) {
  if (t.dtype() != DType::Float32) return;
  const float* x = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; i++) {
    if (std::isnan(x[i]) || (no_infinity && std::isinf(x[i])))
      throw Error(cat(what, " '", name, "' holds ", x[i], " (element ", i, " of ", n,
                      "): weights must be finite to train (is the file damaged, or saved after "
                      "training diverged?)"));
  }
}

std::set<std::string> TrainingSession::variables() const {
  std::set<std::string> v(params_.begin(), params_.end());
  for (auto& [b, t] : buffers_) v.insert(b);
  // Frozen weights too: folded into constants they would be copied (a transposed LoRA base
  // weight, a second copy of a frozen embedding); as variables the kernels read them in place.
  for (auto& f : opts_.frozen)
    if (forward_->initializers.count(f)) v.insert(f);
  return v;
}

void TrainingSession::load_weights(const std::map<std::string, Tensor>& weights,
                                   const std::string& what) {
  auto copy = [&](const std::string& name, Tensor& dst) {
    auto it = weights.find(name);
    ONYX_CHECK(it != weights.end(), what, " has no tensor '", name, "'");
    ONYX_CHECK(it->second.meta() == dst.meta(), what, ": tensor '", name, "' is ",
               dtype_name(it->second.dtype()), shape_str(it->second.shape()), " but the model has ",
               dtype_name(dst.dtype()), shape_str(dst.shape()));
    std::memcpy(dst.raw(), it->second.raw(), dst.nbytes());
  };
  weights_may_change();
  for (auto& p : params_) copy(p, param_buf_.view(p));
  for (auto& [b, t] : buffers_) copy(b, t);
  for (auto& p : params_)
    check_finite(param_buf_.view(p), p, cat(what, ": parameter").c_str(), true);
}

TrainingSession::~TrainingSession() {
  kernels::forget_stable_weights(param_buf_.flat().raw(), param_buf_.flat().nbytes());
  if (shadow_.flat().defined())
    kernels::forget_stable_weights(shadow_.flat().raw(), shadow_.flat().nbytes());
}

void TrainingSession::weights_may_change() {
  shadow_fresh_ = rounded_fresh_ = false;
  params_version_ = 0;
  kernels::unstable_weights(param_buf_.flat().raw());
  shadow_may_change();
}

void TrainingSession::shadow_may_change() {
  shadow_version_ = 0;
  if (shadow_.flat().defined()) kernels::unstable_weights(shadow_.flat().raw());
}

void TrainingSession::declare_stable_params() {
  if (params_version_ == 0) params_version_ = kernels::new_weights_version();
  kernels::declare_stable_weights(param_buf_.flat().raw(), param_buf_.flat().nbytes(),
                                  params_version_);
}

std::vector<std::pair<std::string, std::string>> TrainingSession::expose_running_stats(
    ir::Graph& g) const {
  std::vector<std::pair<std::string, std::string>> r;
  if (buffers_.empty() || g.opset("") < 14) return r;
  auto training_bn = [](const ir::Node& n) {
    return n.op_type == "BatchNormalization" && (n.domain.empty() || n.domain == "ai.onnx") &&
           n.attr_int("training_mode", 0) != 0;
  };
  std::map<std::string, int> uses;
  std::set<std::string> names;
  for (auto& n : g.nodes) {
    for (auto& o : n.outputs) names.insert(o);
    if (!training_bn(n)) continue;
    for (size_t k = 3; k <= 4 && k < n.inputs.size(); k++)
      if (buffers_.count(n.inputs[k])) uses[n.inputs[k]]++;
  }
  for (auto& [b, count] : uses) {
    if (count == 1) continue;
    static std::set<std::string> warned;
    if (warned.insert(b).second)
      std::cerr << "onyx: warning: running statistic '" << b << "' is read by " << count
                << " training-mode BatchNormalizations; it is not updated by training\n";
  }
  for (auto& n : g.nodes) {
    if (!training_bn(n)) continue;
    for (size_t k = 3; k <= 4 && k < n.inputs.size(); k++) {
      const std::string& b = n.inputs[k];
      if (!buffers_.count(b) || uses[b] != 1) continue;
      size_t o = k - 2;  // input_mean -> running_mean (1), input_var -> running_var (2)
      if (n.outputs.size() <= o) n.outputs.resize(o + 1);
      if (n.outputs[o].empty()) {
        std::string name = b + "/updated";
        while (names.count(name) || g.initializers.count(name)) name += "_";
        names.insert(name);
        n.outputs[o] = name;
      }
      ir::ValueInfo vi;
      vi.name = n.outputs[o];
      vi.dtype = buffers_.at(b).dtype();
      g.outputs.push_back(vi);
      r.push_back({n.outputs[o], b});
      if (unbiased_var_) n.attrs["onyx_unbiased_var"] = autodiff::attr_i(1);
    }
  }
  return r;
}

static std::string batch_key(const std::map<std::string, Tensor>& batch) {
  std::string k;
  for (auto& [n, t] : batch) k += cat(n, ":", (int)t.dtype(), shape_str(t.shape()), ";");
  return k;
}

TrainingSession::Compiled& TrainingSession::compiled_for(
    const std::map<std::string, Tensor>& batch) {
  std::string key = batch_key(batch);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second;
  auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, TensorMeta> sig;
  for (auto& [n, t] : batch) sig[n] = t.meta();
  Compiled c;
  // forward + loss → passes (fold, eliminate, fuse) → autodiff → recompute → passes on the whole
  std::set<std::string> vars = variables();
  autodiff::LossGraph lg = autodiff::build_loss_graph(*forward_, opts_, sig);
  ir::Graph fwd = *lg.graph;
  fwd.outputs.resize(1);  // the loss, then the updated running statistics and logged values
  for (auto& name : opts_.keep_outputs)
    for (auto& o : lg.graph->outputs)
      if (o.name == name) fwd.outputs.push_back(o);
  c.stat_outputs = expose_running_stats(fwd);
  passes::OptimizeOptions po = pass_opts_;
  if (po.bf16) po.bf16_weights.insert(params_.begin(), params_.end());
  if (optimize_) fwd = passes::optimize_forward(fwd, sig, vars, po, &c.report);
  autodiff::GradientOptions go = opts_;
  go.loss = autodiff::LossSpec{};
  go.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
  go.loss.output = lg.loss;
  go.trainable = params_;
  for (auto& [out, b] : c.stat_outputs) go.keep_outputs.push_back(out);
  c.tg = autodiff::build_training_graph(fwd, sig, go);
  if (pass_opts_.recompute) {
    passes::RecomputeStats st;
    passes::recompute_layers(*c.tg.graph, (int)fwd.nodes.size(), &st);
    c.report.stats.push_back({"recompute_layers", st.nodes_cloned});
    c.report.recomputed_layers = st.layers;
  }
  if (optimize_) passes::optimize_training(*c.tg.graph, sig, vars, po, &c.report);
  for (auto& p : params_)
    if (c.tg.graph->find_input(passes::bf16_weight_input(p))) c.shadowed.push_back(p);
  if (!c.shadowed.empty()) allocate_shadow();
  c.session = std::make_unique<runtime::Session>(c.tg.graph, vars);
  {  // which gradients are final as soon as they are written
    std::map<std::string, int> produced, read;
    for (auto& n : c.tg.graph->nodes) {
      for (auto& o : n.outputs) produced[o]++;
      for (auto& i : n.inputs) read[i]++;
    }
    std::set<std::string> outputs;
    for (auto& o : c.tg.graph->outputs) outputs.insert(o.name);
    for (auto& [p, g] : c.tg.gradients) {
      // a tied weight's second contribution is added later through its alias
      const bool tied = outputs.count(passes::tied_gradient_output(g)) != 0;
      if (tied) c.tied.push_back({p, g});
      if (produced[g] == 1 && read[g] == 0 && !tied) {
        c.timing.early.push_back(p);
        c.param_of_grad[g] = p;
      } else {
        c.timing.late.push_back(p);
      }
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  last_build_ms_ = std::chrono::duration<double, std::milli>(t1 - t0).count();
  return graphs_.emplace(key, std::move(c)).first->second;
}

const runtime::Plan& TrainingSession::plan_for(const std::map<std::string, Tensor>& batch) {
  Compiled& c = compiled_for(batch);
  std::map<std::string, TensorMeta> sig;
  for (auto& [n, t] : batch)
    if (c.tg.graph->find_input(n)) sig[n] = t.meta();
  for (auto& p : c.shadowed) sig[passes::bf16_weight_input(p)] = shadow_.view(p).meta();
  return c.session->plan_for(sig);
}

std::map<std::string, Tensor> TrainingSession::feeds_for(
    const Compiled& c, const std::map<std::string, Tensor>& batch) {
  std::map<std::string, Tensor> feeds;
  for (auto& [n, t] : batch)
    if (c.tg.graph->find_input(n)) feeds[n] = t;
  for (auto& p : params_) feeds[p] = param_buf_.view(p);
  declare_stable_params();
  for (auto& [b, t] : buffers_) feeds[b] = t;
  feed_shadow(c.shadowed, feeds);
  return feeds;
}

void TrainingSession::allocate_shadow() {
  if (shadow_.flat().defined()) return;
  FlatLayout l = param_buf_.layout();
  l.dtype = DType::BFloat16;
  shadow_ = FlatBuffer(l);
  shadow_fresh_ = false;
}

void TrainingSession::feed_shadow(const std::vector<std::string>& shadowed,
                                  std::map<std::string, Tensor>& feeds) {
  if (shadowed.empty()) return;
  allocate_shadow();
  if (!shadow_fresh_) {  // one rounding pass, as the optimizer's would have written it
    kernels::f32_to_bf16(param_buf_.flat().data<float>(), shadow_.flat().data<uint16_t>(),
                         param_buf_.layout().numel);
    shadow_fresh_ = true;
    shadow_version_ = 0;
  }
  if (shadow_version_ == 0) shadow_version_ = kernels::new_weights_version();
  kernels::declare_stable_weights(shadow_.flat().raw(), shadow_.flat().nbytes(), shadow_version_);
  for (auto& p : shadowed) feeds[passes::bf16_weight_input(p)] = shadow_.view(p);
}

double TrainingSession::planned_activation_bytes(const std::map<std::string, Tensor>& batch) {
  const runtime::Plan& plan = plan_for(batch);
  if (plan.memory.arena_bytes > 0) return (double)plan.memory.arena_bytes;
  // No arena (ONYX_MEMORY_PLAN=0): what a fresh allocation per value keeps alive at most.
  const Compiled& c = compiled_for(batch);
  const autodiff::TrainingGraph& tg = c.tg;
  std::set<std::string> bound;
  for (auto& [p, g] : tg.gradients) bound.insert(g);
  for (auto& [p, g] : c.tied) bound.insert(passes::tied_gradient_output(g));
  return runtime::peak_live_bytes(*tg.graph, plan, bound);
}

double TrainingSession::planned_step_bytes(const std::map<std::string, Tensor>& batch,
                                           int optimizer_buffers) {
  double params = (double)param_buf_.flat().nbytes();
  const double act = planned_activation_bytes(batch);  // (allocates the shadow if it is read)
  const double shadow = shadow_.flat().defined() ? (double)shadow_.flat().nbytes() : 0;
  // the weights that are not trained (LoRA's base, frozen layers: float32, bf16 or 4-bit) and
  // the model's constants, held as they are stored
  const std::set<std::string> trained(params_.begin(), params_.end());
  double held = 0;
  for (auto& [name, t] : forward_->initializers)
    if (!trained.count(name)) held += (double)t.nbytes();
  return act + (2 + optimizer_buffers) * params + shadow + held;
}

const TrainingSession::GradientTiming& TrainingSession::gradient_timing(
    const std::map<std::string, Tensor>& batch) {
  return compiled_for(batch).timing;
}

const autodiff::TrainingGraph& TrainingSession::training_graph_for(
    const std::map<std::string, Tensor>& batch) {
  return compiled_for(batch).tg;
}

double TrainingSession::forward_backward(
    const std::map<std::string, Tensor>& batch, bool accumulate, uint64_t seed, bool training,
    FlatBuffer* into, const std::function<void(const std::string&)>& on_grad_ready,
    std::map<std::string, double>* kept) {
  check_embedding_inputs(batch);
  Compiled& c = compiled_for(batch);
  std::map<std::string, Tensor> feeds = feeds_for(c, batch);
  runtime::RunOptions ro;
  ro.seed = seed;
  ro.training = training;
  ro.accumulate = accumulate;
  ro.bf16_gemm = bf16_gemm_;
  ro.fp16_gemm = fp16_gemm_;
  FlatBuffer& target = into ? *into : grad_buf_;
  ONYX_CHECK(target.layout().numel == grad_buf_.layout().numel,
             "forward_backward: the gradient buffer has ", target.layout().numel,
             " elements, the parameters ", grad_buf_.layout().numel);
  for (auto& [p, g] : c.tg.gradients) ro.bound_outputs[g] = target.view(p);
  for (auto& [p, g] : c.tied) ro.bound_outputs[passes::tied_gradient_output(g)] = target.view(p);
  if (on_grad_ready)
    ro.on_bound_output = [&](const std::string& out) {
      auto it = c.param_of_grad.find(out);
      if (it != c.param_of_grad.end()) on_grad_ready(it->second);
    };
  auto out = c.session->run(feeds, ro);
  // The momentum update of the running statistics, as PyTorch's train-mode forward applies it.
  for (auto& [o, b] : c.stat_outputs) {
    const Tensor& v = out.at(o);
    Tensor& dst = buffers_.at(b);
    ONYX_CHECK(v.meta() == dst.meta(), "running statistic '", b, "': the graph computed ",
               dtype_name(v.dtype()), shape_str(v.shape()), " for ", dtype_name(dst.dtype()),
               shape_str(dst.shape()));
    std::memcpy(dst.raw(), v.raw(), dst.nbytes());
    rounded_fresh_ = false;
  }
  if (kept)
    for (auto& name : opts_.keep_outputs) (*kept)[name] = out.at(name).get_as_double(0);
  return out.at(c.tg.loss).get_as_double(0);
}

// A float32 tensor's values rounded to bf16 (fp16) as model.to(torch.bfloat16) rounds them, held
// in float32 (exact): bf16_full_eval's weights, buffers and rotary frequencies.
static Tensor rounded_copy(kernels::LowPrecision f, const Tensor& t) {
  Tensor r(t.dtype(), t.shape());
  kernels::round_to(f, t.data<float>(), r.data<float>(), t.numel());
  return r;
}

void TrainingSession::feed_eval_params(std::map<std::string, Tensor>& feeds,
                                       runtime::RunOptions& ro,
                                       const std::vector<std::string>& shadowed) {
  using kernels::LowPrecision;
  ro.bf16_gemm =
      full_eval_ == LowPrecision::Fp16 ? false : bf16_gemm_ || full_eval_ == LowPrecision::Bf16;
  ro.fp16_gemm = !ro.bf16_gemm && (fp16_gemm_ || full_eval_ == LowPrecision::Fp16);
  // (Under bf16_full_eval too: the shadow holds params() rounded, which rounded_ holds widened.)
  feed_shadow(shadowed, feeds);
  if (full_eval_ == LowPrecision::None) {
    for (auto& [b, t] : buffers_) feeds[b] = t;
    for (auto& p : params_) feeds[p] = param_buf_.view(p);
    declare_stable_params();
    return;
  }
  // model.to(torch.bfloat16) (model.half()) rounds every floating parameter and buffer: the
  // trained weights, the frozen ones (a LoRA base model) and the BatchNorm running statistics.
  const LowPrecision f = full_eval_;
  if (!rounded_.flat().defined()) {
    rounded_ = FlatBuffer(param_buf_.layout());
    rounded_fresh_ = false;
  }
  if (!rounded_fresh_) {  // the weights as model.to(torch.bfloat16) holds them, widened
    kernels::round_to(f, param_buf_.flat().data<float>(), rounded_.flat().data<float>(),
                      param_buf_.layout().numel);
    rounded_other_.clear();
    for (auto& [b, t] : buffers_)
      if (t.dtype() == DType::Float32) rounded_other_[b] = rounded_copy(f, t);
    rounded_fresh_ = true;
  }
  if (rounded_frozen_.empty())  // frozen weights do not change: rounded once per evaluation
    for (auto& name : opts_.frozen) {
      auto it = forward_->initializers.find(name);
      if (it != forward_->initializers.end() && it->second.dtype() == DType::Float32 &&
          !buffers_.count(name))
        rounded_frozen_[name] = rounded_copy(f, it->second);
    }
  for (auto& [b, t] : buffers_) {
    auto it = rounded_other_.find(b);
    feeds[b] = it != rounded_other_.end() ? it->second : t;
  }
  for (auto& [name, t] : rounded_frozen_) feeds[name] = t;
  for (auto& p : params_) feeds[p] = rounded_.view(p);
}

// model.to(torch.bfloat16) (model.half()), which bf16_full_eval (fp16_full_eval) runs, casts every
// floating buffer, rotary embeddings' inv_freq too; LlamaRotaryEmbedding widens it again to
// multiply the positions, so its frequencies are the rounded ones (an angle position x
// frequency moves by up to 2^-9 of itself). A copy of the forward graph whose inv_freq holds
// those values: an exporter's initializer "*inv_freq", or models/llama.cc's Constant output
// "model.rotary_emb.inv_freq" (rope_type dynamic reads it up to max_position_embeddings, as
// Transformers reads its buffer there, and recomputes float32 frequencies beyond, as Transformers
// does).
std::shared_ptr<ir::Graph> with_rounded_rotary_frequencies(const ir::Graph& g,
                                                           kernels::LowPrecision f) {
  auto out = std::make_shared<ir::Graph>(g);
  auto is_freq = [](const std::string& name) { return name.ends_with("inv_freq"); };
  for (auto& [name, t] : out->initializers)
    if (is_freq(name) && t.dtype() == DType::Float32) t = rounded_copy(f, t);
  for (auto& n : out->nodes) {
    const Tensor* v = n.attr_tensor("value");
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1 &&
        is_freq(n.outputs[0]) && v && v->dtype() == DType::Float32)
      n.attrs["value"] = ir::Attribute::of_tensor(rounded_copy(f, *v));
  }
  return out;
}

std::map<std::string, Tensor> TrainingSession::forward(const std::map<std::string, Tensor>& batch) {
  check_embedding_inputs(batch);
  const auto& spec = opts_.loss;
  bool has_labels = spec.kind == autodiff::LossSpec::Kind::GraphOutput || batch.count(spec.labels);
  // Without labels (prediction on unlabelled data) the model's own forward, through the same
  // passes as the evaluation graph with a loss: fused kernels, and under bf16 the
  // mixed_precision rewrite reading the weight shadow (not the unfused graph rounding every
  // weight per call).
  using kernels::LowPrecision;
  std::string key = cat(has_labels ? "loss|" : "forward|",
                        full_eval_ == LowPrecision::Bf16   ? "bf16|"
                        : full_eval_ == LowPrecision::Fp16 ? "fp16|"
                                                           : "",
                        batch_key(batch));
  auto it = eval_graphs_.find(key);
  if (it == eval_graphs_.end()) {
    std::map<std::string, TensorMeta> sig;
    for (auto& [n, t] : batch) sig[n] = t.meta();
    EvalCompiled c;
    // Made on first use: by then a Trainer has replaced the graph's weights by views of the
    // parameter buffer, so a copy holds no second set of weights.
    std::shared_ptr<const ir::Graph> model = forward_;
    if (full_eval_ != LowPrecision::None)
      model = with_rounded_rotary_frequencies(*forward_, full_eval_);
    if (has_labels) {
      c.lg = autodiff::build_loss_graph(*model, opts_, sig);
    } else {
      c.lg.graph = std::make_shared<ir::Graph>(*model);
      std::erase_if(sig, [&](const auto& kv) { return !c.lg.graph->find_input(kv.first); });
    }
    passes::batch_norm_to_inference(*c.lg.graph);  // evaluation: PyTorch's eval() BatchNorm
    if (optimize_) {
      passes::OptimizeOptions po = pass_opts_;
      if (po.bf16) po.bf16_weights.insert(params_.begin(), params_.end());
      auto g = std::make_shared<ir::Graph>(
          passes::optimize_forward(*c.lg.graph, sig, variables(), po, nullptr));
      // Mixed precision rewrites the evaluation graph as it does the training step's forward
      // (autocast wraps every forward, evaluation's too): the same numerics, and no weight
      // rounded per call.
      if (po.bf16) {
        po.gradient_into_buffer = false;
        passes::optimize_training(*g, sig, variables(), po, nullptr);
        for (auto& p : params_)
          if (g->find_input(passes::bf16_weight_input(p))) c.shadowed.push_back(p);
      }
      c.lg.graph = g;
    }
    c.session = std::make_unique<runtime::Session>(c.lg.graph, variables());
    it = eval_graphs_.emplace(key, std::move(c)).first;
  }
  std::map<std::string, Tensor> feeds;
  for (auto& [n, t] : batch)
    if (it->second.lg.graph->find_input(n)) feeds[n] = t;
  runtime::RunOptions ro;
  feed_eval_params(feeds, ro, it->second.shadowed);
  auto out = it->second.session->run(feeds, ro);
  if (has_labels) out["loss"] = out.at(it->second.lg.loss);
  return out;
}

}  // namespace onyx::train
