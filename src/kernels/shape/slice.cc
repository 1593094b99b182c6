// kernels/shape/slice.cc — ops that cut, join or frame tensors along axes: Slice, Concat, Split,
// Pad, Trilu, Compress, and Slice's fused gradient onyx.SliceGrad (emitted by the rule in
// autodiff/gradients/shape.cc):
//   SliceGrad(dy)  shape starts steps   dx = zeros(shape); dx[start + i·step] = dy[i]
// (starts/steps resolved per dim: the rule applies ONNX's clamping; steps may be negative).
// Slice is a strided copy and SliceGrad a strided scatter into zeros; Concat/Split are per-row
// memcpy over the dims before the axis; Pad maps each output index to a source index per dim
// (constant/reflect/edge/wrap). Byte-generic (element size, not dtype), threaded over rows.
#include <algorithm>

#include "kernels/shape/shape_common.h"

namespace onyx::kernels::shape_detail {
namespace {

// ---- Slice ----
struct SlicePlan {
  std::vector<int64_t> start, step;
  Shape count;  // output shape
};

SlicePlan slice_plan(const ir::Node& node, const Shape& in, const std::vector<int64_t>& starts,
                     const std::vector<int64_t>& ends, std::vector<int64_t> axes,
                     std::vector<int64_t> steps) {
  int64_t r = (int64_t)in.size();
  SlicePlan p{std::vector<int64_t>(r, 0), std::vector<int64_t>(r, 1), in};
  ONYX_CHECK(starts.size() == ends.size(), node.describe(), ": starts ", shape_str(starts),
             " and ends ", shape_str(ends), " differ in length");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); i++) axes.push_back((int64_t)i);
  if (steps.empty()) steps.assign(starts.size(), 1);
  ONYX_CHECK(axes.size() == starts.size() && steps.size() == starts.size(), node.describe(),
             ": starts ", shape_str(starts), ", axes ", shape_str(axes), " and steps ",
             shape_str(steps), " differ in length");
  std::vector<bool> seen(r, false);
  for (size_t i = 0; i < starts.size(); i++) {
    int64_t ax = normalize_axis(axes[i], r, node);
    ONYX_CHECK(!seen[ax], node.describe(), ": axis ", axes[i], " is repeated in axes ",
               shape_str(axes));
    seen[ax] = true;
    int64_t step = steps[i], dim = in[ax], s = starts[i], e = ends[i];
    ONYX_CHECK(step != 0, node.describe(), ": step 0 on axis ", axes[i]);
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int64_t count;
    if (dim == 0) {
      s = 0;
      count = 0;
    } else if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      count = e > s ? (e - s - 1) / step + 1 : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      count = s > e ? (s - e - 1) / (-step) + 1 : 0;
    }
    p.start[ax] = count > 0 ? s : 0;
    p.step[ax] = step;
    p.count[ax] = count;
  }
  return p;
}

// starts/ends/axes/steps: inputs 1..4 from opset 10, attributes before.
template <class Ctx, class Get>
SlicePlan slice_plan_from(const Ctx& ctx, const Shape& in, Get&& get) {
  const ir::Node& n = ctx.node;
  if (ctx.opset < 10)
    return slice_plan(n, in, n.attr_ints_required("starts"), n.attr_ints_required("ends"),
                      n.attr_ints("axes"), {});
  return slice_plan(n, in, get(1)->to_int64_vector(), get(2)->to_int64_vector(),
                    ctx.has_input(3) ? get(3)->to_int64_vector() : std::vector<int64_t>{},
                    ctx.has_input(4) ? get(4)->to_int64_vector() : std::vector<int64_t>{});
}

void slice_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  auto p = slice_plan_from(ctx, x.shape, [&](int i) { return &ctx.value(i); });
  ctx.set_output(0, x.dtype, p.count);
}

void slice_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto p = slice_plan_from(ctx, x.shape(), [&](int i) { return &ctx.input(i); });
  size_t es = elem_size(x.dtype(), ctx.node);
  auto st = contiguous_strides(x.shape());
  int64_t off = 0;
  std::vector<int64_t> sst(st.size());
  for (size_t d = 0; d < st.size(); d++) {
    off += p.start[d] * st[d];
    sst[d] = st[d] * p.step[d];
  }
  strided_copy(ctx.output(0).raw(), (const char*)x.raw() + off * (int64_t)es, p.count, sst, es);
}

// ---- onyx.SliceGrad ----

void slice_grad_infer(InferContext& ctx) {
  const auto& dy = ctx.input(0);
  Shape x = ctx.node.attr_ints_required("shape");
  auto st = ctx.node.attr_ints_required("starts");
  auto sp = ctx.node.attr_ints_required("steps");
  ONYX_CHECK(st.size() == x.size() && sp.size() == x.size() && dy.shape.size() == x.size(),
             ctx.node.describe(), ": SliceGrad shape ", shape_str(x), ", starts ", shape_str(st),
             ", steps ", shape_str(sp), " and dy ", shape_str(dy.shape), " differ in rank");
  for (size_t d = 0; d < x.size(); d++) {
    int64_t n = dy.shape[d];
    if (n == 0) continue;
    int64_t last = st[d] + (n - 1) * sp[d];
    ONYX_CHECK(sp[d] != 0 && st[d] >= 0 && st[d] < x[d] && last >= 0 && last < x[d],
               ctx.node.describe(), ": dy ", shape_str(dy.shape), " with starts ", shape_str(st),
               " and steps ", shape_str(sp), " does not fit in ", shape_str(x));
  }
  ctx.set_output(0, dy.dtype, x);
}

void slice_grad_compute(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);  // the sliced region
  Tensor& dx = ctx.output(0);       // (shape)
  auto st = ctx.node.attr_ints_required("starts");
  auto sp = ctx.node.attr_ints_required("steps");
  size_t es = elem_size(dx.dtype(), ctx.node);
  char* out = (char*)dx.raw();
  // Zero, in parallel chunks.
  int64_t bytes = (int64_t)dx.nbytes();
  parallel_for(bytes, 1 << 20, [&](int64_t b, int64_t e) { std::memset(out + b, 0, e - b); });
  if (dy.numel() == 0) return;
  const Shape& ys = dy.shape();
  int r = (int)ys.size();
  auto xs = contiguous_strides(dx.shape());
  int64_t base = 0;
  std::vector<int64_t> ost(r);  // output stride per dy index step
  for (int d = 0; d < r; d++) {
    base += st[d] * xs[d];
    ost[d] = xs[d] * sp[d];
  }
  if (r == 0) {
    std::memcpy(out, dy.raw(), es);
    return;
  }
  int64_t inner = ys[r - 1], rows = dy.numel() / inner, istep = ost[r - 1];
  by_elem_size(es, [&]<class U>() {
    const U* src = dy.data<U>();
    U* dst = (U*)out;
    parallel_for(rows, std::max<int64_t>(1, 16384 / inner), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; row++) {
        int64_t off = base, rem = row;
        for (int d = r - 2; d >= 0; d--) {
          off += (rem % ys[d]) * ost[d];
          rem /= ys[d];
        }
        const U* s = src + row * inner;
        U* o = dst + off;
        if (istep == 1)
          std::memcpy(o, s, inner * sizeof(U));
        else
          for (int64_t i = 0; i < inner; i++) o[i * istep] = s[i];
      }
    });
  });
}

// ---- Concat ----
void concat_infer(InferContext& ctx) {
  ONYX_CHECK(ctx.num_inputs() > 0, ctx.node.describe(), ": no inputs");
  const auto& x0 = ctx.input(0);
  int64_t r = x0.rank();
  int64_t axis = normalize_axis(ctx.node.attr_int_required("axis"), r, ctx.node);
  Shape out = x0.shape;
  for (int i = 1; i < ctx.num_inputs(); i++) {
    const auto& xi = ctx.input(i);
    ONYX_CHECK(xi.dtype == x0.dtype, ctx.node.describe(), ": input ", i, " is ",
               dtype_name(xi.dtype), ", input 0 is ", dtype_name(x0.dtype));
    bool ok = xi.rank() == r;
    for (int64_t d = 0; ok && d < r; d++) ok = d == axis || xi.shape[d] == x0.shape[d];
    ONYX_CHECK(ok, ctx.node.describe(), ": input ", i, " ", shape_str(xi.shape),
               " does not match input 0 ", shape_str(x0.shape), " outside axis ", axis);
    out[axis] += xi.shape[axis];
  }
  ctx.set_output(0, x0.dtype, out);
}

void concat_compute(KernelContext& ctx) {
  Tensor& y = ctx.output(0);
  int64_t r = y.rank();
  int64_t axis = normalize_axis(ctx.node.attr_int_required("axis"), r, ctx.node);
  size_t es = elem_size(y.dtype(), ctx.node);
  int64_t outer = prod(y.shape(), 0, axis);
  int64_t inner = prod(y.shape(), axis + 1, r) * (int64_t)es;  // bytes per unit along the axis
  int64_t out_row = y.shape()[axis] * inner;
  struct Part {
    const char* src;
    int64_t bytes, offset;
  };
  std::vector<Part> parts;
  int64_t off = 0;
  for (int i = 0; i < ctx.num_inputs(); i++) {
    const Tensor& x = ctx.input(i);
    int64_t b = x.shape()[axis] * inner;
    if (b > 0) parts.push_back({(const char*)x.raw(), b, off});
    off += b;
  }
  char* dst = (char*)y.raw();
  if (outer == 1) {
    for (auto& p : parts) parallel_memcpy(dst + p.offset, p.src, p.bytes);
    return;
  }
  parallel_for(outer, std::max<int64_t>(1, 65536 / std::max<int64_t>(out_row, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t o = b; o < e; o++)
                   for (auto& p : parts)
                     std::memcpy(dst + o * out_row + p.offset, p.src + o * p.bytes, p.bytes);
               });
}

// ---- Split ----
std::vector<int64_t> split_sizes(const ir::Node& node, int64_t opset, const Shape& in, int64_t axis,
                                 int n_out, const Tensor* split_input) {
  int64_t dim = in[axis];
  std::vector<int64_t> sizes;
  bool given = false;
  if (opset < 13 && node.has_attr("split")) {
    sizes = node.attr_ints("split");
    given = true;
  } else if (opset >= 13 && split_input) {
    sizes = split_input->to_int64_vector();
    given = true;
  }
  if (given) {
    int64_t sum = 0;
    for (int64_t s : sizes) {
      ONYX_CHECK(s >= 0, node.describe(), ": negative size in split ", shape_str(sizes));
      sum += s;
    }
    ONYX_CHECK((int)sizes.size() == n_out, node.describe(), ": split ", shape_str(sizes), " has ",
               sizes.size(), " entries for ", n_out, " outputs");
    ONYX_CHECK(sum == dim, node.describe(), ": split ", shape_str(sizes), " sums to ", sum,
               ", but axis ", axis, " of input ", shape_str(in), " has ", dim);
    return sizes;
  }
  int64_t n = n_out;
  if (opset >= 18 && node.has_attr("num_outputs")) {
    n = node.attr_int("num_outputs", n_out);
    ONYX_CHECK(n == n_out, node.describe(), ": num_outputs is ", n, " but the node has ", n_out,
               " outputs");
  }
  ONYX_CHECK(n > 0, node.describe(), ": no outputs");
  if (dim % n == 0) return std::vector<int64_t>(n, dim / n);
  ONYX_CHECK(opset >= 18, node.describe(), ": axis ", axis, " of input ", shape_str(in), " (", dim,
             ") does not split evenly into ", n, " outputs");
  int64_t chunk = (dim + n - 1) / n, left = dim;
  for (int64_t i = 0; i < n; i++) {
    sizes.push_back(std::min(chunk, left));
    left -= sizes.back();
  }
  return sizes;
}

void split_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), x.rank(), ctx.node);
  const Tensor* sp = ctx.opset >= 13 && ctx.has_input(1) ? &ctx.value(1) : nullptr;
  auto sizes = split_sizes(ctx.node, ctx.opset, x.shape, axis, ctx.num_outputs(), sp);
  for (int i = 0; i < ctx.num_outputs(); i++) {
    Shape s = x.shape;
    s[axis] = sizes[i];
    ctx.set_output(i, x.dtype, s);
  }
}

void split_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  int64_t r = x.rank();
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), r, ctx.node);
  const Tensor* sp = ctx.opset >= 13 && ctx.has_input(1) ? &ctx.input(1) : nullptr;
  int n_out = (int)ctx.node.outputs.size();
  auto sizes = split_sizes(ctx.node, ctx.opset, x.shape(), axis, n_out, sp);
  size_t es = elem_size(x.dtype(), ctx.node);
  int64_t outer = prod(x.shape(), 0, axis);
  int64_t inner = prod(x.shape(), axis + 1, r) * (int64_t)es;
  int64_t in_row = x.shape()[axis] * inner;
  struct Part {
    char* dst;
    int64_t bytes, offset;
  };
  std::vector<Part> parts;
  int64_t off = 0;
  for (int i = 0; i < n_out; i++) {
    int64_t b = sizes[i] * inner;
    if (ctx.has_output(i) && b > 0) parts.push_back({(char*)ctx.output(i).raw(), b, off});
    off += b;
  }
  const char* src = (const char*)x.raw();
  if (outer == 1) {
    for (auto& p : parts) parallel_memcpy(p.dst, src + p.offset, p.bytes);
    return;
  }
  parallel_for(outer, std::max<int64_t>(1, 65536 / std::max<int64_t>(in_row, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t o = b; o < e; o++)
                   for (auto& p : parts)
                     std::memcpy(p.dst + o * p.bytes, src + o * in_row + p.offset, p.bytes);
               });
}

// ---- Pad ----
enum class PadMode { Constant, Reflect, Edge, Wrap };

struct PadPlan {
  PadMode mode;
  std::vector<int64_t> begin, end;  // per dim, may be negative (crop)
  Shape out;
};

template <class Ctx, class Get>
PadPlan pad_plan(const Ctx& ctx, const Shape& in, Get&& get) {
  const ir::Node& n = ctx.node;
  int64_t r = (int64_t)in.size();
  PadPlan p;
  std::string mode = n.attr_string("mode", "constant");
  if (mode == "constant")
    p.mode = PadMode::Constant;
  else if (mode == "reflect")
    p.mode = PadMode::Reflect;
  else if (mode == "edge")
    p.mode = PadMode::Edge;
  else if (mode == "wrap")
    p.mode = PadMode::Wrap;
  else
    ONYX_UNSUPPORTED(n.describe(), ": mode '", mode, "'");
  std::vector<int64_t> pads =
      ctx.opset < 11 ? n.attr_ints_required("pads") : get(1)->to_int64_vector();
  std::vector<int64_t> axes;
  if (ctx.opset >= 18 && ctx.has_input(3)) {
    axes = get(3)->to_int64_vector();
  } else {
    for (int64_t i = 0; i < r; i++) axes.push_back(i);
  }
  ONYX_CHECK(pads.size() == 2 * axes.size(), n.describe(), ": pads ", shape_str(pads),
             " must have 2 entries per padded axis (", axes.size(), ") of input ", shape_str(in));
  p.begin.assign(r, 0);
  p.end.assign(r, 0);
  for (size_t i = 0; i < axes.size(); i++) {
    int64_t ax = normalize_axis(axes[i], r, n);
    p.begin[ax] = pads[i];
    p.end[ax] = pads[i + axes.size()];
  }
  p.out = in;
  for (int64_t d = 0; d < r; d++) {
    p.out[d] = in[d] + p.begin[d] + p.end[d];
    ONYX_CHECK(p.out[d] >= 0, n.describe(), ": pads ", shape_str(pads), " crop more than dim ", d,
               " of input ", shape_str(in));
    if (p.mode != PadMode::Constant && (p.begin[d] > 0 || p.end[d] > 0))
      ONYX_CHECK(in[d] > 0, n.describe(), ": cannot ", mode, "-pad empty dim ", d, " of ",
                 shape_str(in));
  }
  return p;
}

// Source index of output index o along a dim, or -1 for the constant.
int64_t pad_source(PadMode mode, int64_t o, int64_t begin, int64_t n) {
  int64_t i = o - begin;
  if (i >= 0 && i < n) return i;
  if (mode == PadMode::Constant) return -1;
  if (mode == PadMode::Edge) return i < 0 ? 0 : n - 1;
  if (mode == PadMode::Wrap) return ((i % n) + n) % n;  // numpy.pad(mode="wrap")
  if (n == 1) return 0;
  while (i < 0 || i >= n) {  // reflect without repeating the edge
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
  }
  return i;
}

void pad_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  auto p = pad_plan(ctx, x.shape, [&](int i) { return &ctx.value(i); });
  ctx.set_output(0, x.dtype, p.out);
}

void pad_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  auto p = pad_plan(ctx, x.shape(), [&](int i) { return &ctx.input(i); });
  size_t es = elem_size(x.dtype(), ctx.node);
  uint64_t cval = 0;  // the constant's bytes
  if (ctx.opset < 11) {
    store_double(x.dtype(), &cval, 0, ctx.node.attr_float("value", 0.f), ctx.node);
  } else if (ctx.has_input(2) && ctx.input(2).numel() > 0) {
    const Tensor& c = ctx.input(2);
    ONYX_CHECK(c.dtype() == x.dtype(), ctx.node.describe(), ": constant_value is ",
               dtype_name(c.dtype()), ", data is ", dtype_name(x.dtype()));
    std::memcpy(&cval, c.raw(), es);
  }
  int64_t r = x.rank();
  if (y.numel() == 0) return;
  if (r == 0) {
    std::memcpy(y.raw(), x.raw(), es);
    return;
  }
  // Per-dim maps from output index to source index (-1: constant).
  std::vector<std::vector<int64_t>> maps(r);
  for (int64_t d = 0; d < r; d++) {
    maps[d].resize(p.out[d]);
    for (int64_t o = 0; o < p.out[d]; o++)
      maps[d][o] = pad_source(p.mode, o, p.begin[d], x.shape()[d]);
  }
  auto st = contiguous_strides(x.shape());
  int64_t inner = p.out[r - 1], rows = y.numel() / inner;
  const auto& last = maps[r - 1];
  by_elem_size(es, [&]<class U>() {
    U c;
    std::memcpy(&c, &cval, sizeof(U));
    const U* src = x.data<U>();
    U* dst = y.data<U>();
    parallel_for(rows, std::max<int64_t>(1, 16384 / inner), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; row++) {
        int64_t rem = row, off = 0;
        bool constant = false;
        for (int64_t d = r - 2; d >= 0; d--) {
          int64_t m = maps[d][rem % p.out[d]];
          rem /= p.out[d];
          if (m < 0) constant = true;
          off += m * st[d];
        }
        U* drow = dst + row * inner;
        if (constant) {
          std::fill(drow, drow + inner, c);
          continue;
        }
        const U* srow = src + off;
        for (int64_t j = 0; j < inner; j++) {
          int64_t m = last[j];
          drow[j] = m < 0 ? c : srow[m];
        }
      }
    });
  });
}

// ---- Trilu ----
void trilu_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  ONYX_CHECK(x.rank() >= 2, ctx.node.describe(), ": input must have rank >= 2, got ",
             shape_str(x.shape));
  ctx.set_output(0, x.dtype, x.shape);
}

void trilu_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  int64_t k = 0;
  if (ctx.has_input(1)) {
    auto kv = ctx.input(1).to_int64_vector();
    ONYX_CHECK(kv.size() == 1, ctx.node.describe(), ": k must be a scalar, got ",
               shape_str(ctx.input(1).shape()));
    k = kv[0];
  }
  bool upper = ctx.node.attr_int("upper", 1) != 0;
  size_t es = elem_size(x.dtype(), ctx.node);
  int64_t M = x.dim(-2), N = x.dim(-1), rows = x.numel() / std::max<int64_t>(N, 1);
  if (x.numel() == 0) return;
  const char* src = (const char*)x.raw();
  char* dst = (char*)y.raw();
  parallel_for(rows, std::max<int64_t>(1, 16384 / N), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; row++) {
      int64_t i = row % M;
      // Kept columns: upper j >= i+k, lower j <= i+k.
      int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, N) : 0;
      int64_t hi = upper ? N : std::clamp<int64_t>(i + k + 1, 0, N);
      char* d = dst + row * N * es;
      const char* s = src + row * N * es;
      if (lo > 0) std::memset(d, 0, lo * es);
      if (hi > lo) std::memcpy(d + lo * es, s + lo * es, (hi - lo) * es);
      if (hi < N) std::memset(d + std::max(hi, lo) * es, 0, (N - std::max(hi, lo)) * es);
    }
  });
}

// ---- Compress ----
struct CompressPlan {
  std::vector<int64_t> selected;  // indices kept along the axis
  int64_t outer, dim, inner;      // elements
  Shape out;
};

CompressPlan compress_plan(const ir::Node& node, const Shape& in, const Tensor& cond) {
  ONYX_CHECK(cond.rank() == 1, node.describe(), ": condition must be 1-D, got ",
             shape_str(cond.shape()));
  auto c = cond.to_int64_vector();
  CompressPlan p;
  int64_t r = (int64_t)in.size();
  if (node.has_attr("axis")) {
    int64_t ax = normalize_axis(node.attr_int("axis", 0), r, node);
    p.outer = prod(in, 0, ax);
    p.dim = in[ax];
    p.inner = prod(in, ax + 1, r);
    p.out = in;
  } else {
    p.outer = 1;
    p.dim = shape_numel(in);
    p.inner = 1;
  }
  for (int64_t i = 0; i < (int64_t)c.size(); i++) {
    if (!c[i]) continue;
    ONYX_CHECK(i < p.dim, node.describe(), ": condition selects index ", i,
               " beyond the axis size ", p.dim, " of input ", shape_str(in));
    p.selected.push_back(i);
  }
  int64_t n = (int64_t)p.selected.size();
  if (node.has_attr("axis"))
    p.out[normalize_axis(node.attr_int("axis", 0), r, node)] = n;
  else
    p.out = {n};
  return p;
}

void compress_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto p = compress_plan(ctx.node, x.shape(), ctx.input(1));
  size_t es = elem_size(x.dtype(), ctx.node);
  int64_t row = p.inner * (int64_t)es, n = (int64_t)p.selected.size();
  const char* src = (const char*)x.raw();
  char* dst = (char*)ctx.output(0).raw();
  parallel_for(p.outer, std::max<int64_t>(1, 65536 / std::max<int64_t>(row * n, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t o = b; o < e; o++)
                   for (int64_t j = 0; j < n; j++)
                     std::memcpy(dst + (o * n + j) * row, src + (o * p.dim + p.selected[j]) * row,
                                 row);
               });
}

}  // namespace

ONYX_REGISTER_KERNELS(slice, Cpu) {
  r.add("", "Slice", {slice_infer, slice_compute, {1, 2, 3, 4}});
  r.add("onyx", "SliceGrad", OpKernel{slice_grad_infer, slice_grad_compute, {}});
  r.add("", "Concat", {concat_infer, concat_compute, {}});
  r.add("", "Split", {split_infer, split_compute, {1}});
  r.add("", "Pad", {pad_infer, pad_compute, {1, 3}});
  r.add("", "Trilu", {trilu_infer, trilu_compute, {}});
  r.add("", "Compress",
        {[](InferContext& ctx) {
           const auto& x = ctx.input(0);
           ctx.set_output(0, x.dtype, compress_plan(ctx.node, x.shape, ctx.value(1)).out);
         },
         compress_compute,
         {1}});
}

}  // namespace onyx::kernels::shape_detail
