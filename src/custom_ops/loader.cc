// custom_op.cc — custom-op libraries (include/onyx/custom_op.h, the C ABI) adapted into onyx's
// registries: each OnyxCustomOp becomes an OpKernel (infer + compute wrapping the C callbacks) in
// runtime::KernelRegistry and, when it declares a gradient, a GradRule in autodiff::GradRegistry:
// a grad_op kernel node, or the library's rules (small graphs of existing ops) emitted through
// GradContext. Registration is all-or-nothing per library and copies everything the library
// passed; libraries stay loaded for the life of the process.
#include <dlfcn.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "autodiff/gradient.h"
#include "onyx/custom_ops.h"
#include "runtime/kernel.h"
#include "runtime/parallel.h"

namespace fs = std::filesystem;

namespace onyx {
namespace {

using AttrMap = std::map<std::string, ir::Attribute>;

// ---- the library's op, copied ----------------------------------------------------------------

// A reference inside a gradient rule (custom_op.h, "gradient rules from existing ops").
struct Ref {
  enum class Kind { Input, Output, GradOutput, Const, Attr, Local } kind = Kind::Local;
  int index = 0;             // Input / Output / GradOutput
  double value = 0;          // Const; Attr default
  bool has_default = false;  // Attr
  std::string name;          // Attr name, Local name
  std::string text;          // as written, for messages
};

struct RuleNode {
  std::string op_type, domain, output;
  std::vector<Ref> inputs;
  AttrMap attrs;
};

struct Rule {
  int input = 0;
  std::vector<RuleNode> nodes;
  Ref result;
};

struct Op {
  std::string domain, name, library;
  int min_inputs = 0, max_inputs = 0, min_outputs = 1, max_outputs = 1;
  OnyxInferFn infer = nullptr;
  OnyxComputeFn compute = nullptr;
  std::string grad_op;
  std::vector<Rule> rules;
  bool random = false;
  void* user_data = nullptr;

  std::string key() const { return domain + "." + name; }
  std::string who() const { return cat("custom op '", key(), "' (library '", library, "')"); }
};

struct State {
  std::mutex mu;
  std::vector<CustomOpInfo> ops;                  // registered, in order
  std::map<std::string, std::string> loaded;      // canonical path -> as given
  std::map<std::string, std::string> library_of;  // op key -> library
};
State& state() {
  static State* s = new State();
  return *s;
}

// ---- OnyxCustomOpApi functions ------------------------------------------------------------

const AttrMap& attrs_of(const OnyxAttributes* a) { return *reinterpret_cast<const AttrMap*>(a); }
const OnyxAttributes* as_attrs(const AttrMap& m) {
  return reinterpret_cast<const OnyxAttributes*>(&m);
}

const ir::Attribute* find_attr(const OnyxAttributes* a, const char* name) {
  if (!a || !name) return nullptr;
  auto& m = attrs_of(a);
  auto it = m.find(name);
  return it == m.end() ? nullptr : &it->second;
}

int api_attr_int(const OnyxAttributes* a, const char* name, int64_t* v) {
  const ir::Attribute* at = find_attr(a, name);
  if (!at) return 0;
  if (at->kind != ir::Attribute::Kind::Int) return -1;
  if (v) *v = at->i;
  return 1;
}
int api_attr_float(const OnyxAttributes* a, const char* name, float* v) {
  const ir::Attribute* at = find_attr(a, name);
  if (!at) return 0;
  if (at->kind == ir::Attribute::Kind::Int) {
    if (v) *v = (float)at->i;
    return 1;
  }
  if (at->kind != ir::Attribute::Kind::Float) return -1;
  if (v) *v = at->f;
  return 1;
}
int api_attr_string(const OnyxAttributes* a, const char* name, const char** v, size_t* n) {
  const ir::Attribute* at = find_attr(a, name);
  if (!at) return 0;
  if (at->kind != ir::Attribute::Kind::String) return -1;
  if (v) *v = at->s.c_str();
  if (n) *n = at->s.size();
  return 1;
}
int api_attr_ints(const OnyxAttributes* a, const char* name, const int64_t** v, int64_t* n) {
  const ir::Attribute* at = find_attr(a, name);
  if (!at) return 0;
  if (at->kind != ir::Attribute::Kind::Ints) return -1;
  if (v) *v = at->ints.data();
  if (n) *n = (int64_t)at->ints.size();
  return 1;
}
int api_attr_floats(const OnyxAttributes* a, const char* name, const float** v, int64_t* n) {
  const ir::Attribute* at = find_attr(a, name);
  if (!at) return 0;
  if (at->kind != ir::Attribute::Kind::Floats) return -1;
  if (v) *v = at->floats.data();
  if (n) *n = (int64_t)at->floats.size();
  return 1;
}
void api_parallel_for(int64_t n, int64_t grain, void (*fn)(void*, int64_t, int64_t), void* user) {
  if (!fn) return;
  runtime::parallel_for(n, grain, [&](int64_t b, int64_t e) { fn(user, b, e); });
}

struct Registrar {
  std::string origin;
  std::vector<Op> ops;
  std::string error;  // first problem found (register_op) or the library's own (set_error)
  std::string library_message;
};

std::string cstr(const char* s) { return s ? std::string(s) : std::string(); }

// Parses a rule reference; `locals` are the outputs of the rule's earlier nodes.
Ref parse_ref(const std::string& s, const std::set<std::string>& locals, const Op& op,
              int max_inputs, int max_outputs) {
  Ref r;
  r.text = s;
  auto index_after = [&](size_t prefix, int limit, const char* what) {
    std::string digits = s.substr(prefix);
    ONYX_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos, "'",
               s, "' is not a valid reference");
    int k = std::atoi(digits.c_str());
    ONYX_CHECK(k < limit, "'", s, "' refers to ", what, " ", k, " but the op has at most ", limit);
    return k;
  };
  auto number = [&](const std::string& t) {
    char* end = nullptr;
    double v = std::strtod(t.c_str(), &end);
    ONYX_CHECK(!t.empty() && end && *end == 0, "'", s, "': '", t, "' is not a number");
    return v;
  };
  if (locals.count(s)) {
    r.kind = Ref::Kind::Local;
    r.name = s;
  } else if (s.rfind("GO", 0) == 0 && s.size() > 2 && isdigit((unsigned char)s[2])) {
    r.kind = Ref::Kind::GradOutput;
    r.index = index_after(2, max_outputs, "output");
  } else if (s.size() > 1 && s[0] == 'I' && isdigit((unsigned char)s[1])) {
    r.kind = Ref::Kind::Input;
    r.index = index_after(1, max_inputs, "input");
  } else if (s.size() > 1 && s[0] == 'O' && isdigit((unsigned char)s[1])) {
    r.kind = Ref::Kind::Output;
    r.index = index_after(1, max_outputs, "output");
  } else if (s.rfind("const:", 0) == 0) {
    r.kind = Ref::Kind::Const;
    r.value = number(s.substr(6));
  } else if (s.rfind("attr:", 0) == 0) {
    r.kind = Ref::Kind::Attr;
    std::string t = s.substr(5);
    auto eq = t.find('=');
    r.name = t.substr(0, eq);
    ONYX_CHECK(!r.name.empty(), "'", s, "' names no attribute");
    if (eq != std::string::npos) {
      r.has_default = true;
      r.value = number(t.substr(eq + 1));
    }
  } else {
    throw Error(cat("'", s,
                    "' is neither I<k>, O<k>, GO<k>, const:<number>, attr:<name>[=<default>]"
                    " nor the output of an earlier node of the rule"));
  }
  (void)op;
  return r;
}

ir::Attribute copy_attribute(const OnyxAttribute& a) {
  ir::Attribute out;
  ONYX_CHECK(a.count >= 0, "attribute '", cstr(a.name), "' has a negative count");
  switch (a.type) {
    case ONYX_ATTR_INT:
      out.kind = ir::Attribute::Kind::Int;
      out.i = a.i;
      break;
    case ONYX_ATTR_FLOAT:
      out.kind = ir::Attribute::Kind::Float;
      out.f = a.f;
      break;
    case ONYX_ATTR_STRING:
      out.kind = ir::Attribute::Kind::String;
      out.s = cstr(a.s);
      break;
    case ONYX_ATTR_INTS:
      out.kind = ir::Attribute::Kind::Ints;
      ONYX_CHECK(a.count == 0 || a.ints, "attribute '", cstr(a.name), "': ints is NULL");
      out.ints.assign(a.ints, a.ints + a.count);
      break;
    case ONYX_ATTR_FLOATS:
      out.kind = ir::Attribute::Kind::Floats;
      ONYX_CHECK(a.count == 0 || a.floats, "attribute '", cstr(a.name), "': floats is NULL");
      out.floats.assign(a.floats, a.floats + a.count);
      break;
    default:
      throw Error(cat("attribute '", cstr(a.name), "' has unknown type ", a.type,
                      " (ONYX_ATTR_INT, _FLOAT, _STRING, _INTS or _FLOATS)"));
  }
  return out;
}

bool valid_identifier(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

// Copies and checks one op; throws a message without the library's name (the caller adds it).
Op copy_op(const OnyxCustomOp& in, const std::string& library) {
  Op op;
  op.library = library;
  op.domain = cstr(in.domain);
  op.name = cstr(in.name);
  std::string who = cat("op '", op.domain, ".", op.name, "'");
  ONYX_CHECK(!op.domain.empty() && op.domain != "ai.onnx" && op.domain != "onyx", who,
             ": the domain must be the library's own (not \"\", \"ai.onnx\" or \"onyx\")");
  ONYX_CHECK(valid_identifier(op.domain), who, ": invalid domain '", op.domain, "'");
  ONYX_CHECK(valid_identifier(op.name) && op.name.find('.') == std::string::npos, who,
             ": invalid op name '", op.name, "'");
  ONYX_CHECK(in.compute, who, ": compute is NULL");
  ONYX_CHECK(in.min_inputs >= 0 && in.min_inputs <= in.max_inputs && in.max_inputs <= 64, who,
             ": needs 0 <= min_inputs <= max_inputs <= 64 (got ", in.min_inputs, " and ",
             in.max_inputs, ")");
  ONYX_CHECK(in.min_outputs >= 1 && in.min_outputs <= in.max_outputs && in.max_outputs <= 64, who,
             ": needs 1 <= min_outputs <= max_outputs <= 64 (got ", in.min_outputs, " and ",
             in.max_outputs, ")");
  op.min_inputs = in.min_inputs;
  op.max_inputs = in.max_inputs;
  op.min_outputs = in.min_outputs;
  op.max_outputs = in.max_outputs;
  op.infer = in.infer;
  op.compute = in.compute;
  op.user_data = in.user_data;
  ONYX_CHECK((in.flags & ~ONYX_OP_RANDOM) == 0, who, ": unknown flags 0x", std::hex, in.flags);
  op.random = (in.flags & ONYX_OP_RANDOM) != 0;
  op.grad_op = cstr(in.grad_op);
  ONYX_CHECK(op.grad_op.empty() || in.num_grad_rules == 0, who,
             ": give the gradient either as grad_op or as grad_rules, not both");
  ONYX_CHECK(in.num_grad_rules >= 0 && (in.num_grad_rules == 0 || in.grad_rules), who,
             ": grad_rules is NULL or num_grad_rules is negative");
  std::set<int> covered;
  for (int r = 0; r < in.num_grad_rules; r++) {
    const OnyxGradRule& src = in.grad_rules[r];
    std::string rwho = cat(who, ", gradient rule ", r, " (input ", src.input, ")");
    ONYX_CHECK(src.input >= 0 && src.input < op.max_inputs, rwho, ": input ", src.input,
               " is out of range (max_inputs ", op.max_inputs, ")");
    ONYX_CHECK(covered.insert(src.input).second, rwho, ": a second rule for input ", src.input);
    ONYX_CHECK(src.num_nodes >= 0 && (src.num_nodes == 0 || src.nodes), rwho,
               ": nodes is NULL or num_nodes is negative");
    Rule rule;
    rule.input = src.input;
    std::set<std::string> locals;
    for (int k = 0; k < src.num_nodes; k++) {
      const OnyxGradNode& n = src.nodes[k];
      std::string nwho = cat(rwho, ", node ", k, " (", cstr(n.op_type), ")");
      RuleNode rn;
      rn.op_type = cstr(n.op_type);
      rn.domain = cstr(n.domain);
      if (rn.domain == "ai.onnx") rn.domain.clear();
      rn.output = cstr(n.output);
      ONYX_CHECK(!rn.op_type.empty(), nwho, ": op_type is empty");
      ONYX_CHECK(!rn.output.empty(), nwho, ": output is empty");
      ONYX_CHECK(n.num_inputs >= 0 && (n.num_inputs == 0 || n.inputs), nwho,
                 ": inputs is NULL or num_inputs is negative");
      ONYX_CHECK(n.num_attrs >= 0 && (n.num_attrs == 0 || n.attrs), nwho,
                 ": attrs is NULL or num_attrs is negative");
      try {
        for (int j = 0; j < n.num_inputs; j++)
          rn.inputs.push_back(
              parse_ref(cstr(n.inputs[j]), locals, op, op.max_inputs, op.max_outputs));
        for (int j = 0; j < n.num_attrs; j++) {
          ONYX_CHECK(n.attrs[j].name && *n.attrs[j].name, "an attribute has no name");
          rn.attrs[n.attrs[j].name] = copy_attribute(n.attrs[j]);
        }
      } catch (const Error& e) {
        throw Error(cat(nwho, ": ", e.what()));
      }
      ONYX_CHECK(!locals.count(rn.output), nwho, ": output '", rn.output, "' is defined twice");
      locals.insert(rn.output);
      rule.nodes.push_back(std::move(rn));
    }
    try {
      rule.result = parse_ref(cstr(src.result), locals, op, op.max_inputs, op.max_outputs);
    } catch (const Error& e) {
      throw Error(cat(rwho, ": result: ", e.what()));
    }
    op.rules.push_back(std::move(rule));
  }
  return op;
}

int api_register_op(void* registrar, const OnyxCustomOp* op) {
  auto* r = static_cast<Registrar*>(registrar);
  if (!r) return ONYX_FAIL;
  try {
    ONYX_CHECK(op, "register_op was called with NULL");
    ONYX_CHECK(op->api_version == ONYX_CUSTOM_OP_API_VERSION,
               "an op was built against custom-op API "
               "version ",
               op->api_version, " but this onyx implements version ", ONYX_CUSTOM_OP_API_VERSION,
               " (rebuild the library against this onyx's "
               "include/onyx/custom_op.h)");
    r->ops.push_back(copy_op(*op, r->origin));
    return ONYX_OK;
  } catch (const std::exception& e) {
    if (r->error.empty()) r->error = e.what();
    return ONYX_FAIL;
  }
}

void api_set_error(void* registrar, const char* message) {
  auto* r = static_cast<Registrar*>(registrar);
  if (r && message) r->library_message = message;
}

// ---- the adapters ---------------------------------------------------------------------------

std::string error_text(const char* buf, int rc) {
  std::string m(buf, strnlen(buf, ONYX_ERROR_CAPACITY));
  return m.empty() ? cat("returned ", rc, " without a message") : m;
}

void check_arity(const Op& op, const ir::Node& node) {
  int ni = (int)node.inputs.size(), no = (int)node.outputs.size();
  ONYX_CHECK(
      ni >= op.min_inputs && ni <= op.max_inputs, node.describe(), ": ", op.who(), " takes ",
      op.min_inputs == op.max_inputs ? cat(op.min_inputs) : cat(op.min_inputs, "..", op.max_inputs),
      " inputs, the node has ", ni);
  ONYX_CHECK(no >= op.min_outputs && no <= op.max_outputs, node.describe(), ": ", op.who(), " has ",
             op.min_outputs == op.max_outputs ? cat(op.min_outputs)
                                              : cat(op.min_outputs, "..", op.max_outputs),
             " outputs, the node has ", no);
}

void infer_custom(const Op& op, runtime::InferContext& ic) {
  const ir::Node& node = ic.node;
  check_arity(op, node);
  std::vector<OnyxTensorInfo> in(node.inputs.size());
  for (size_t i = 0; i < in.size(); i++) {
    std::memset(&in[i], 0, sizeof in[i]);
    if (!ic.has_input((int)i)) continue;
    const TensorMeta& m = *ic.inputs[i];
    ONYX_CHECK(m.rank() <= ONYX_MAX_RANK, node.describe(), ": ", op.who(), ": input ", i,
               " has rank ", m.rank(), " (custom ops take at most ", ONYX_MAX_RANK, ")");
    in[i].dtype = (int32_t)m.dtype;
    in[i].rank = m.rank();
    for (int d = 0; d < m.rank(); d++) in[i].dims[d] = m.shape[d];
  }
  std::vector<OnyxTensorInfo> out(node.outputs.size());
  for (auto& o : out) std::memset(&o, 0, sizeof o);
  if (op.infer) {
    char err[ONYX_ERROR_CAPACITY] = {0};
    OnyxInferContext c{
        as_attrs(node.attrs), op.user_data, (int32_t)in.size(), in.data(), (int32_t)out.size(),
        out.data(),           err};
    int rc = op.infer(&c);
    err[ONYX_ERROR_CAPACITY - 1] = 0;
    ONYX_CHECK(rc == ONYX_OK, node.describe(), ": ", op.who(),
               ": shape inference failed: ", error_text(err, rc));
  } else {
    for (size_t k = 0; k < out.size() && k < in.size(); k++) out[k] = in[k];
  }
  for (size_t k = 0; k < out.size(); k++) {
    if (node.outputs[k].empty()) continue;
    const OnyxTensorInfo& o = out[k];
    ONYX_CHECK(
        o.dtype != ONYX_DTYPE_UNDEFINED, node.describe(), ": ", op.who(), ": shape inference ",
        op.infer ? "did not set" : "(none given: output k = input k) cannot give", " output ", k);
    ONYX_CHECK(is_valid_onnx_dtype(o.dtype) && o.dtype != (int32_t)DType::String, node.describe(),
               ": ", op.who(), ": shape inference gave output ", k, " the invalid dtype ", o.dtype);
    ONYX_CHECK(o.rank >= 0 && o.rank <= ONYX_MAX_RANK, node.describe(), ": ", op.who(),
               ": shape inference gave output ", k, " rank ", o.rank);
    Shape s(o.dims, o.dims + o.rank);
    for (int64_t d : s)
      ONYX_CHECK(d >= 0, node.describe(), ": ", op.who(), ": shape inference gave output ", k,
                 " the shape ", shape_str(s),
                 ": every dim must be known (onyx plans per input "
                 "shape, so the inputs' dims are all known)");
    ic.set_output((int)k, (DType)o.dtype, std::move(s));
  }
}

OnyxTensor tensor_view(const Tensor* t) {
  OnyxTensor v;
  std::memset(&v, 0, sizeof v);
  if (!t || !t->defined()) return v;
  v.dtype = (int32_t)t->dtype();
  v.rank = t->rank();
  v.dims = t->shape().data();
  v.numel = t->numel();
  v.data = const_cast<void*>(t->raw());
  return v;
}

void compute_custom(const Op& op, runtime::KernelContext& kc) {
  const ir::Node& node = kc.node;
  std::vector<OnyxTensor> in, out;
  for (int i = 0; i < kc.num_inputs(); i++)
    in.push_back(tensor_view(kc.has_input(i) ? kc.inputs[i] : nullptr));
  for (size_t k = 0; k < kc.outputs.size(); k++) out.push_back(tensor_view(kc.outputs[k]));
  char err[ONYX_ERROR_CAPACITY] = {0};
  OnyxKernelContext c{as_attrs(node.attrs),
                      op.user_data,
                      (int32_t)in.size(),
                      in.data(),
                      (int32_t)out.size(),
                      out.data(),
                      kc.training ? 1 : 0,
                      kc.seed,
                      err};
  int rc = op.compute(&c);
  err[ONYX_ERROR_CAPACITY - 1] = 0;
  ONYX_CHECK(rc == ONYX_OK, node.describe(), ": ", op.who(),
             ": compute failed: ", error_text(err, rc));
}

// Gradient as a kernel: one grad_op node from [inputs, outputs, output gradients].
void grad_by_kernel(const Op& op, autodiff::GradContext& g) {
  std::vector<std::string> ins;
  for (int k = 0; k < op.max_inputs; k++) ins.push_back(g.I(k));
  for (int k = 0; k < op.max_outputs; k++) ins.push_back(g.O(k));
  for (int k = 0; k < op.max_outputs; k++) ins.push_back(g.GO(k));
  auto outs = g.emit(op.grad_op, ins, g.node().attrs, op.domain, op.max_inputs);
  for (int k = 0; k < op.max_inputs; k++)
    if (g.needs(k)) g.set(k, outs[k]);
}

// Gradient as rules: each needed input's rule evaluated node by node.
void grad_by_rules(const Op& op, autodiff::GradContext& g) {
  for (int k = 0; k < g.num_inputs(); k++) {
    if (!g.needs(k)) continue;
    const Rule* rule = nullptr;
    for (auto& r : op.rules)
      if (r.input == k) rule = &r;
    ONYX_CHECK(rule, "gradient of ", g.node().describe(), ": ", op.who(),
               " has no gradient rule for"
               " input ",
               k, ", which needs a gradient (it depends on a trained parameter)");
    std::string where =
        cat("gradient of ", g.node().describe(), ", ", op.who(), " rule for input ", k);
    DType dt = g.meta(g.I(k)).dtype;
    // An absent output gradient: the rule contributes nothing when every one it reads is absent;
    // otherwise the absent ones are zeros.
    bool reads_go = false, any_go = false;
    auto visit = [&](const Ref& r) {
      if (r.kind != Ref::Kind::GradOutput) return;
      reads_go = true;
      any_go |= !g.GO(r.index).empty();
    };
    for (auto& n : rule->nodes)
      for (auto& r : n.inputs) visit(r);
    visit(rule->result);
    if (reads_go && !any_go) continue;
    std::map<std::string, std::string> local;
    auto resolve = [&](const Ref& r) -> std::string {
      switch (r.kind) {
        case Ref::Kind::Input:
          ONYX_CHECK(!g.I(r.index).empty(), where, ": '", r.text, "': the node has no input ",
                     r.index);
          return g.I(r.index);
        case Ref::Kind::Output:
          ONYX_CHECK(r.index < std::max(g.num_outputs(), op.max_outputs), where, ": '", r.text,
                     "': no such output");
          return g.ensure_output(r.index);
        case Ref::Kind::GradOutput: {
          std::string go = g.GO(r.index);
          if (!go.empty()) return go;
          const TensorMeta& m = g.meta(g.ensure_output(r.index));
          Tensor zero = Tensor::zeros(m.dtype, {1});
          ir::Attribute v;
          v.kind = ir::Attribute::Kind::Tensor;
          v.t = zero;
          return g.emit1("ConstantOfShape", {g.const_i64(m.shape)}, {{"value", v}});
        }
        case Ref::Kind::Const:
          return g.const_scalar(r.value, dt);
        case Ref::Kind::Attr: {
          const ir::Node& n = g.node();
          auto it = n.attrs.find(r.name);
          double v = r.value;
          if (it != n.attrs.end()) {
            ONYX_CHECK(it->second.kind == ir::Attribute::Kind::Float ||
                           it->second.kind == ir::Attribute::Kind::Int,
                       where, ": '", r.text, "': attribute '", r.name,
                       "' is not an int or a float");
            v = it->second.kind == ir::Attribute::Kind::Float ? it->second.f : (double)it->second.i;
          } else {
            ONYX_CHECK(r.has_default, where, ": '", r.text, "': the node has no attribute '",
                       r.name, "' and the rule gives no default");
          }
          return g.const_scalar(v, dt);
        }
        case Ref::Kind::Local:
          return local.at(r.name);
      }
      return "";
    };
    for (auto& n : rule->nodes) {
      std::vector<std::string> ins;
      for (auto& r : n.inputs) ins.push_back(resolve(r));
      try {
        local[n.output] = g.emit1(n.op_type, ins, n.attrs, n.domain);
      } catch (const Error& e) {
        throw Error(cat(where, ", node '", n.output, "' (", n.op_type, "): ", e.what()));
      }
    }
    g.set(k, resolve(rule->result));
  }
}

std::string gradient_text(const Op& op) {
  if (!op.grad_op.empty()) return "kernel " + op.domain + "." + op.grad_op;
  if (op.rules.empty()) return "";
  std::string s = "rules for input";
  s += op.rules.size() > 1 ? "s " : " ";
  for (size_t i = 0; i < op.rules.size(); i++)
    s += (i ? ", " : "") + std::to_string(op.rules[i].input);
  return s;
}

// Checks the library's ops against each other and the registries, then adds them all.
std::vector<CustomOpInfo> commit(std::vector<Op>& ops, const std::string& origin) {
  auto& kernels = runtime::KernelRegistry::instance();
  auto& grads = autodiff::GradRegistry::instance();
  auto& st = state();
  std::set<std::string> keys;
  for (auto& op : ops) {
    ONYX_CHECK(keys.insert(op.key()).second, "custom-op library '", origin, "' registers op '",
               op.key(), "' twice");
    if (kernels.find(op.domain, op.name)) {
      auto it = st.library_of.find(op.key());
      throw Error(cat("custom-op library '", origin, "': op '", op.key(), "' is already registered",
                      it != st.library_of.end() ? cat(" (by library '", it->second, "')")
                                                : std::string(" (built into onyx)")));
    }
  }
  for (auto& op : ops)
    if (!op.grad_op.empty())
      ONYX_CHECK(keys.count(op.domain + "." + op.grad_op), "custom-op library '", origin, "': op '",
                 op.key(), "' names grad_op '", op.grad_op,
                 "', which the library does not register"
                 " in domain '",
                 op.domain, "'");
  std::vector<CustomOpInfo> out;
  for (auto& o : ops) {
    auto op = std::make_shared<const Op>(o);
    runtime::OpKernel k;
    k.infer = [op](runtime::InferContext& ic) { infer_custom(*op, ic); };
    k.compute = [op](runtime::KernelContext& kc) { compute_custom(*op, kc); };
    // A library's kernel computes in the dtypes its infer accepts: a mixed-precision pass must
    // give it what the model gives it (float32), not bf16. Random ops are never folded or merged.
    k.traits.precision = runtime::OpTraits::Precision::Fp32;
    k.traits.random = op->random;
    kernels.add(op->domain, op->name, std::move(k));
    if (!op->grad_op.empty())
      grads.add(op->domain, op->name, [op](autodiff::GradContext& g) { grad_by_kernel(*op, g); });
    else if (!op->rules.empty())
      grads.add(op->domain, op->name, [op](autodiff::GradContext& g) { grad_by_rules(*op, g); });
    CustomOpInfo info{op->domain, op->name, origin, gradient_text(*op)};
    st.ops.push_back(info);
    st.library_of[op->key()] = origin;
    out.push_back(info);
  }
  return out;
}

std::vector<CustomOpInfo> register_locked(OnyxRegisterCustomOpsFn entry,
                                          const std::string& origin) {
  Registrar r;
  r.origin = origin;
  // The table outlives the call (libraries keep it for their kernels' attr_* / parallel_for), so
  // it is never freed; only `registrar` is cleared once registration is over.
  auto* api = new OnyxCustomOpApi;
  std::memset(api, 0, sizeof *api);
  api->version = ONYX_CUSTOM_OP_API_VERSION;
  api->size = sizeof(OnyxCustomOpApi);
  api->registrar = &r;
  api->register_op = api_register_op;
  api->set_error = api_set_error;
  api->attr_int = api_attr_int;
  api->attr_float = api_attr_float;
  api->attr_string = api_attr_string;
  api->attr_ints = api_attr_ints;
  api->attr_floats = api_attr_floats;
  api->parallel_for = api_parallel_for;
  int rc = entry(api);
  api->registrar = nullptr;
  std::string lib = cat("custom-op library '", origin, "'");
  if (rc == ONYX_ERR_API_VERSION)
    throw Error(
        cat(lib, " does not support this onyx's custom-op API version ", ONYX_CUSTOM_OP_API_VERSION,
            " (onyx_register_custom_ops returned "
            "ONYX_ERR_API_VERSION; rebuild it against this onyx's include/onyx/custom_op.h)",
            r.library_message.empty() ? "" : ": " + r.library_message));
  if (!r.error.empty()) throw Error(cat(lib, ": ", r.error));
  if (rc != ONYX_OK)
    throw Error(cat(lib, ": onyx_register_custom_ops failed (returned ", rc, ")",
                    r.library_message.empty() ? "" : ": " + r.library_message));
  ONYX_CHECK(!r.ops.empty(), lib, ": onyx_register_custom_ops registered no ops");
  return commit(r.ops, origin);
}

}  // namespace

std::vector<CustomOpInfo> register_custom_ops(OnyxRegisterCustomOpsFn entry,
                                              const std::string& origin) {
  ONYX_CHECK(entry, "register_custom_ops: no entry point for '", origin, "'");
  std::lock_guard<std::mutex> lock(state().mu);
  return register_locked(entry, origin);
}

std::vector<CustomOpInfo> load_custom_op_library(const std::string& path) {
  std::string lib = cat("custom-op library '", path, "'");
  ONYX_CHECK(!path.empty(), "custom-op library: empty path");
  bool has_dir = path.find('/') != std::string::npos;
  std::error_code ec;
  bool exists = fs::exists(path, ec);
  ONYX_CHECK(exists || !has_dir, lib, " does not exist");
  // A bare name that is not a file here is looked up by dlopen (LD_LIBRARY_PATH, ld.so.cache).
  std::string open_path = exists ? fs::absolute(path).string() : path;
  std::string canonical = exists ? fs::canonical(path, ec).string() : path;
  if (exists) ONYX_CHECK(!fs::is_directory(path), lib, " is a directory, not a shared library");
  auto& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.loaded.count(canonical)) return {};
  dlerror();
  void* h = dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    throw Error(cat(lib,
                    exists ? " cannot be loaded: " : " does not exist and dlopen cannot find it: ",
                    e ? e : "dlopen failed"));
  }
  dlerror();
  auto entry = reinterpret_cast<OnyxRegisterCustomOpsFn>(dlsym(h, "onyx_register_custom_ops"));
  if (!entry) {
    dlclose(h);
    throw Error(
        cat(lib,
            " does not export onyx_register_custom_ops (define it with "
            "ONYX_CUSTOM_OP_EXPORT and C linkage, as include/onyx/custom_op.h declares it)"));
  }
  std::vector<CustomOpInfo> ops;
  try {
    ops = register_locked(entry, path);
  } catch (...) {
    dlclose(h);  // nothing of it was registered
    throw;
  }
  st.loaded[canonical] = path;  // never dlclosed: its functions are now kernels
  return ops;
}

std::vector<CustomOpInfo> custom_ops() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().ops;
}

}  // namespace onyx
