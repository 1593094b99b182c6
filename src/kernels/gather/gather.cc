// kernels/gather/gather.cc — index-driven ops: Gather, GatherElements, GatherND, ScatterElements
// (and its deprecated alias Scatter), ScatterND, OneHot, and the fused gradients of Gather and
// GatherElements ("onyx" domain, emitted by the rules in autodiff/gradients/shape.cc):
//   GatherGrad(dy, indices)          dx = zeros(shape); dx[.., idx[i], ..] += dy[.., i, ..]
//   GatherElementsGrad(dy, indices)  dx = zeros(shape); dx[idx-replaced pos] += dy
// (attributes axis and shape, the data's shape).
// Indices are read and range-checked once up front (so errors name the offending index and no
// exception leaves a parallel region); the copies then run on element size. Gather of rows
// (embedding lookup, data (V,C), indices (B,T)) is a threaded row memcpy — the hot path in every
// language model, and GatherGrad is its backward: a scatter-add of (B·T) rows into a (V, C) table,
// threaded without atomics or races: indices are bucketed by row (a counting sort that keeps
// positions in ascending order), and each thread owns a range of output rows, summing that row's
// dy rows in a fixed order — deterministic for any thread count. GatherElementsGrad partitions by
// the non-axis coordinates (each owns one output column). The adds run on float32 and float64,
// with float16/bfloat16 accumulated in float32.
#include <algorithm>

#include "kernels/cpu/nn_util.h"
#include "kernels/shape/shape_common.h"

namespace onyx::kernels::shape_detail {
namespace {

// ---- Gather ----
void gather_infer(InferContext& ctx) {
  const auto& x = ctx.input(0);
  const auto& ind = ctx.input(1);
  ONYX_CHECK(x.rank() >= 1, ctx.node.describe(), ": data must have rank >= 1");
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), x.rank(), ctx.node);
  Shape out(x.shape.begin(), x.shape.begin() + axis);
  out.insert(out.end(), ind.shape.begin(), ind.shape.end());
  out.insert(out.end(), x.shape.begin() + axis + 1, x.shape.end());
  ctx.set_output(0, x.dtype, out);
}

void gather_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);    // (outer, dim, inner)
  const Tensor& ind = ctx.input(1);  // (N) flattened
  Tensor& y = ctx.output(0);         // (outer, N, inner)
  int64_t r = x.rank();
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), r, ctx.node);
  int64_t dim = x.shape()[axis];
  auto idx = read_indices(ctx.node, ind, dim, x.shape(), axis);
  size_t es = elem_size(x.dtype(), ctx.node);
  int64_t outer = prod(x.shape(), 0, axis), inner = prod(x.shape(), axis + 1, r);
  int64_t N = (int64_t)idx.size();
  if (y.numel() == 0) return;
  by_elem_size(es, [&]<class U>() {
    const U* src = x.data<U>();
    U* dst = y.data<U>();
    if (inner == 1) {  // scalar elements (e.g. Gather on a shape vector)
      parallel_for(outer * N, 1 << 14, [&](int64_t b, int64_t e) {
        for (int64_t u = b; u < e; u++) dst[u] = src[(u / N) * dim + idx[u % N]];
      });
      return;
    }
    parallel_for(outer * N, std::max<int64_t>(1, 16384 / inner), [&](int64_t b, int64_t e) {
      for (int64_t u = b; u < e; u++) {
        int64_t o = u / N, i = u % N;
        std::memcpy(dst + u * inner, src + (o * dim + idx[i]) * inner, inner * sizeof(U));
      }
    });
  });
}

// Scatter reductions (opset 16: add/mul; 18: max/min), applied in index order.
enum class Reduction { Add, Mul, Max, Min };

Reduction parse_reduction(const ir::Node& node, const std::string& red) {
  if (red == "add") return Reduction::Add;
  if (red == "mul") return Reduction::Mul;
  if (red == "max") return Reduction::Max;
  if (red == "min") return Reduction::Min;
  ONYX_UNSUPPORTED(node.describe(), ": reduction '", red, "'");
}

template <class S>
inline void reduce_into(Reduction op, S& dst, S upd) {
  using A = Arith<S>;
  auto a = A::load(dst), b = A::load(upd);
  decltype(a) v = op == Reduction::Add   ? a + b
                  : op == Reduction::Mul ? a * b
                  : op == Reduction::Max ? std::max(a, b)
                                         : std::min(a, b);
  dst = A::store(v);
}

// ---- onyx.GatherGrad ----

// GatherGrad and GatherElementsGrad: attribute shape is the data's shape; dy and indices must be
// what Gather / GatherElements made of it.
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
  nnutil::dispatch_float(
      ctx.node, dx,
      [&](auto* D, auto* X) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(X)>>;
        gather_grad<T>(D, X, idx, outer, V, inner, add);
      },
      dy);
}

// ---- GatherElements / ScatterElements ----
// Source (data) offset for every element of `indices`: its own multi-index with the axis
// coordinate replaced by the index value.
std::vector<int64_t> element_offsets(const ir::Node& node, const Shape& data, const Tensor& ind,
                                     int64_t axis) {
  int64_t r = (int64_t)data.size();
  const Shape& is = ind.shape();
  ONYX_CHECK((int64_t)is.size() == r, node.describe(), ": indices ", shape_str(is),
             " must have the rank of data ", shape_str(data));
  for (int64_t d = 0; d < r; d++)
    ONYX_CHECK(d == axis || is[d] <= data[d], node.describe(), ": indices ", shape_str(is),
               " exceed data ", shape_str(data), " in dim ", d);
  auto idx = read_indices(node, ind, data[axis], data, axis);
  auto ds = contiguous_strides(data);
  int64_t n = (int64_t)idx.size();
  std::vector<int64_t> off(n);
  if (n == 0) return off;
  std::vector<int64_t> mi(r, 0);
  int64_t base = 0;  // offset of the multi-index without the axis term
  for (int64_t u = 0; u < n; u++) {
    off[u] = base + idx[u] * ds[axis];
    for (int64_t d = r - 1; d >= 0; d--) {
      if (d != axis) base += ds[d];
      if (++mi[d] < is[d]) break;
      if (d != axis) base -= ds[d] * is[d];
      mi[d] = 0;
    }
  }
  return off;
}

void gather_elements_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), x.rank(), ctx.node);
  auto off = element_offsets(ctx.node, x.shape(), ind, axis);
  by_elem_size(elem_size(x.dtype(), ctx.node), [&]<class U>() {
    const U* src = x.data<U>();
    U* dst = ctx.output(0).data<U>();
    parallel_for((int64_t)off.size(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t u = b; u < e; u++) dst[u] = src[off[u]];
    });
  });
}

void scatter_elements_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  Tensor& y = ctx.output(0);
  ONYX_CHECK(upd.shape() == ind.shape() && upd.dtype() == x.dtype(), ctx.node.describe(),
             ": updates ", dtype_name(upd.dtype()), shape_str(upd.shape()), " must match indices ",
             shape_str(ind.shape()), " and data dtype ", dtype_name(x.dtype()));
  int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), x.rank(), ctx.node);
  auto off = element_offsets(ctx.node, x.shape(), ind, axis);
  parallel_memcpy(y.raw(), x.raw(), x.nbytes());
  std::string red = ctx.node.attr_string("reduction", "none");
  int64_t n = (int64_t)off.size();
  if (red == "none") {
    by_elem_size(elem_size(x.dtype(), ctx.node), [&]<class U>() {
      const U* u = upd.data<U>();
      U* d = y.data<U>();
      for (int64_t i = 0; i < n; i++) d[off[i]] = u[i];
    });
    return;
  }
  Reduction op = parse_reduction(ctx.node, red);
  dispatch_dtype(x.dtype(), ctx.node, [&]<class S>() {
    const S* u = upd.data<S>();
    S* d = y.data<S>();
    for (int64_t i = 0; i < n; i++) reduce_into(op, d[off[i]], u[i]);
  });
}

// ---- onyx.GatherElementsGrad ----

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
  nnutil::dispatch_float(
      ctx.node, dx,
      [&](auto* D, auto* X) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(X)>>;
        gather_elements_grad<T>(D, X, idx, dx.shape(), ind.shape(), axis);
      },
      dy);
}

// ---- GatherND ----
struct GatherNDPlan {
  int64_t batches, per_batch, k, slice, data_batch_stride;
  Shape out;
};

GatherNDPlan gathernd_plan(const ir::Node& node, const Shape& data, const Shape& ind) {
  int64_t r = (int64_t)data.size(), q = (int64_t)ind.size();
  int64_t b = node.attr_int("batch_dims", 0);
  ONYX_CHECK(q >= 1 && r >= 1, node.describe(), ": data ", shape_str(data), " and indices ",
             shape_str(ind), " must have rank >= 1");
  ONYX_CHECK(b >= 0 && b < std::min(q, r), node.describe(), ": batch_dims ", b,
             " must be below the ranks of data ", shape_str(data), " and indices ", shape_str(ind));
  for (int64_t d = 0; d < b; d++)
    ONYX_CHECK(data[d] == ind[d], node.describe(), ": batch dims of data ", shape_str(data),
               " and indices ", shape_str(ind), " differ");
  int64_t k = ind[q - 1];
  ONYX_CHECK(k >= 1 && k <= r - b, node.describe(), ": indices ", shape_str(ind), " index ", k,
             " dims, data ", shape_str(data), " has ", r - b, " after batch_dims");
  GatherNDPlan p;
  p.k = k;
  p.batches = prod(ind, 0, b);
  p.per_batch = prod(ind, b, q - 1);
  p.slice = prod(data, b + k, r);
  p.data_batch_stride = prod(data, b, r);
  p.out.assign(ind.begin(), ind.end() - 1);
  p.out.insert(p.out.end(), data.begin() + b + k, data.end());
  return p;
}

void gathernd_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& ind = ctx.input(1);
  ONYX_CHECK(ind.dtype() == DType::Int64, ctx.node.describe(), ": indices must be int64, got ",
             dtype_name(ind.dtype()));
  auto p = gathernd_plan(ctx.node, x.shape(), ind.shape());
  int64_t b = ctx.node.attr_int("batch_dims", 0);
  auto ds = contiguous_strides(x.shape());
  const int64_t* iv = ind.data<int64_t>();
  int64_t rows = p.batches * p.per_batch;
  std::vector<int64_t> src(rows);
  for (int64_t row = 0; row < rows; row++) {
    int64_t off = (row / p.per_batch) * p.data_batch_stride;
    for (int64_t j = 0; j < p.k; j++) {
      int64_t dim = x.shape()[b + j], v = iv[row * p.k + j], w = v < 0 ? v + dim : v;
      ONYX_CHECK(w >= 0 && w < dim, ctx.node.describe(), ": index ", v, " is out of range for dim ",
                 b + j, " of size ", dim, " in data ", shape_str(x.shape()));
      off += w * ds[b + j];
    }
    src[row] = off;
  }
  size_t es = elem_size(x.dtype(), ctx.node);
  int64_t bytes = p.slice * (int64_t)es;
  const char* s = (const char*)x.raw();
  char* d = (char*)ctx.output(0).raw();
  parallel_for(rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(bytes, 1)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t row = lo; row < hi; row++)
                   std::memcpy(d + row * bytes, s + src[row] * (int64_t)es, bytes);
               });
}

// ---- ScatterND ----
void scatternd_compute(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);    // data (d0, ..., d_{r-1})
  const Tensor& ind = ctx.input(1);  // (..., k)
  const Tensor& upd = ctx.input(2);  // ind.shape[:-1] + data.shape[k:]
  Tensor& y = ctx.output(0);
  ONYX_CHECK(ind.dtype() == DType::Int64, ctx.node.describe(), ": indices must be int64, got ",
             dtype_name(ind.dtype()));
  const Shape &ds = x.shape(), &is = ind.shape();
  int64_t r = x.rank(), q = ind.rank();
  ONYX_CHECK(q >= 1 && is[q - 1] >= 1 && is[q - 1] <= r, ctx.node.describe(), ": indices ",
             shape_str(is), " do not index data ", shape_str(ds));
  int64_t k = is[q - 1];
  Shape want(is.begin(), is.end() - 1);
  want.insert(want.end(), ds.begin() + k, ds.end());
  ONYX_CHECK(upd.shape() == want && upd.dtype() == x.dtype(), ctx.node.describe(), ": updates ",
             dtype_name(upd.dtype()), shape_str(upd.shape()), " must be ", dtype_name(x.dtype()),
             shape_str(want), " for data ", shape_str(ds), " and indices ", shape_str(is));
  auto st = contiguous_strides(ds);
  int64_t rows = prod(is, 0, q - 1), slice = prod(ds, k, r);
  const int64_t* iv = ind.data<int64_t>();
  std::vector<int64_t> dst_off(rows);
  for (int64_t row = 0; row < rows; row++) {
    int64_t off = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t v = iv[row * k + j], w = v < 0 ? v + ds[j] : v;
      ONYX_CHECK(w >= 0 && w < ds[j], ctx.node.describe(), ": index ", v,
                 " is out of range for dim ", j, " of size ", ds[j], " in data ", shape_str(ds));
      off += w * st[j];
    }
    dst_off[row] = off;
  }
  parallel_memcpy(y.raw(), x.raw(), x.nbytes());
  std::string red = ctx.node.attr_string("reduction", "none");
  if (red == "none") {
    size_t es = elem_size(x.dtype(), ctx.node);
    for (int64_t row = 0; row < rows; row++)
      std::memcpy((char*)y.raw() + dst_off[row] * es, (const char*)upd.raw() + row * slice * es,
                  slice * es);
    return;
  }
  Reduction op = parse_reduction(ctx.node, red);
  dispatch_dtype(x.dtype(), ctx.node, [&]<class S>() {
    const S* u = upd.data<S>();
    S* d = y.data<S>();
    for (int64_t row = 0; row < rows; row++)
      for (int64_t i = 0; i < slice; i++) reduce_into(op, d[dst_off[row] + i], u[row * slice + i]);
  });
}

// ---- OneHot ----
int64_t onehot_depth(const ir::Node& node, const Tensor& depth) {
  ONYX_CHECK(depth.numel() == 1, node.describe(), ": depth must hold one value, got ",
             shape_str(depth.shape()));
  int64_t d = (int64_t)depth.get_as_double(0);
  ONYX_CHECK(d > 0, node.describe(), ": depth must be positive, got ", d);
  return d;
}

int64_t onehot_axis(const ir::Node& node, int64_t rank) {
  return normalize_axis(node.attr_int("axis", -1), rank + 1, node);
}

void onehot_infer(InferContext& ctx) {
  const auto& ind = ctx.input(0);
  const auto& vals = ctx.input(2);
  int64_t depth = onehot_depth(ctx.node, ctx.value(1));
  int64_t axis = onehot_axis(ctx.node, ind.rank());
  Shape out = ind.shape;
  out.insert(out.begin() + axis, depth);
  ctx.set_output(0, vals.dtype, out);
}

void onehot_compute(KernelContext& ctx) {
  const Tensor& ind = ctx.input(0);
  const Tensor& vals = ctx.input(2);
  Tensor& y = ctx.output(0);
  ONYX_CHECK(vals.numel() == 2, ctx.node.describe(), ": values must hold [off, on], got ",
             shape_str(vals.shape()));
  int64_t depth = onehot_depth(ctx.node, ctx.input(1));
  int64_t axis = onehot_axis(ctx.node, ind.rank());
  int64_t outer = prod(ind.shape(), 0, axis), inner = prod(ind.shape(), axis, ind.rank());
  size_t es = elem_size(vals.dtype(), ctx.node);
  const char* v = (const char*)vals.raw();
  fill_elements(y.raw(), y.numel(), v, es);
  auto iv = ind.to_double_vector();
  char* d = (char*)y.raw();
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t c = (int64_t)iv[o * inner + i];
      if (c < 0) c += depth;
      if (c < 0 || c >= depth) continue;
      std::memcpy(d + ((o * depth + c) * inner + i) * es, v + es, es);
    }
}

void same_as_input0(InferContext& ctx) {
  const auto& x = ctx.input(0);
  ctx.set_output(0, x.dtype, x.shape);
}

}  // namespace

ONYX_REGISTER_KERNELS(gather, Cpu) {
  r.add("", "Gather", {gather_infer, gather_compute, {}});
  r.add("", "GatherElements",
        {[](InferContext& ctx) {
           const auto& x = ctx.input(0);
           const auto& ind = ctx.input(1);
           ONYX_CHECK(ind.rank() == x.rank(), ctx.node.describe(), ": indices ",
                      shape_str(ind.shape), " must have the rank of data ", shape_str(x.shape));
           ctx.set_output(0, x.dtype, ind.shape);
         },
         gather_elements_compute,
         {}});
  r.add("", "ScatterElements", {same_as_input0, scatter_elements_compute, {}});
  r.add("", "Scatter", {same_as_input0, scatter_elements_compute, {}});
  r.add("", "ScatterND", {same_as_input0, scatternd_compute, {}});
  r.add("", "GatherND",
        {[](InferContext& ctx) {
           const auto& x = ctx.input(0);
           ctx.set_output(0, x.dtype, gathernd_plan(ctx.node, x.shape, ctx.input(1).shape).out);
         },
         gathernd_compute,
         {}});
  r.add("", "OneHot", {onehot_infer, onehot_compute, {1}});
  // GatherGrad can add into a bound embedding gradient (passes/gradient_into_buffer.cc)
  r.add("onyx", "GatherGrad", OpKernel{index_grad_infer, gather_grad_compute, {}, {}, {0}});
  r.add("onyx", "GatherElementsGrad", OpKernel{index_grad_infer, gather_elements_grad_compute, {}});
}

}  // namespace onyx::kernels::shape_detail
