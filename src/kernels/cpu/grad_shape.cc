// grad_shape.cc — fused gradient kernels of the shape family ("onyx" domain), emitted by the rules
// in autodiff/gradients/shape.cc:
//   SliceGrad(dy)                   shape starts steps   dx = zeros(shape); dx[start + i·step] = dy[i]
//   GatherGrad(dy, indices)         axis shape           dx = zeros(shape); dx[.., idx[i], ..] += dy[.., i, ..]
//   GatherElementsGrad(dy, indices) axis shape           dx = zeros(shape); dx[idx-replaced pos] += dy
// starts/steps are resolved per dim (the rule applies ONNX's clamping); steps may be negative.
//
// Hand-written because GatherGrad is the embedding backward of every language model: a scatter-add
// of (B·T) rows into a (V, C) table. It is threaded without atomics or races: indices are bucketed
// by row (a counting sort that keeps positions in ascending order), and each thread owns a range
// of output rows, summing that row's dy rows in a fixed order — deterministic for any thread count.
// GatherElementsGrad partitions by the non-axis coordinates (each owns one output column).
// SliceGrad is a byte-generic strided scatter (any dtype); the adds run on float32 and float64,
// with float16/bfloat16 accumulated in float32.
#include <algorithm>

#include "kernels/cpu/shape_common.h"

namespace onyx::runtime {
namespace {

using namespace shape_detail;

// ---- SliceGrad -------------------------------------------------------------------------------

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
        if (istep == 1) std::memcpy(o, s, inner * sizeof(U));
        else
          for (int64_t i = 0; i < inner; i++) o[i * istep] = s[i];
      }
    });
  });
}

// ---- shared: indices and float dispatch ------------------------------------------------------

// Runs f(const T* dy, T* dx) with T = float or double; float16/bfloat16 through float copies.
template <class F>
void dispatch_float1(KernelContext& ctx, const Tensor& dy, Tensor& dx, F&& f) {
  switch (dx.dtype()) {
    case DType::Float32:
      return f(dy.data<float>(), dx.data<float>());
    case DType::Float64:
      return f(dy.data<double>(), dx.data<double>());
    case DType::Float16:
    case DType::BFloat16: {
      bool half = dx.dtype() == DType::Float16;
      std::vector<float> a(dy.numel()), b(dx.numel());
      const uint16_t* p = dy.data<uint16_t>();
      for (size_t i = 0; i < a.size(); i++) a[i] = half ? half_to_float(p[i]) : bf16_to_float(p[i]);
      f((const float*)a.data(), b.data());
      uint16_t* q = dx.data<uint16_t>();
      for (size_t i = 0; i < b.size(); i++) q[i] = half ? float_to_half(b[i]) : float_to_bf16(b[i]);
      return;
    }
    default:
      ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(dx.dtype()));
  }
}

void index_grad_infer(InferContext& ctx) {
  const auto& dy = ctx.input(0);
  const auto& ind = ctx.input(1);
  if (!is_float(dy.dtype)) ONYX_UNSUPPORTED(ctx.node.describe(), ": dtype ", dtype_name(dy.dtype));
  ONYX_CHECK(ind.dtype == DType::Int64 || ind.dtype == DType::Int32, ctx.node.describe(),
             ": indices must be int32 or int64, got ", dtype_name(ind.dtype));
  Shape x = ctx.node.attr_ints_required("shape");
  int64_t r = (int64_t)x.size();
  ONYX_CHECK(r >= 1, ctx.node.describe(), ": data must have rank >= 1");
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), r, ctx.node);
  if (ctx.node.op_type == "GatherGrad") {
    Shape y(x.begin(), x.begin() + axis);
    y.insert(y.end(), ind.shape.begin(), ind.shape.end());
    y.insert(y.end(), x.begin() + axis + 1, x.end());
    ONYX_CHECK(dy.shape == y, ctx.node.describe(), ": dy ", shape_str(dy.shape),
               " is not the Gather output ", shape_str(y), " of data ", shape_str(x),
               " and indices ", shape_str(ind.shape));
  } else {
    ONYX_CHECK(dy.shape == ind.shape && ind.rank() == r, ctx.node.describe(), ": dy ",
               shape_str(dy.shape), " and indices ", shape_str(ind.shape),
               " must have one shape of data's rank ", shape_str(x));
    for (int64_t d = 0; d < r; d++)
      ONYX_CHECK(d == axis || ind.shape[d] <= x[d], ctx.node.describe(), ": indices ",
                 shape_str(ind.shape), " exceed data ", shape_str(x), " in dim ", d);
  }
  ctx.set_output(0, dy.dtype, x);
}

// ---- GatherGrad ------------------------------------------------------------------------------

// dx (outer, V, inner) = Σ over i with idx[i] = v of dy (outer, I, inner)[o, i, :].
// With `add` (dx is a bound gradient, micro-batches accumulating): each row's sum is formed in a
// scratch row exactly as without it, then added to dx once; rows no index names stay as they are.
template <class T>
void gather_grad(const T* dy, T* dx, const std::vector<int64_t>& idx, int64_t outer, int64_t V,
                 int64_t inner, bool add = false) {
  const int64_t I = (int64_t)idx.size();
  // Positions bucketed by row, ascending within a row.
  std::vector<int64_t> first(V + 1, 0), pos(I);
  for (int64_t i = 0; i < I; i++) first[idx[i] + 1]++;
  for (int64_t v = 0; v < V; v++) first[v + 1] += first[v];
  {
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < I; i++) pos[fill[idx[i]]++] = i;
  }
  parallel_for(outer * V, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, inner)),
               [&](int64_t b, int64_t e) {
                 std::vector<T> row(add ? inner : 0);
                 for (int64_t u = b; u < e; u++) {
                   int64_t o = u / V, v = u % V;
                   T* dst = dx + u * inner;
                   int64_t p0 = first[v], p1 = first[v + 1];
                   if (p0 == p1) {
                     if (!add) std::fill(dst, dst + inner, T(0));
                     continue;
                   }
                   T* out = add ? row.data() : dst;
                   const T* src = dy + (o * I + pos[p0]) * inner;
                   std::copy(src, src + inner, out);
                   for (int64_t p = p0 + 1; p < p1; p++) {
                     const T* s = dy + (o * I + pos[p]) * inner;
#pragma omp simd
                     for (int64_t k = 0; k < inner; k++) out[k] += s[k];
                   }
                   if (add) {
#pragma omp simd
                     for (int64_t k = 0; k < inner; k++) dst[k] += out[k];
                   }
                 }
               });
}

void gather_grad_compute(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);   // (outer, indices..., inner)
  const Tensor& ind = ctx.input(1);  // (indices...)
  Tensor& dx = ctx.output(0);        // (outer, V, inner) = data's shape
  const Shape& x = dx.shape();
  int64_t r = dx.rank();
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), r, ctx.node);
  int64_t V = x[axis], outer = prod(x, 0, axis), inner = prod(x, axis + 1, r);
  auto idx = read_indices(ctx.node, ind, V, x, axis);
  if (dx.numel() == 0) return;
  const bool add = ctx.accumulates(0);
  ONYX_CHECK(!add || dx.dtype() == DType::Float32, ctx.node.describe(),
             ": accumulation supports float32 gradients, got ", dtype_name(dx.dtype()));
  dispatch_float1(ctx, dy, dx, [&](auto* D, auto* X) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(X)>>;
    gather_grad<T>(D, X, idx, outer, V, inner, add);
  });
}

// ---- GatherElementsGrad ----------------------------------------------------------------------

// Indices (pre, J, post) over data (pre', V, post'): element (p, j, q) adds dy to
// dx[pre_off[p] + idx·stride_axis + post_off[q]]. Distinct (p, q) never share an output element,
// so threads own ranges of (p, q) columns.
template <class T>
void gather_elements_grad(const T* dy, T* dx, const std::vector<int64_t>& idx, const Shape& xs,
                          const Shape& is, int64_t axis) {
  int64_t r = (int64_t)xs.size();
  auto ds = contiguous_strides(xs);
  int64_t pre = prod(is, 0, axis), J = is[axis], post = prod(is, axis + 1, r);
  auto offsets = [&](int64_t d0, int64_t d1, int64_t count) {
    std::vector<int64_t> off(count, 0);
    for (int64_t u = 0; u < count; u++) {
      int64_t rem = u, o = 0;
      for (int64_t d = d1 - 1; d >= d0; d--) {
        o += (rem % is[d]) * ds[d];
        rem /= is[d];
      }
      off[u] = o;
    }
    return off;
  };
  auto pre_off = offsets(0, axis, pre), post_off = offsets(axis + 1, r, post);
  int64_t total = (int64_t)shape_numel(xs);
  parallel_for(total, 1 << 16, [&](int64_t b, int64_t e) { std::fill(dx + b, dx + e, T(0)); });
  const int64_t sa = ds[axis];
  parallel_for(pre * post, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, J)),
               [&](int64_t b, int64_t e) {
                 for (int64_t col = b; col < e;) {
                   int64_t p = col / post, q0 = col % post;
                   int64_t q1 = std::min(post, q0 + (e - col));
                   T* out = dx + pre_off[p];
                   for (int64_t j = 0; j < J; j++) {
                     int64_t u0 = (p * J + j) * post;
                     for (int64_t q = q0; q < q1; q++)
                       out[idx[u0 + q] * sa + post_off[q]] += dy[u0 + q];
                   }
                   col += q1 - q0;
                 }
               });
}

void gather_elements_grad_compute(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);   // indices' shape
  const Tensor& ind = ctx.input(1);  // data's rank
  Tensor& dx = ctx.output(0);        // data's shape
  int64_t r = dx.rank();
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), r, ctx.node);
  auto idx = read_indices(ctx.node, ind, dx.shape()[axis], dx.shape(), axis);
  if (dx.numel() == 0) return;
  dispatch_float1(ctx, dy, dx, [&](auto* D, auto* X) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(X)>>;
    gather_elements_grad<T>(D, X, idx, dx.shape(), ind.shape(), axis);
  });
}

}  // namespace

void register_shape_grad_kernels(KernelRegistry& r) {
  r.add("onyx", "SliceGrad", OpKernel{slice_grad_infer, slice_grad_compute, {}});
  // can add into a bound embedding gradient (passes/gradient_into_buffer.cc)
  r.add("onyx", "GatherGrad", OpKernel{index_grad_infer, gather_grad_compute, {}, {}, {0}});
  r.add("onyx", "GatherElementsGrad", OpKernel{index_grad_infer, gather_elements_grad_compute, {}});
}

}  // namespace onyx::runtime
