// gradient.cc — the gradient builder: appends the loss, finds what needs gradients, walks the
// forward graph in reverse, calls one rule per node, accumulates multiple uses with Sum, undoes
// broadcasting, and names one gradient output per trainable parameter.
// Every emitted node is shape-inferred as it is emitted (with the same infer functions the
// executor uses), so rules can ask for any value's meta and shape bugs surface at build time.
#include "autodiff/gradient.h"

#include <algorithm>
#include <iostream>
#include <unordered_map>

#include "runtime/kernel.h"
#include "runtime/session.h"

namespace onyx::autodiff {

namespace {

struct GradFamily {
  const char* name;
  GradFamilyFn fn;
};

// Filled at static initialization (a function-local static: safe whatever the order of files).
std::vector<GradFamily>& grad_families() {
  static std::vector<GradFamily> all;
  return all;
}

}  // namespace

GradFamilyRegistration::GradFamilyRegistration(const char* family, GradFamilyFn fn) {
  grad_families().push_back({family, fn});
}

GradRegistry& GradRegistry::instance() {
  static GradRegistry* reg = [] {
    auto* r = new GradRegistry();
    std::vector<GradFamily> order = grad_families();
    std::sort(order.begin(), order.end(), [](const GradFamily& a, const GradFamily& b) {
      return std::string(a.name) < b.name;
    });
    std::map<std::string, std::string> owners;
    for (const GradFamily& f : order) {
      GradFamilyRegistrar registrar(*r, f.name, owners);
      f.fn(registrar);
    }
    return r;
  }();
  return *reg;
}

static std::string rule_key(const std::string& domain, const std::string& op) {
  return (domain.empty() || domain == "ai.onnx") ? op : domain + "." + op;
}
void GradFamilyRegistrar::add(const std::string& domain, const std::string& op, GradRule rule) {
  auto [it, fresh] = owners_.emplace(rule_key(domain, op), family_);
  ONYX_CHECK(fresh, "gradient rule families '", it->second, "' and '", family_, "' both register ",
             rule_key(domain, op));
  registry_.add(domain, op, std::move(rule));
}
void GradRegistry::add(const std::string& domain, const std::string& op, GradRule rule) {
  rules_[rule_key(domain, op)] = std::move(rule);
}
const GradRule* GradRegistry::find(const std::string& domain, const std::string& op) const {
  auto it = rules_.find(rule_key(domain, op));
  return it == rules_.end() ? nullptr : &it->second;
}
std::vector<std::string> GradRegistry::op_names() const {
  std::vector<std::string> v;
  for (auto& [k, _] : rules_) v.push_back(k);
  return v;
}

struct Builder {
  ir::Graph g;  // forward + loss; backward nodes are appended to g.nodes
  std::unordered_map<std::string, TensorMeta> metas;
  std::unordered_map<std::string, Tensor> constants;
  std::set<std::string> requires_grad;
  std::map<std::string, std::vector<std::string>> contributions;
  int counter = 0;
  int backward_nodes = 0;
  std::string current;  // forward node being differentiated (for names and errors)

  std::string fresh(const std::string& base) { return cat(base, "__", counter++); }

  // Infers the node's outputs with the kernel registry, records metas, appends it.
  std::vector<std::string> add_node(ir::Node n) {
    auto& reg = runtime::KernelRegistry::instance();
    const runtime::OpKernel* k = reg.find(n.domain, n.op_type);
    ONYX_CHECK(k, "gradient of ", current, ": emitted op '", n.op_type, "' has no kernel");
    std::vector<const TensorMeta*> in;
    std::vector<const Tensor*> vals;
    for (auto& i : n.inputs) {
      if (i.empty()) {
        in.push_back(nullptr);
        vals.push_back(nullptr);
        continue;
      }
      auto m = metas.find(i);
      ONYX_CHECK(m != metas.end(), "gradient of ", current, ": value '", i,
                 "' has no static shape (dynamic shapes are not supported in training graphs)");
      in.push_back(&m->second);
      auto c = constants.find(i);
      vals.push_back(c == constants.end() ? nullptr : &c->second);
    }
    int64_t opset = n.domain.empty() ? g.opset("") : (g.opset(n.domain) ? g.opset(n.domain) : 1);
    std::vector<TensorMeta> outs;
    try {
      outs = runtime::infer_node(*k, n, opset, in, vals);
    } catch (runtime::NeedValue& nv) {
      throw Error(cat("gradient of ", current, ": ", n.describe(), " needs the value of input ",
                      nv.input, " at build time"));
    } catch (const Error& e) {
      throw Error(cat("gradient of ", current, ": ", e.what()));
    }
    for (size_t i = 0; i < n.outputs.size(); i++)
      if (!n.outputs[i].empty()) metas[n.outputs[i]] = outs[i];
    if (n.op_type == "Constant" && n.domain.empty()) constants[n.outputs[0]] = n.attrs["value"].t;
    backward_nodes++;
    g.nodes.push_back(n);
    return n.outputs;
  }

  std::string emit(const std::string& op, const std::vector<std::string>& inputs,
                   std::map<std::string, ir::Attribute> attrs, const std::string& domain,
                   int num_outputs, std::vector<std::string>* all = nullptr) {
    ir::Node n;
    n.op_type = op;
    n.domain = domain;
    n.name = fresh("grad/" + current + "/" + op);
    n.inputs = inputs;
    for (int i = 0; i < num_outputs; i++) n.outputs.push_back(fresh(current + "/" + op + "_out"));
    n.attrs = std::move(attrs);
    auto outs = add_node(std::move(n));
    if (all) *all = outs;
    return outs[0];
  }

  std::string constant(const Tensor& t, const std::string& base) {
    return emit("Constant", {}, {{"value", ir::Attribute::of_tensor(t)}}, "", 1) +
           (base.empty() ? "" : "");
  }

  // Sum of all contributions to `value`'s gradient; "" when none.
  std::string finalize(const std::string& value) {
    auto it = contributions.find(value);
    if (it == contributions.end() || it->second.empty()) return "";
    if (it->second.size() == 1) return it->second[0];
    std::string s = emit("Sum", it->second, {}, "", 1);
    it->second = {s};
    return s;
  }

  std::string reduce_to_shape(const std::string& grad, const Shape& gs, const Shape& target) {
    if (gs == target) return grad;
    ONYX_CHECK(gs.size() >= target.size(), "gradient of ", current, ": cannot reduce ",
               shape_str(gs), " to ", shape_str(target));
    std::vector<int64_t> axes;
    size_t off = gs.size() - target.size();
    for (size_t i = 0; i < gs.size(); i++) {
      if (i < off)
        axes.push_back((int64_t)i);
      else if (target[i - off] == 1 && gs[i] != 1)
        axes.push_back((int64_t)i);
      else
        ONYX_CHECK(target[i - off] == gs[i], "gradient of ", current, ": cannot reduce ",
                   shape_str(gs), " to ", shape_str(target));
    }
    std::string r = grad;
    if (!axes.empty()) {
      if (g.opset("") >= 13) {
        Tensor ax = Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)axes.size()}, axes);
        r = emit("ReduceSum", {grad, constant(ax, "")}, {{"keepdims", attr_i(1)}}, "", 1);
      } else {  // axes became an input of ReduceSum at opset 13
        r = emit("ReduceSum", {grad}, {{"keepdims", attr_i(1)}, {"axes", attr_ints(axes)}}, "", 1);
      }
    }
    if (metas.at(r).shape != target) {
      Tensor sh = Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)target.size()}, target);
      r = emit("Reshape", {r, constant(sh, "")}, {}, "", 1);
    }
    return r;
  }
};

// ---- GradContext -------------------------------------------------------------------------

GradContext::GradContext(Builder& b, int node_index) : b_(b), node_(node_index) {}
const ir::Node& GradContext::node() const { return b_.g.nodes[node_]; }
int64_t GradContext::opset() const { return b_.g.opset(node().domain); }
int GradContext::num_inputs() const { return (int)node().inputs.size(); }
int GradContext::num_outputs() const { return (int)node().outputs.size(); }
const std::string& GradContext::I(int i) const {
  static const std::string empty;
  return i < num_inputs() ? node().inputs[i] : empty;
}
const std::string& GradContext::O(int i) const {
  static const std::string empty;
  return i < num_outputs() ? node().outputs[i] : empty;
}
std::string GradContext::ensure_output(int i) {
  ir::Node& n = b_.g.nodes[node_];
  if ((int)n.outputs.size() <= i) n.outputs.resize(i + 1);
  if (n.outputs[i].empty()) {
    n.outputs[i] = b_.fresh(n.name + "/saved" + std::to_string(i));
    // Infer the metas of the newly requested output by re-inferring the forward node.
    auto& reg = runtime::KernelRegistry::instance();
    const runtime::OpKernel* k = reg.find(n.domain, n.op_type);
    std::vector<const TensorMeta*> in;
    std::vector<const Tensor*> vals;
    for (auto& x : n.inputs) {
      in.push_back(x.empty() ? nullptr : &b_.metas.at(x));
      auto c = b_.constants.find(x);
      vals.push_back(x.empty() || c == b_.constants.end() ? nullptr : &c->second);
    }
    b_.metas[n.outputs[i]] = runtime::infer_node(*k, n, opset(), in, vals)[i];
  }
  return n.outputs[i];
}
std::string GradContext::GO(int i) const {
  if (i >= num_outputs() || O(i).empty()) return "";
  return b_.finalize(O(i));
}
bool GradContext::needs(int i) const {
  return i < num_inputs() && !I(i).empty() && b_.requires_grad.count(I(i)) != 0;
}
const TensorMeta& GradContext::meta(const std::string& v) const {
  auto it = b_.metas.find(v);
  ONYX_CHECK(it != b_.metas.end(), "gradient of ", node().describe(), ": value '", v,
             "' has no static shape");
  return it->second;
}
const Tensor* GradContext::constant(const std::string& v) const {
  auto it = b_.constants.find(v);
  return it == b_.constants.end() ? nullptr : &it->second;
}
void GradContext::set(int i, const std::string& grad) {
  if (!needs(i) || grad.empty()) return;
  const TensorMeta& gm = meta(grad);
  const TensorMeta& im = meta(I(i));
  std::string g = grad;
  if (gm.shape != im.shape) g = b_.reduce_to_shape(grad, gm.shape, im.shape);
  if (gm.dtype != im.dtype) g = b_.emit("Cast", {g}, {{"to", attr_i((int64_t)im.dtype)}}, "", 1);
  b_.contributions[I(i)].push_back(g);
}
std::vector<std::string> GradContext::emit(const std::string& op,
                                           const std::vector<std::string>& inputs,
                                           std::map<std::string, ir::Attribute> attrs,
                                           const std::string& domain, int num_outputs) {
  std::vector<std::string> outs;
  b_.emit(op, inputs, std::move(attrs), domain, num_outputs, &outs);
  return outs;
}
std::string GradContext::const_i64(const std::vector<int64_t>& v) {
  return b_.constant(Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)v.size()}, v), "");
}
std::string GradContext::const_scalar(double v, DType dtype) {
  Tensor t(dtype, {});
  switch (dtype) {
    case DType::Float32:
      *t.data<float>() = (float)v;
      break;
    case DType::Float64:
      *t.data<double>() = v;
      break;
    case DType::Float16:
      *t.data<uint16_t>() = float_to_half((float)v);
      break;
    case DType::BFloat16:
      *t.data<uint16_t>() = float_to_bf16((float)v);
      break;
    case DType::Int64:
      *t.data<int64_t>() = (int64_t)v;
      break;
    case DType::Int32:
      *t.data<int32_t>() = (int32_t)v;
      break;
    default:
      throw Error(cat("const_scalar: unsupported dtype ", dtype_name(dtype)));
  }
  return b_.constant(t, "");
}
std::string GradContext::reshape(const std::string& v, const Shape& shape) {
  if (meta(v).shape == shape) return v;
  std::map<std::string, ir::Attribute> attrs;
  bool has_zero = false;
  for (int64_t d : shape) has_zero |= d == 0;
  // The emitted Reshape / ReduceSum are ai.onnx ops: their form follows the graph's ai.onnx
  // opset, not the opset of the rule's own domain (an "onyx" rule's is 1).
  if (has_zero && b_.g.opset("") >= 14) attrs["allowzero"] = attr_i(1);
  return emit1("Reshape", {v, const_i64(shape)}, attrs);
}
std::string GradContext::reduce_sum(const std::string& v, const std::vector<int64_t>& axes,
                                    bool keepdims) {
  if (axes.empty()) return v;
  if (b_.g.opset("") >= 13)
    return emit1("ReduceSum", {v, const_i64(axes)}, {{"keepdims", attr_i(keepdims)}});
  return emit1("ReduceSum", {v}, {{"axes", attr_ints(axes)}, {"keepdims", attr_i(keepdims)}});
}
std::string GradContext::reduce_to_shape(const std::string& grad, const Shape& gs, const Shape& t) {
  return b_.reduce_to_shape(grad, gs, t);
}

// ---- loss ----------------------------------------------------------------------------------

namespace {

ir::Node make_node(Builder& b, const std::string& op, std::vector<std::string> in,
                   std::map<std::string, ir::Attribute> attrs = {}) {
  ir::Node n;
  n.op_type = op;
  n.name = b.fresh("loss/" + op);
  n.inputs = std::move(in);
  n.outputs = {b.fresh("loss/" + op + "_out")};
  n.attrs = std::move(attrs);
  return n;
}

// Appends the loss to b.g (as forward nodes) and returns the loss value's name.
std::string append_loss(Builder& b, const LossSpec& spec,
                        std::map<std::string, TensorMeta>& signature) {
  ir::Graph& g = b.g;
  if (spec.kind == LossSpec::Kind::GraphOutput) {
    if (!spec.output.empty()) {
      bool found = false;
      for (auto& o : g.outputs) found |= o.name == spec.output;
      ONYX_CHECK(found, "loss '", spec.output, "' is not an output of the model");
      return spec.output;
    }
    ONYX_CHECK(!g.outputs.empty(), "the model has no outputs to use as a loss");
    return g.outputs[0].name;
  }
  std::string pred = spec.output.empty() ? g.outputs.at(0).name : spec.output;
  bool found = false;
  for (auto& o : g.outputs) found |= o.name == pred;
  ONYX_CHECK(found, "loss: '", pred, "' is not an output of the model");
  ONYX_CHECK(!spec.labels.empty(), "loss: the labels input is not named");
  if (!g.find_input(spec.labels)) {
    ONYX_CHECK(signature.count(spec.labels), "loss: labels '", spec.labels,
               "' are neither a model input nor given");
    ir::ValueInfo vi;
    vi.name = spec.labels;
    vi.dtype = signature[spec.labels].dtype;
    g.inputs.push_back(vi);
  }
  auto add = [&](const std::string& op, std::vector<std::string> in,
                 std::map<std::string, ir::Attribute> attrs = {}) {
    ir::Node n = make_node(b, op, std::move(in), std::move(attrs));
    std::string out = n.outputs[0];
    g.nodes.push_back(std::move(n));
    return out;
  };
  auto const_node = [&](const Tensor& t) {
    return add("Constant", {}, {{"value", ir::Attribute::of_tensor(t)}});
  };
  if (spec.kind == LossSpec::Kind::MSE) {
    std::string d = add("Sub", {pred, spec.labels});
    std::string sq = add("Mul", {d, d});
    return add("ReduceMean", {sq}, {{"keepdims", attr_i(0)}});
  }
  // Cross entropy over the last axis: logits (..., V) and labels (...) flattened to (N, V), (N).
  std::string flat = add("Flatten", {pred}, {{"axis", attr_i(-1)}});
  std::string labels1d = add(
      "Reshape", {spec.labels, const_node(Tensor::from_vector<int64_t>(DType::Int64, {1}, {-1}))});
  if (spec.label_smoothing == 0.0f) {
    return add("SoftmaxCrossEntropyLoss", {flat, labels1d},
               {{"reduction", attr_s("mean")}, {"ignore_index", attr_i(spec.ignore_index)}});
  }
  // Label smoothing as Transformers does it: (1-eps) * nll + eps * mean over classes of -log p,
  // both averaged over the targets that are not ignore_index.
  float eps = spec.label_smoothing;
  std::string logp = add("LogSoftmax", {flat}, {{"axis", attr_i(-1)}});
  std::string nll =
      add("NegativeLogLikelihoodLoss", {logp, labels1d},
          {{"reduction", attr_s("none")}, {"ignore_index", attr_i(spec.ignore_index)}});
  std::string mean_logp =
      g.opset("") >= 18
          ? add("ReduceMean",
                {logp, const_node(Tensor::from_vector<int64_t>(DType::Int64, {1}, {1}))},
                {{"keepdims", attr_i(0)}})
          : add("ReduceMean", {logp}, {{"keepdims", attr_i(0)}, {"axes", attr_ints({1})}});
  std::string ignore = const_node(Tensor::scalar_i64(spec.ignore_index));
  std::string is_ignored = add("Equal", {labels1d, ignore});
  std::string active =
      add("Cast", {add("Not", {is_ignored})}, {{"to", attr_i((int64_t)DType::Float32)}});
  std::string a = add("Mul", {nll, const_node(Tensor::scalar_f32(1.0f - eps))});
  std::string s = add("Mul", {mean_logp, const_node(Tensor::scalar_f32(-eps))});
  std::string per = add("Mul", {add("Add", {a, s}), active});
  std::string total = add("ReduceSum", {per}, {{"keepdims", attr_i(0)}});
  std::string count = add("Max", {add("ReduceSum", {active}, {{"keepdims", attr_i(0)}}),
                                  const_node(Tensor::scalar_f32(1.0f))});
  return add("Div", {total, count});
}

}  // namespace

namespace {
// `n` is `prefix` followed by digits only: the names exporters give values they generate.
bool numbered(const std::string& n, const char* prefix) {
  size_t p = std::char_traits<char>::length(prefix);
  return n.size() > p && n.compare(0, p, prefix) == 0 &&
         n.find_first_not_of("0123456789", p) == std::string::npos;
}

// The dynamo exporter's folded constants ("val_<n>", "_val_<n>"); "onnx::*" are TorchScript's.
bool exporter_constant_name(const std::string& n) {
  return numbered(n, "val_") || numbered(n, "_val_");
}

// torch.onnx.export(dynamo=True) with its default optimize=True writes an inference model: every
// Linear's W^T is folded into a new initializer "val_<n>" and equal-valued initializers are merged
// (all LayerNorm weights start at 1 and end up shared). Training such a file trains another model,
// so say so, once per process.
void warn_if_inference_export(const ir::Graph& g, const std::vector<std::string>& params) {
  static bool warned = false;
  if (warned || g.producer_name.rfind("pytorch", 0) != 0) return;
  std::vector<std::string> folded;
  for (auto& p : params)
    if (numbered(p, "val_")) folded.push_back(p);
  if (folded.empty()) return;
  warned = true;
  std::cerr << "onyx: warning: " << folded.size()
            << " trainable initializers are named val_<n> (e.g. '" << folded[0]
            << "'): this looks like torch.onnx.export(dynamo=True) with its default "
               "optimize=True, which folds each Linear's transposed weight into a new initializer "
               "and merges initializers of equal value (e.g. every LayerNorm weight), so the "
               "parameters trained are not the model's; export with optimize=False (README: "
               "Exporting from PyTorch)\n";
}
}  // namespace

std::vector<std::string> batch_norm_buffers(const ir::Graph& g) {
  std::map<std::string, int> stats_uses;  // initializer -> uses as a BatchNorm mean/var input
  std::set<std::string> other_uses;
  for (auto& n : g.nodes) {
    bool bn = n.op_type == "BatchNormalization" && (n.domain.empty() || n.domain == "ai.onnx");
    for (size_t i = 0; i < n.inputs.size(); i++) {
      const std::string& in = n.inputs[i];
      if (in.empty() || !g.initializers.count(in)) continue;
      if (bn && (i == 3 || i == 4))
        stats_uses[in]++;
      else
        other_uses.insert(in);
    }
  }
  for (auto& o : g.outputs) other_uses.insert(o.name);
  std::vector<std::string> r;
  for (auto& name : g.initializer_order)
    if (stats_uses.count(name) && !other_uses.count(name) &&
        is_float(g.initializers.at(name).dtype()))
      r.push_back(name);
  return r;
}

std::vector<std::string> trainable_parameters(const ir::Graph& forward,
                                              const GradientOptions& opts) {
  std::vector<std::string> params;
  if (opts.trainable.empty()) {
    // (on the model as given; optimized graphs may have dropped a frozen initializer)
    for (auto& f : opts.frozen)
      ONYX_CHECK(forward.initializers.count(f), "frozen '", f,
                 "' is not an initializer of the model");
    std::vector<std::string> bn = batch_norm_buffers(forward);
    std::set<std::string> bn_buffers(bn.begin(), bn.end());
    for (auto& name : forward.initializer_order) {
      const Tensor& t = forward.initializers.at(name);
      // Not parameters: "onnx::" constants of the TorchScript exporter, and rotary
      // embeddings' inv_freq, a buffer Transformers computes from the config (the dynamo exporter
      // writes buffers as initializers like any weight; training it would move every rotary
      // frequency).
      bool buffer = name.size() >= 8 && name.compare(name.size() - 8, 8, "inv_freq") == 0;
      // A 0-d initializer is a parameter too (Transformers' RegressionModel a and b, a
      // temperature, a ReZero gate), except the exporters' own folded constants: "onnx::*"
      // (TorchScript) and "val_<n>" / "_val_<n>" (dynamo).
      if (t.rank() == 0 && exporter_constant_name(name)) continue;
      // BatchNormalization's running mean / var: buffers updated by the forward, not trained.
      if (bn_buffers.count(name)) continue;
      if (is_float(t.dtype()) && !opts.frozen.count(name) && name.rfind("onnx::", 0) != 0 &&
          !buffer)
        params.push_back(name);
    }
  } else {
    for (auto& name : opts.trainable) {
      ONYX_CHECK(forward.initializers.count(name), "trainable '", name, "' is not an initializer");
      if (!opts.frozen.count(name)) params.push_back(name);
    }
  }
  warn_if_inference_export(forward, params);
  return params;
}

LossGraph build_loss_graph(const ir::Graph& forward, const GradientOptions& opts,
                           const std::map<std::string, TensorMeta>& signature_in) {
  Builder b;
  b.g = forward;
  std::map<std::string, TensorMeta> signature = signature_in;
  std::string loss = append_loss(b, opts.loss, signature);
  std::vector<ir::ValueInfo> outs;
  ir::ValueInfo lo;
  lo.name = loss;
  lo.dtype = DType::Float32;
  outs.push_back(lo);
  for (auto& o : forward.outputs)
    if (o.name != loss) outs.push_back(o);
  b.g.outputs = outs;
  return {std::make_shared<ir::Graph>(std::move(b.g)), loss};
}

GradientPaths gradient_paths(const ir::Graph& g, const std::vector<std::string>& params,
                             const std::string& loss,
                             const std::function<bool(const std::string&)>& carries_gradient) {
  GradientPaths r;
  r.order = ir::topological_order(g);
  // Forward: which values depend on a parameter through values that carry gradients.
  r.requires_grad.insert(params.begin(), params.end());
  for (int idx : r.order) {
    const ir::Node& n = g.nodes[idx];
    bool any = false;
    for (auto& i : n.inputs) any |= !i.empty() && r.requires_grad.count(i);
    if (!any || (n.op_type == "StopGradient" && n.domain == "onyx")) continue;  // detach()
    for (auto& o : n.outputs)
      if (!o.empty() && carries_gradient(o)) r.requires_grad.insert(o);
  }
  // Backward reachability from the loss.
  std::set<std::string> reaches{loss};
  r.on_path.assign(g.nodes.size(), false);
  for (auto it = r.order.rbegin(); it != r.order.rend(); ++it) {
    const ir::Node& n = g.nodes[*it];
    bool feeds = false;
    for (auto& o : n.outputs) feeds |= !o.empty() && reaches.count(o) && r.requires_grad.count(o);
    if (!feeds) continue;
    r.on_path[*it] = true;
    for (auto& i : n.inputs)
      if (!i.empty() && r.requires_grad.count(i)) reaches.insert(i);
  }
  return r;
}

TrainingGraph build_training_graph(const ir::Graph& forward,
                                   const std::map<std::string, TensorMeta>& signature_in,
                                   const GradientOptions& opts) {
  Builder b;
  b.g = forward;
  std::map<std::string, TensorMeta> signature = signature_in;
  std::string loss = append_loss(b, opts.loss, signature);

  std::vector<std::string> params = trainable_parameters(forward, opts);

  // Static metas and constants of the forward graph (+ loss) for this signature; parameters are
  // variables, so nothing computed from them is folded.
  {
    auto tmp = std::make_shared<ir::Graph>(b.g);
    tmp->outputs.clear();
    ir::ValueInfo lo;
    lo.name = loss;
    tmp->outputs.push_back(lo);
    runtime::Session s(tmp, std::set<std::string>(params.begin(), params.end()));
    std::map<std::string, TensorMeta> sig;
    for (auto& v : tmp->inputs) {
      auto it = signature.find(v.name);
      ONYX_CHECK(it != signature.end(), "input '", v.name, "' is missing from the signature");
      sig[v.name] = it->second;
    }
    const runtime::Plan& plan = s.plan_for(sig);
    for (auto& [k, m] : plan.metas) b.metas[k] = m;
    for (auto& [k, t] : plan.constants) b.constants[k] = t;
  }
  auto lm = b.metas.find(loss);
  ONYX_CHECK(lm != b.metas.end(), "loss '", loss, "' has no static shape");
  ONYX_CHECK(lm->second.numel() == 1 && is_float(lm->second.dtype), "loss '", loss,
             "' must be a float scalar, but it is ", dtype_name(lm->second.dtype), " ",
             shape_str(lm->second.shape));

  // Which values depend on a parameter through float paths, and which nodes feed the loss.
  GradientPaths paths = gradient_paths(b.g, params, loss, [&](const std::string& v) {
    auto m = b.metas.find(v);
    return m != b.metas.end() && is_float(m->second.dtype) && !b.constants.count(v);
  });
  const std::vector<int>& order = paths.order;
  const std::vector<bool>& on_path = paths.on_path;
  b.requires_grad = std::move(paths.requires_grad);
  // Every node on the path needs a rule: check them all before building anything.
  auto& rules = GradRegistry::instance();
  for (int idx : order)
    if (on_path[idx] && !rules.find(b.g.nodes[idx].domain, b.g.nodes[idx].op_type))
      throw Error(cat("no gradient rule for op '", b.g.nodes[idx].op_type, "' (",
                      b.g.nodes[idx].describe(), ", opset ", b.g.opset(b.g.nodes[idx].domain),
                      "): the model cannot be trained"));

  // Seed and walk backward.
  b.current = "loss";
  {
    Tensor one(lm->second.dtype, lm->second.shape);
    ONYX_CHECK(lm->second.dtype == DType::Float32, "loss must be float32 for now");
    one.data<float>()[0] = 1.0f;
    b.contributions[loss].push_back(b.constant(one, ""));
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    int idx = *it;
    if (!on_path[idx]) continue;
    b.current = b.g.nodes[idx].name;
    GradContext ctx(b, idx);
    bool any_grad = false;
    for (int o = 0; o < ctx.num_outputs(); o++)
      any_grad |= !ctx.O(o).empty() && b.contributions.count(ctx.O(o));
    if (!any_grad) continue;
    const ir::Node node_copy = b.g.nodes[idx];  // rules may append nodes (reallocating g.nodes)
    try {
      (*rules.find(node_copy.domain, node_copy.op_type))(ctx);
    } catch (const Error& e) {
      std::string m = e.what();
      if (m.rfind("gradient of", 0) == 0) throw;
      throw Error(cat("gradient of ", node_copy.describe(), ": ", m));
    }
  }

  // Outputs: loss, then one gradient per parameter (zeros when it does not affect the loss).
  TrainingGraph tg;
  b.current = "outputs";
  std::vector<ir::ValueInfo> outs;
  ir::ValueInfo lo;
  lo.name = loss;
  lo.dtype = lm->second.dtype;
  outs.push_back(lo);
  for (auto& p : params) {
    std::string gname = b.finalize(p);
    const TensorMeta& pm = b.metas.at(p);
    if (gname.empty()) {
      Tensor z = Tensor::zeros(pm.dtype, pm.shape);
      gname = b.constant(z, "");
    }
    std::string out = p + "_grad";
    while (b.metas.count(out)) out += "_";
    // The last node of each gradient writes (or adds) into the parameter's view of the flat
    // gradient buffer when the caller binds it (RunOptions::bound_outputs / accumulate).
    ir::Node id;
    id.op_type = "AccumulateGrad";
    id.domain = "onyx";
    id.name = b.fresh("grad_out/" + p);
    id.inputs = {gname};
    id.outputs = {out};
    b.add_node(id);
    ir::ValueInfo vi;
    vi.name = out;
    vi.dtype = pm.dtype;
    outs.push_back(vi);
    tg.gradients.push_back({p, out});
  }
  for (auto& v : opts.keep_outputs) {
    auto m = b.metas.find(v);
    ONYX_CHECK(m != b.metas.end(), "training graph: kept output '", v,
               "' is not a value of the graph");
    ir::ValueInfo vi;
    vi.name = v;
    vi.dtype = m->second.dtype;
    outs.push_back(vi);
  }
  b.g.outputs = outs;
  tg.loss = loss;
  tg.backward_nodes = b.backward_nodes;
  tg.graph = std::make_shared<ir::Graph>(std::move(b.g));
  return tg;
}

}  // namespace onyx::autodiff
