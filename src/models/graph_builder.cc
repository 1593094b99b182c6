// graph_builder.cc — see graph_builder.h.
#include "models/graph_builder.h"

#include <cmath>

#include "ir/bf16_storage.h"
#include "quant/store_4bit.h"

namespace onyx::models {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Standard normal draws (Box-Muller over 53-bit uniforms) from a splitmix64 stream.
struct NormalStream {
  uint64_t state;
  bool has_spare = false;
  double spare = 0;
  double uniform() { return ((splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double next() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    double u1 = uniform(), u2 = uniform();
    double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
    spare = r * std::sin(th);
    has_spare = true;
    return r * std::cos(th);
  }
};

}  // namespace

Tensor init_parameter(uint64_t seed, const std::string& name, const Shape& shape,
                      const Init& init) {
  Tensor t = Tensor::zeros(DType::Float32, shape);
  float* p = t.data<float>();
  int64_t n = t.numel();
  NormalStream rng{seed * 0x9e3779b97f4a7c15ull ^ fnv1a(name)};
  switch (init.kind) {
    case Init::Zeros:
      break;
    case Init::Ones:
      for (int64_t i = 0; i < n; i++) p[i] = 1.0f;
      break;
    case Init::Normal:
      for (int64_t i = 0; i < n; i++) p[i] = (float)(init.std * rng.next());
      break;
    case Init::Uniform:
      for (int64_t i = 0; i < n; i++) p[i] = (float)(init.std * (2.0 * rng.uniform() - 1.0));
      break;
    case Init::TruncNormal:  // torch.nn.init.trunc_normal_(std=s, a=-2, b=2): redraw outside [a, b]
      for (int64_t i = 0; i < n; i++) {
        double v;
        do v = init.std * rng.next();
        while (v < -2.0 || v > 2.0);
        p[i] = (float)v;
      }
      break;
  }
  if (init.zero_row >= 0 && shape.size() == 2 && init.zero_row < shape[0])
    std::fill(p + init.zero_row * shape[1], p + (init.zero_row + 1) * shape[1], 0.0f);
  return t;
}

GraphBuilder::GraphBuilder(std::string graph_name, uint64_t seed) : seed_(seed) {
  g_.name = std::move(graph_name);
  g_.opsets[""] = 17;
  g_.ir_version = 8;
  g_.producer_name = "onyx";
}

std::string GraphBuilder::fresh(const std::string& base) {
  int n = counters_[base]++;
  return n ? cat(base, "_", n) : base;
}

std::string GraphBuilder::input(const std::string& name, DType dtype, const Shape& shape,
                                const std::vector<std::string>& dim_params) {
  ir::ValueInfo vi;
  vi.name = name;
  vi.dtype = dtype;
  vi.shape = shape;
  vi.dim_params = dim_params;
  vi.dim_params.resize(shape.size());
  vi.has_shape = true;
  g_.inputs.push_back(vi);
  return name;
}

void GraphBuilder::output(const std::string& name, DType dtype, const Shape& shape) {
  ir::ValueInfo vi;
  vi.name = name;
  vi.dtype = dtype;
  vi.shape = shape;
  vi.dim_params.resize(shape.size());
  vi.has_shape = true;
  g_.outputs.push_back(vi);
}

std::string GraphBuilder::param(const std::string& name, const Shape& shape, const Init& init) {
  ONYX_CHECK(!g_.initializers.count(name), "model builder: parameter '", name, "' defined twice");
  g_.add_initializer(name, init_parameter(seed_, name, shape, init));
  return name;
}

std::vector<std::string> GraphBuilder::op_n(const std::string& type,
                                            const std::vector<std::string>& inputs,
                                            std::map<std::string, ir::Attribute> attrs,
                                            int num_outputs) {
  ir::Node n;
  n.op_type = type;
  n.name = fresh(scope_.empty() ? type : scope_ + "/" + type);
  n.inputs = inputs;
  n.attrs = std::move(attrs);
  for (int i = 0; i < num_outputs; i++)
    n.outputs.push_back(fresh(n.name + ":" + std::to_string(i)));
  g_.nodes.push_back(n);
  return n.outputs;
}

std::string GraphBuilder::op(const std::string& type, const std::vector<std::string>& inputs,
                             std::map<std::string, ir::Attribute> attrs, const std::string& out) {
  std::string o = op_n(type, inputs, std::move(attrs), 1)[0];
  if (!out.empty()) g_.nodes.back().outputs[0] = o = out;
  return o;
}

std::string GraphBuilder::const_tensor(const Tensor& t) {
  std::string key = cat(dtype_name(t.dtype()), shape_str(t.shape()), ":");
  key.append(static_cast<const char*>(t.raw()), t.nbytes());
  auto it = constants_.find(key);
  if (it != constants_.end()) return it->second;
  std::string saved = scope_;
  scope_ = "const";
  std::string o = op("Constant", {}, {{"value", Attr::of_tensor(t)}});
  scope_ = saved;
  return constants_[key] = o;
}
std::string GraphBuilder::const_i64(const std::vector<int64_t>& v) {
  return const_tensor(Tensor::from_vector<int64_t>(DType::Int64, {(int64_t)v.size()}, v));
}
std::string GraphBuilder::scalar_i64(int64_t v) { return const_tensor(Tensor::scalar_i64(v)); }
std::string GraphBuilder::scalar_f32(float v) { return const_tensor(Tensor::scalar_f32(v)); }
std::string GraphBuilder::scalar_bool(bool v) {
  Tensor t(DType::Bool, {});
  *t.data<bool>() = v;
  return const_tensor(t);
}

std::string GraphBuilder::dim_of(const std::string& x, int64_t dim) {
  return op("Shape", {x}, {{"start", Attr::of_int(dim)}, {"end", Attr::of_int(dim + 1)}});
}

std::string GraphBuilder::gather_rows(const std::string& table, const std::string& ids) {
  return op("Gather", {table, ids}, {{"axis", Attr::of_int(0)}});
}

std::string GraphBuilder::gather_rows_padded(const std::string& table, const std::string& ids,
                                             int64_t padding_idx) {
  std::string x = gather_rows(table, ids);  // (B,T,C)
  std::string detached = op("StopGradient", {x});
  g_.nodes.back().domain = "onyx";
  std::string pad = op("Unsqueeze", {op("Equal", {ids, scalar_i64(padding_idx)}), const_i64({-1})});
  return op("Where", {pad, detached, x});
}

std::string GraphBuilder::leading_rows(const std::string& table, const std::string& like,
                                       int64_t axis) {
  return op("Slice", {table, const_i64({0}), dim_of(like, axis), const_i64({0})});
}

// ---- layers ----------------------------------------------------------------------------------

std::string GraphBuilder::linear(const std::string& x, const std::string& name, int64_t in,
                                 int64_t out, const Init& w_init, bool bias,
                                 const std::string& out_name) {
  // x (..., in) @ W^T (in, out) + b (out) -> (..., out)
  set_scope(name);
  std::string w = param(name + ".weight", {out, in}, w_init);
  if (quantize_ && quant::quantizes_module(*quantize_, w)) {  // 4-bit, read through its dequant
    quant::quantize_initializer_4bit(g_, w, *quantize_, w);
    w += "/float32";
  } else if (bf16_linears_) {  // LoRA's frozen bf16 base, read through its Cast
    ir::store_initializer_bf16(g_, w);
    w += "/float32";
  }
  std::string wt = op("Transpose", {w}, {{"perm", Attr::of_ints({1, 0})}});
  if (!bias) return op("MatMul", {x, wt}, {}, out_name);
  std::string b = param(name + ".bias", {out}, Init::zeros());
  return op("Add", {op("MatMul", {x, wt}), b}, {}, out_name);
}

std::string GraphBuilder::conv1d(const std::string& x, const std::string& name, int64_t in,
                                 int64_t out, const Init& w_init) {
  // x (..., in) @ W (in, out) + b (out) -> (..., out)
  set_scope(name);
  std::string w = param(name + ".weight", {in, out}, w_init);
  std::string b = param(name + ".bias", {out}, Init::zeros());
  return op("Add", {op("MatMul", {x, w}), b});
}

std::string GraphBuilder::layer_norm(const std::string& x, const std::string& name, int64_t dim,
                                     double eps) {
  // (..., dim) normalized over the last axis, then * weight + bias
  set_scope(name);
  std::string w = param(name + ".weight", {dim}, Init::ones());
  std::string b = param(name + ".bias", {dim}, Init::zeros());
  return op("LayerNormalization", {x, w, b},
            {{"axis", Attr::of_int(-1)}, {"epsilon", Attr::of_float((float)eps)}});
}

std::string GraphBuilder::rms_norm(const std::string& x, const std::string& name, int64_t dim,
                                   double eps) {
  std::string w = param(name + ".weight", {dim}, Init::ones());
  set_scope(name);
  std::string var = op("ReduceMean", {op("Mul", {x, x})},
                       {{"axes", Attr::of_ints({-1})}, {"keepdims", Attr::of_int(1)}});
  std::string r = op("Reciprocal", {op("Sqrt", {op("Add", {var, scalar_f32((float)eps)})})});
  return op("Mul", {w, op("Mul", {x, r})});
}

std::string GraphBuilder::embedding(const std::string& ids, const std::string& name, int64_t rows,
                                    int64_t dim, double init_std, int64_t padding_idx) {
  // table (rows, dim) gathered at ids (...) -> (..., dim)
  set_scope(name);
  std::string w = param(name + ".weight", {rows, dim}, Init::normal(init_std, padding_idx));
  return gather_rows(w, ids);
}

std::string GraphBuilder::dropout(const std::string& x, double p) {
  if (p <= 0) return x;
  return op("Dropout", {x, scalar_f32((float)p), scalar_bool(true)});
}

std::string GraphBuilder::activation(const std::string& x, const std::string& act) {
  if (act == "relu") return op("Relu", {x});
  if (act == "gelu") {
    // 0.5 * x * (1 + erf(x / sqrt(2)))
    std::string e = op("Erf", {op("Div", {x, scalar_f32((float)M_SQRT2)})});
    return op("Mul", {op("Mul", {x, scalar_f32(0.5f)}), op("Add", {e, scalar_f32(1.0f)})});
  }
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") {
    // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    std::string x3 = op("Mul", {op("Mul", {x, x}), x});
    std::string inner = op("Add", {x, op("Mul", {x3, scalar_f32(0.044715f)})});
    std::string t = op("Tanh", {op("Mul", {inner, scalar_f32((float)std::sqrt(2.0 / M_PI))})});
    return op("Mul", {op("Mul", {x, scalar_f32(0.5f)}), op("Add", {t, scalar_f32(1.0f)})});
  }
  if (act == "silu") return op("Mul", {x, op("Sigmoid", {x})});
  if (act == "quick_gelu")
    return op("Mul", {x, op("Sigmoid", {op("Mul", {x, scalar_f32(1.702f)})})});
  throw Error(cat("activation '", act, "' is not supported"));
}

// ---- attention pieces ------------------------------------------------------------------------

std::string GraphBuilder::split_heads(const std::string& x, int64_t nh, int64_t hs) {
  // (B,T,C) -> (B,T,nh,hs) -> (B,nh,T,hs)
  std::string r = op("Reshape", {x, const_i64({0, 0, nh, hs})});
  return op("Transpose", {r}, {{"perm", Attr::of_ints({0, 2, 1, 3})}});
}

std::string GraphBuilder::split_heads_transposed(const std::string& x, int64_t nh, int64_t hs) {
  // (B,T,C) -> (B,T,nh,hs) -> (B,nh,hs,T)
  std::string r = op("Reshape", {x, const_i64({0, 0, nh, hs})});
  return op("Transpose", {r}, {{"perm", Attr::of_ints({0, 2, 3, 1})}});
}

std::string GraphBuilder::merge_heads(const std::string& x, int64_t c) {
  // (B,nh,T,hs) -> (B,T,nh,hs) -> (B,T,C)
  std::string t = op("Transpose", {x}, {{"perm", Attr::of_ints({0, 2, 1, 3})}});
  return op("Reshape", {t, const_i64({0, 0, c})});
}

}  // namespace onyx::models
