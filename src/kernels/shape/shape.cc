// kernels/shape/shape.cc — the shape family's view-like and
// constant-producing ops: Reshape, Flatten, Squeeze, Unsqueeze, Identity, onyx.StopGradient, Shape,
// Size, Constant, ConstantOfShape, Range, EyeLike. The view-like ops are a memcpy (the planner may
// alias them); their infer functions carry the ONNX shape rules. The other sub-families live in
// transpose.cc, slice.cc and gather.cc.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/shape/shape_common.h"

namespace onyx::kernels {
namespace shape_detail {
namespace {

// Output = input bytes (Reshape, Flatten, Squeeze, Unsqueeze, Identity).
void copy_input0(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  ONYX_CHECK(x.nbytes() == y.nbytes(), ctx.node.describe(), ": output ", shape_str(y.shape()),
             " does not hold the input's ", x.numel(), " elements");
  parallel_memcpy(y.raw(), x.raw(), x.nbytes());
}

// ---- Reshape ----
Shape reshape_target(const ir::Node& node, const Shape& in, const std::vector<int64_t>& req,
                     bool allowzero) {
  Shape out(req.begin(), req.end());
  int neg = -1;
  int64_t known = 1;
  for (size_t i = 0; i < req.size(); i++) {
    int64_t v = req[i];
    if (v == -1) {
      ONYX_CHECK(neg < 0, node.describe(), ": shape ", shape_str(req), " has more than one -1");
      neg = (int)i;
      continue;
    }
    if (v == 0 && !allowzero) {
      ONYX_CHECK(i < in.size(), node.describe(), ": shape ", shape_str(req), " copies dim ", i,
                 " (0) but the input ", shape_str(in), " has rank ", in.size());
      out[i] = in[i];
    } else {
      ONYX_CHECK(v >= 0, node.describe(), ": invalid dimension ", v, " in shape ", shape_str(req));
    }
    known *= out[i];
  }
  int64_t n = shape_numel(in);
  if (neg >= 0) {
    ONYX_CHECK(known != 0 && n % known == 0, node.describe(), ": cannot reshape ", shape_str(in),
               " (", n, " elements) to ", shape_str(req), ": -1 cannot be inferred");
    out[neg] = n / known;
  }
  ONYX_CHECK(shape_numel(out) == n, node.describe(), ": cannot reshape ", shape_str(in), " (", n,
             " elements) to ", shape_str(out), " (", shape_numel(out), " elements; requested ",
             shape_str(req), ")");
  return out;
}

void reshape_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  std::vector<int64_t> req;
  if (ctx.opset < 5) {
    req = ctx.node.attr_ints_required("shape");
  } else {
    req = ctx.value(1).to_int64_vector();
  }
  bool allowzero = ctx.opset >= 14 && ctx.node.attr_int("allowzero", 0) != 0;
  ctx.set_output(0, x.dtype, reshape_target(ctx.node, x.shape, req, allowzero));
}

// ---- Flatten ----
void flatten_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  int64_t r = x.rank(), axis = ctx.node.attr_int("axis", 1);
  ONYX_CHECK(axis >= -r && axis <= r, ctx.node.describe(), ": axis ", axis,
             " is out of range for input ", shape_str(x.shape));
  if (axis < 0) axis += r;
  ctx.set_output(0, x.dtype, {prod(x.shape, 0, axis), prod(x.shape, axis, r)});
}

// ---- Squeeze / Unsqueeze ----
void squeeze_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  int64_t r = x.rank();
  bool have_axes = false;
  std::vector<int64_t> axes;
  if (ctx.opset < 13) {
    have_axes = ctx.node.has_attr("axes");
    axes = ctx.node.attr_ints("axes");
  } else if (ctx.has_input(1)) {
    have_axes = true;
    axes = ctx.value(1).to_int64_vector();
  }
  std::vector<bool> drop(r, false);
  if (have_axes) {
    for (int64_t a : axes) {
      int64_t ax = normalize_axis(a, r, ctx.node);
      ONYX_CHECK(x.shape[ax] == 1, ctx.node.describe(), ": cannot squeeze axis ", a, " of ",
                 shape_str(x.shape), ": its size is ", x.shape[ax], ", not 1");
      drop[ax] = true;
    }
  } else {
    for (int64_t i = 0; i < r; i++) drop[i] = x.shape[i] == 1;
  }
  Shape out;
  for (int64_t i = 0; i < r; i++)
    if (!drop[i]) out.push_back(x.shape[i]);
  ctx.set_output(0, x.dtype, out);
}

void unsqueeze_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  std::vector<int64_t> axes =
      ctx.opset < 13 ? ctx.node.attr_ints_required("axes") : ctx.value(1).to_int64_vector();
  int64_t r = x.rank() + (int64_t)axes.size();
  std::vector<bool> ins(r, false);
  for (int64_t a : axes) {
    int64_t ax = normalize_axis(a, r, ctx.node);
    ONYX_CHECK(!ins[ax], ctx.node.describe(), ": axis ", a, " is repeated in axes ",
               shape_str(axes));
    ins[ax] = true;
  }
  Shape out(r);
  size_t j = 0;
  for (int64_t i = 0; i < r; i++) out[i] = ins[i] ? 1 : x.shape[j++];
  ctx.set_output(0, x.dtype, out);
}

// ---- Shape / Size ----
std::pair<int64_t, int64_t> shape_range(const ir::Node& node, int64_t opset, int64_t r) {
  int64_t start = 0, end = r;
  if (opset >= 15) {
    start = node.attr_int("start", 0);
    end = node.attr_int("end", r);
  }
  auto clampi = [r](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + r : v, 0, r); };
  start = clampi(start);
  end = clampi(end);
  return {start, std::max(start, end)};
}

void shape_infer(InferContext& ctx) {
  auto [s, e] = shape_range(ctx.node, ctx.opset, ctx.input(0).rank());
  ctx.set_output(0, DType::Int64, {e - s});
}

void shape_compute(KernelContext& ctx) {
  const Shape& in = ctx.input(0).shape();
  auto [s, e] = shape_range(ctx.node, ctx.opset, (int64_t)in.size());
  int64_t* y = ctx.output(0).data<int64_t>();
  for (int64_t i = s; i < e; i++) y[i - s] = in[i];
}

// ---- Constant ----
Tensor constant_value(const ir::Node& node) {
  auto it = node.attrs.find("value");
  if (it != node.attrs.end()) {
    ONYX_CHECK(it->second.t.defined(), node.describe(), ": attribute 'value' holds no tensor");
    if (it->second.t.dtype() == DType::String)
      ONYX_UNSUPPORTED(node.describe(), ": string constants are not supported");
    return it->second.t;
  }
  if ((it = node.attrs.find("value_float")) != node.attrs.end())
    return Tensor::scalar_f32(it->second.f);
  if ((it = node.attrs.find("value_int")) != node.attrs.end())
    return Tensor::scalar_i64(it->second.i);
  if ((it = node.attrs.find("value_floats")) != node.attrs.end())
    return Tensor::from_vector(DType::Float32, {(int64_t)it->second.floats.size()},
                               it->second.floats);
  if ((it = node.attrs.find("value_ints")) != node.attrs.end())
    return Tensor::from_vector(DType::Int64, {(int64_t)it->second.ints.size()}, it->second.ints);
  for (const char* k : {"value_string", "value_strings", "sparse_value"})
    if (node.has_attr(k)) ONYX_UNSUPPORTED(node.describe(), ": Constant attribute '", k, "'");
  throw Error(cat(node.describe(), ": Constant has no value attribute"));
}

// ---- ConstantOfShape ----
Tensor constant_of_shape_value(const ir::Node& node) {
  const Tensor* v = node.attr_tensor("value");
  if (!v || !v->defined()) {
    Tensor z = Tensor::zeros(DType::Float32, {1});
    return z;
  }
  ONYX_CHECK(v->numel() == 1, node.describe(), ": attribute 'value' must hold one element, has ",
             shape_str(v->shape()));
  elem_size(v->dtype(), node);
  return *v;
}

Shape shape_from_values(const ir::Node& node, const Tensor& t) {
  Shape s = t.to_int64_vector();
  for (int64_t d : s)
    ONYX_CHECK(d >= 0, node.describe(), ": negative dimension in shape ", shape_str(s));
  return s;
}

// ---- Range ----
int64_t range_count_int(int64_t start, int64_t limit, int64_t delta) {
  if (delta > 0) return limit > start ? (limit - start + delta - 1) / delta : 0;
  return limit < start ? (start - limit + (-delta) - 1) / (-delta) : 0;
}

int64_t range_count(const ir::Node& node, const Tensor& s, const Tensor& l, const Tensor& d) {
  for (const Tensor* t : {&s, &l, &d})
    ONYX_CHECK(t->numel() == 1, node.describe(), ": start, limit and delta must be scalars, got ",
               shape_str(t->shape()));
  ONYX_CHECK(s.dtype() == l.dtype() && s.dtype() == d.dtype(), node.describe(),
             ": start, limit and delta must share a dtype");
  if (is_float(s.dtype())) {
    double a = s.get_as_double(0), b = l.get_as_double(0), c = d.get_as_double(0);
    ONYX_CHECK(c != 0, node.describe(), ": delta is 0");
    return std::max<int64_t>(0, (int64_t)std::ceil((b - a) / c));
  }
  if (!is_integer(s.dtype()))
    ONYX_UNSUPPORTED(node.describe(), ": dtype ", dtype_name(s.dtype()), " is not supported");
  int64_t a = s.to_int64_vector()[0], b = l.to_int64_vector()[0], c = d.to_int64_vector()[0];
  ONYX_CHECK(c != 0, node.describe(), ": delta is 0");
  return range_count_int(a, b, c);
}

void range_infer(InferContext& ctx) {
  const Tensor &s = ctx.value(0), &l = ctx.value(1), &d = ctx.value(2);
  ctx.set_output(0, s.dtype(), {range_count(ctx.node, s, l, d)});
}

void range_compute(KernelContext& ctx) {
  const Tensor &s = ctx.input(0), &d = ctx.input(2);
  Tensor& y = ctx.output(0);
  int64_t n = y.numel();
  if (is_float(s.dtype())) {
    double a = s.get_as_double(0), c = d.get_as_double(0);
    dispatch_dtype(s.dtype(), ctx.node, [&]<class S>() {
      using C = typename Arith<S>::C;
      C ac = (C)a, cc = (C)c;
      S* out = y.data<S>();
      for (int64_t i = 0; i < n; i++) out[i] = Arith<S>::store(ac + (C)i * cc);
    });
  } else {
    int64_t a = s.to_int64_vector()[0], c = d.to_int64_vector()[0];
    dispatch_dtype(s.dtype(), ctx.node, [&]<class S>() {
      if constexpr (std::is_integral_v<S>) {
        S* out = y.data<S>();
        for (int64_t i = 0; i < n; i++) out[i] = (S)(a + i * c);
      }
    });
  }
}

// ---- EyeLike ----
DType eyelike_dtype(const ir::Node& node, DType in) {
  if (!node.has_attr("dtype")) return in;
  int64_t code = node.attr_int("dtype", 0);
  if (!is_valid_onnx_dtype((int32_t)code) || code == (int64_t)DType::String)
    ONYX_UNSUPPORTED(node.describe(), ": dtype code ", code, " is not supported");
  return (DType)code;
}

void eyelike_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  ONYX_CHECK(x.rank() == 2, ctx.node.describe(), ": input must be 2-D, got ", shape_str(x.shape));
  ctx.set_output(0, eyelike_dtype(ctx.node, x.dtype), x.shape);
}

void eyelike_compute(KernelContext& ctx) {
  Tensor& y = ctx.output(0);
  int64_t rows = y.dim(0), cols = y.dim(1), k = ctx.node.attr_int("k", 0);
  std::memset(y.raw(), 0, y.nbytes());
  for (int64_t i = 0; i < rows; i++) {
    int64_t j = i + k;
    if (j >= 0 && j < cols) store_double(y.dtype(), y.raw(), i * cols + j, 1.0, ctx.node);
  }
}

}  // namespace
}  // namespace shape_detail

ONYX_REGISTER_KERNELS(shape, Cpu) {
  using namespace shape_detail;
  // Reshape-likes are views: the planner aliases their output to the input's memory.
  for (OpTraits* t : {&r.add("", "Reshape", {reshape_infer, copy_input0, {1}}),
                      &r.add("", "Flatten", {flatten_infer, copy_input0, {}}),
                      &r.add("", "Squeeze", {squeeze_infer, copy_input0, {1}}),
                      &r.add("", "Unsqueeze", {unsqueeze_infer, copy_input0, {1}})})
    t->view = t->reshape_like = true;
  auto as_input = [](InferContext& ctx) {
    const auto& x = ctx.input(0);
    ctx.set_output(0, x.dtype, x.shape);
  };
  // onyx.StopGradient: Identity whose output carries no gradient (autodiff stops there; PyTorch's
  // detach()), e.g. GRPO's old log-probabilities when they are the current ones
  for (OpTraits* t : {&r.add("", "Identity", {as_input, copy_input0, {}}),
                      &r.add("onyx", "StopGradient", {as_input, copy_input0, {}})}) {
    t->view = true;
    t->per_token = OpTraits::PerToken::Unary;
  }

  r.add("", "Shape", {shape_infer, shape_compute, {}}).meta_only_inputs = {0};
  r.add("", "Size",
        {[](InferContext& ctx) {
           ctx.input(0);
           ctx.set_output(0, DType::Int64, {});
         },
         [](KernelContext& ctx) { *ctx.output(0).data<int64_t>() = ctx.input(0).numel(); },
         {}})
      .meta_only_inputs = {0};

  r.add("", "Constant",
        {[](InferContext& ctx) {
           Tensor v = constant_value(ctx.node);
           ctx.set_output(0, v.dtype(), v.shape());
         },
         [](KernelContext& ctx) {
           Tensor v = constant_value(ctx.node);
           std::memcpy(ctx.output(0).raw(), v.raw(), v.nbytes());
         },
         {}});

  r.add("", "ConstantOfShape",
        {[](InferContext& ctx) {
           Tensor v = constant_of_shape_value(ctx.node);
           ctx.set_output(0, v.dtype(), shape_from_values(ctx.node, ctx.value(0)));
         },
         [](KernelContext& ctx) {
           Tensor v = constant_of_shape_value(ctx.node);
           Tensor& y = ctx.output(0);
           fill_elements(y.raw(), y.numel(), v.raw(), dtype_size(v.dtype()));
         },
         {0}});

  r.add("", "Range", {range_infer, range_compute, {0, 1, 2}});
  r.add("", "EyeLike", {eyelike_infer, eyelike_compute, {}});
}

}  // namespace onyx::kernels
