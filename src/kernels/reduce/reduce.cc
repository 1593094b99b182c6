// kernels/reduce/reduce.cc — Reduce* (Mean, Sum, Max, Min, Prod, L1, L2, LogSum, LogSumExp,
// SumSquare), ArgMax/ArgMin and CumSum, with full ONNX semantics for opsets 13–18 (axes as
// attribute, or as an optional input for ReduceSum from 13 and every Reduce* from 18; keepdims;
// noop_with_empty_axes). Hand-written because reductions are on the hot path of decomposed
// LayerNorm/softmax (ReduceMean over the last axis of (B,T,C)) and of bias gradients (ReduceSum
// over the leading axes of (B,T,C)): both shapes get AVX2 float32 paths; any other axis set goes
// through a generic offset-list reduction.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

enum class RedOp { Sum, Mean, Prod, Max, Min, L1, L2, LogSum, LogSumExp, SumSquare };

// ---- axes and output shape ---------------------------------------------------------------------

struct ReduceSpec {
  bool noop = false;          // noop_with_empty_axes with empty axes: output = input
  std::vector<bool> reduced;  // per input axis
  Shape out_shape;            // honours keepdims
};

bool axes_are_input(const std::string& op, int64_t opset) {
  return opset >= 18 || (op == "ReduceSum" && opset >= 13);
}

// axes_t: the axes input (nullptr when absent or when axes are an attribute at this opset).
ReduceSpec make_reduce_spec(const ir::Node& node, int64_t opset, const Shape& in,
                            const Tensor* axes_t) {
  ReduceSpec s;
  int64_t rank = (int64_t)in.size();
  std::vector<int64_t> axes;
  if (axes_are_input(node.op_type, opset)) {
    if (axes_t) axes = axes_t->to_int64_vector();
  } else {
    axes = node.attr_ints("axes");
  }
  bool keepdims = node.attr_int("keepdims", 1) != 0;
  s.reduced.assign(rank, false);
  if (axes.empty()) {
    if (node.attr_int("noop_with_empty_axes", 0) != 0) {
      s.noop = true;
      s.out_shape = in;
      return s;
    }
    s.reduced.assign(rank, true);
  } else {
    for (int64_t a : axes) {
      int64_t na = normalize_axis(a, rank, node);
      ONYX_CHECK(!s.reduced[na], node.describe(), ": axis ", a, " is repeated in axes");
      s.reduced[na] = true;
    }
  }
  for (int64_t i = 0; i < rank; i++) {
    if (!s.reduced[i])
      s.out_shape.push_back(in[i]);
    else if (keepdims)
      s.out_shape.push_back(1);
  }
  return s;
}

// ---- reduction arithmetic ----------------------------------------------------------------------

// Accumulator: double for floating types and for ops whose result is not integral (Mean, L2,
// LogSum, LogSumExp); 64-bit integers otherwise, so integer sums/products/max stay exact.
template <RedOp op, class T>
using AccOf = std::conditional_t<(op == RedOp::Mean || op == RedOp::L2 || op == RedOp::LogSum ||
                                  op == RedOp::LogSumExp),
                                 double, typename Elem<T>::acc>;

template <class A>
constexpr A lowest() {
  return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                              : std::numeric_limits<A>::lowest();
}
template <class A>
constexpr A highest() {
  return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity()
                                              : std::numeric_limits<A>::max();
}

template <RedOp op, class A>
A red_init() {
  if constexpr (op == RedOp::Prod) return A(1);
  if constexpr (op == RedOp::Max || op == RedOp::LogSumExp) return lowest<A>();
  if constexpr (op == RedOp::Min) return highest<A>();
  return A(0);
}

template <RedOp op, class A>
A red_step(A acc, A x) {
  if constexpr (op == RedOp::Sum || op == RedOp::Mean || op == RedOp::LogSum) return acc + x;
  if constexpr (op == RedOp::Prod) return acc * x;
  if constexpr (op == RedOp::Max || op == RedOp::LogSumExp) return (x > acc || x != x) ? x : acc;
  if constexpr (op == RedOp::Min) return (x < acc || x != x) ? x : acc;
  if constexpr (op == RedOp::L1) {
    if constexpr (std::is_unsigned_v<A>)
      return acc + x;
    else
      return acc + (x < 0 ? -x : x);
  }
  if constexpr (op == RedOp::L2 || op == RedOp::SumSquare) return acc + x * x;
  return acc;
}

template <RedOp op, class A>
A red_fin(A acc, int64_t n) {
  if constexpr (op == RedOp::Mean) return acc / (double)n;
  if constexpr (op == RedOp::L2) return std::sqrt(acc);
  if constexpr (op == RedOp::LogSum) return std::log(acc);
  return acc;
}

// Reduces get(0..n-1).
template <RedOp op, class A, class Get>
A reduce_seq(int64_t n, Get&& get) {
  if constexpr (op == RedOp::LogSumExp) {
    A m = lowest<A>();
    for (int64_t j = 0; j < n; j++) m = red_step<RedOp::Max, A>(m, get(j));
    if (!std::isfinite(m)) return m;  // -inf (empty / all -inf), +inf or NaN
    A s = 0;
    for (int64_t j = 0; j < n; j++) s += std::exp(get(j) - m);
    return m + std::log(s);
  } else {
    A acc = red_init<op, A>();
    for (int64_t j = 0; j < n; j++) acc = red_step<op, A>(acc, get(j));
    return red_fin<op, A>(acc, n);
  }
}

// ---- kernels
// -------------------------------------------------------------------------------------

int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_item));
}

// [O, R] contiguous rows: out[o] = reduce(x[o, :]).
template <RedOp op, class T>
void reduce_rows(const T* x, T* y, int64_t O, int64_t R) {  // x (O,R), y (O)
  using A = AccOf<op, T>;
  parallel_for(O, grain_for(R), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; o++) {
      const T* row = x + o * R;
      if constexpr (std::is_same_v<T, float>) {
        if constexpr (op == RedOp::Sum) {
          y[o] = simd::row_sum(row, R);
          continue;
        }
        if constexpr (op == RedOp::Mean) {
          y[o] = simd::row_sum(row, R) / (float)R;
          continue;
        }
        if constexpr (op == RedOp::Max) {
          if (R > 0) {
            y[o] = simd::row_max(row, R);
            continue;
          }
        }
        if constexpr (op == RedOp::Min) {
          if (R > 0) {
            y[o] = simd::row_min(row, R);
            continue;
          }
        }
        if constexpr (op == RedOp::SumSquare) {
          y[o] = simd::row_sum_sq_dev(row, R, 0.f);
          continue;
        }
        if constexpr (op == RedOp::L2) {
          y[o] = std::sqrt(simd::row_sum_sq_dev(row, R, 0.f));
          continue;
        }
      }
      A r = reduce_seq<op, A>(R, [&](int64_t j) { return (A)Elem<T>::load(row[j]); });
      y[o] = Elem<T>::store((typename Elem<T>::acc)r);
    }
  });
}

// [O, R, I]: out[o, i] = reduce_r(x[o, r, i]); accumulates whole rows of I so memory is streamed.
template <RedOp op, class T>
void reduce_middle(const T* x, T* y, int64_t O, int64_t R, int64_t I) {  // x (O,R,I), y (O,I)
  using A = AccOf<op, T>;
  auto run = [&](int64_t o, int64_t jb, int64_t je) {
    const T* xo = x + o * R * I;
    T* yo = y + o * I;
    int64_t w = je - jb;
    if constexpr (std::is_same_v<T, float> &&
                  (op == RedOp::Sum || op == RedOp::Mean || op == RedOp::Max || op == RedOp::Min)) {
      std::vector<float> acc(w, op == RedOp::Max ? -INFINITY : op == RedOp::Min ? INFINITY : 0.f);
      float* a = acc.data();
      for (int64_t r = 0; r < R; r++) {
        const float* xr = xo + r * I + jb;
        if constexpr (op == RedOp::Sum || op == RedOp::Mean) {
#pragma omp simd
          for (int64_t j = 0; j < w; j++) a[j] += xr[j];
        } else if constexpr (op == RedOp::Max) {
#pragma omp simd
          for (int64_t j = 0; j < w; j++) a[j] = xr[j] > a[j] ? xr[j] : a[j];
        } else {
#pragma omp simd
          for (int64_t j = 0; j < w; j++) a[j] = xr[j] < a[j] ? xr[j] : a[j];
        }
      }
      float scale = op == RedOp::Mean ? 1.0f / (float)R : 1.0f;
      for (int64_t j = 0; j < w; j++) yo[jb + j] = op == RedOp::Mean ? a[j] * scale : a[j];
    } else if constexpr (op == RedOp::LogSumExp) {
      std::vector<A> m(w, lowest<A>()), s(w, A(0));
      for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++)
          m[j] = red_step<RedOp::Max, A>(m[j], (A)Elem<T>::load(xo[r * I + jb + j]));
      for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++)
          if (std::isfinite(m[j])) s[j] += std::exp((A)Elem<T>::load(xo[r * I + jb + j]) - m[j]);
      for (int64_t j = 0; j < w; j++)
        yo[jb + j] = Elem<T>::store(std::isfinite(m[j]) ? m[j] + std::log(s[j]) : m[j]);
    } else {
      std::vector<A> acc(w, red_init<op, A>());
      for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++)
          acc[j] = red_step<op, A>(acc[j], (A)Elem<T>::load(xo[r * I + jb + j]));
      for (int64_t j = 0; j < w; j++)
        yo[jb + j] = Elem<T>::store((typename Elem<T>::acc)red_fin<op, A>(acc[j], R));
    }
  };
  int nt = num_threads();
  if (O >= nt || I < 64) {
    parallel_for(O, grain_for(R * I), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; o++) run(o, 0, I);
    });
  } else {  // few outer rows (bias-gradient shape): split the columns
    for (int64_t o = 0; o < O; o++)
      parallel_for(I, std::max<int64_t>(64, grain_for(R)),
                   [&](int64_t b, int64_t e) { run(o, b, e); });
  }
}

// [R1, K, R2] reduced over R1 and R2 (a convolution's bias gradient: ReduceSum of (N, C, H, W)
// over N, H, W), float32 Sum or Mean: out[k] = the SIMD sums of its R1 contiguous rows of R2,
// added in order. The general path below read the same elements one offset at a time: 2 ms
// against ~0.4 for (64, 32, 28, 28) (the Fashion-MNIST UNet, ONYX_PROFILE=shapes).
template <RedOp op, class T>
constexpr bool kFloatSum = std::is_same_v<T, float> && (op == RedOp::Sum || op == RedOp::Mean);

template <RedOp op>
void reduce_outer_inner(const float* x, float* y, int64_t R1, int64_t K, int64_t R2) {
  parallel_for(K, grain_for(R1 * R2), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; k++) {
      float acc = 0.f;
      for (int64_t r = 0; r < R1; r++) acc += simd::row_sum(x + (r * K + k) * R2, R2);
      y[k] = op == RedOp::Mean ? acc / (float)(R1 * R2) : acc;
    }
  });
}

// Any axis set: per output element, reduce over a precomputed list of reduced-subspace offsets.
template <RedOp op, class T>
void reduce_general(const T* x, T* y, const Shape& in, const std::vector<bool>& red) {
  using A = AccOf<op, T>;
  int64_t rank = (int64_t)in.size();
  Shape strides(rank, 1);
  for (int64_t i = rank - 2; i >= 0; i--) strides[i] = strides[i + 1] * in[i + 1];
  std::vector<int64_t> kdims, kstr, roff{0};
  for (int64_t i = 0; i < rank; i++) {
    if (red[i]) {
      std::vector<int64_t> next;
      next.reserve(roff.size() * in[i]);
      for (int64_t base : roff)
        for (int64_t k = 0; k < in[i]; k++) next.push_back(base + k * strides[i]);
      roff.swap(next);
    } else {
      kdims.push_back(in[i]);
      kstr.push_back(strides[i]);
    }
  }
  int64_t nout = 1;
  for (int64_t d : kdims) nout *= d;
  int64_t R = (int64_t)roff.size();
  parallel_for(nout, grain_for(R), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; o++) {
      int64_t rem = o, base = 0;
      for (int64_t k = (int64_t)kdims.size() - 1; k >= 0; k--) {
        base += (rem % kdims[k]) * kstr[k];
        rem /= kdims[k];
      }
      const T* xb = x + base;
      A r = reduce_seq<op, A>(R, [&](int64_t j) { return (A)Elem<T>::load(xb[roff[j]]); });
      y[o] = Elem<T>::store((typename Elem<T>::acc)r);
    }
  });
}

template <RedOp op, class T>
void reduce_typed(const Tensor& xt, Tensor& yt, const ReduceSpec& s) {
  const T* x = xt.data<T>();
  T* y = yt.data<T>();
  const Shape& in = xt.shape();
  if (yt.numel() == 0) return;
  // Merge consecutive axes with the same reduced flag; drop size-1 axes (they change nothing).
  std::vector<int64_t> gsize;
  std::vector<bool> gred;
  bool empty = false;
  for (size_t i = 0; i < in.size(); i++) {
    if (in[i] == 0) empty = true;
    if (in[i] == 1) continue;
    if (!gsize.empty() && gred.back() == s.reduced[i])
      gsize.back() *= in[i];
    else {
      gsize.push_back(in[i]);
      gred.push_back(s.reduced[i]);
    }
  }
  if (empty) {  // reduction over an empty set: the identity of each output
    using A = AccOf<op, T>;
    A v = reduce_seq<op, A>(0, [&](int64_t) { return A(0); });
    for (int64_t i = 0; i < yt.numel(); i++) y[i] = Elem<T>::store((typename Elem<T>::acc)v);
    return;
  }
  size_t g = gsize.size();
  int nred = (int)std::count(gred.begin(), gred.end(), true);
  if (nred == 0) {  // only size-1 axes reduced: elementwise finalize
    reduce_rows<op, T>(x, y, xt.numel(), 1);
  } else if (nred == 1) {
    int64_t O = 1, R = 1, I = 1;
    size_t k = 0;
    for (; !gred[k]; k++) O *= gsize[k];
    R = gsize[k++];
    for (; k < g; k++) I *= gsize[k];
    if (I == 1)
      reduce_rows<op, T>(x, y, O, R);
    else
      reduce_middle<op, T>(x, y, O, R, I);
  } else if (kFloatSum<op, T> && g == 3 && gred[0] && !gred[1] && gred[2]) {
    if constexpr (kFloatSum<op, T>) reduce_outer_inner<op>(x, y, gsize[0], gsize[1], gsize[2]);
  } else {
    reduce_general<op, T>(x, y, in, s.reduced);
  }
}

template <RedOp op>
OpKernel make_reduce_kernel() {
  OpKernel k;
  k.value_inputs = {1};
  k.infer = [](InferContext& ctx) {
    const TensorMeta& in = ctx.input(0);
    const Tensor* axes = nullptr;
    if (axes_are_input(ctx.node.op_type, ctx.opset) && ctx.has_input(1)) axes = &ctx.value(1);
    ReduceSpec s = make_reduce_spec(ctx.node, ctx.opset, in.shape, axes);
    ctx.set_output(0, in.dtype, s.out_shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor* axes = nullptr;
    if (axes_are_input(ctx.node.op_type, ctx.opset) && ctx.has_input(1)) axes = &ctx.input(1);
    ReduceSpec s = make_reduce_spec(ctx.node, ctx.opset, x.shape(), axes);
    Tensor& y = ctx.output(0);
    if (s.noop) {
      // Reduction over no axes: the identity for Sum/Mean/Prod/Max/Min, while the composite
      // reductions still apply their elementwise steps (|x|, x², log, ...: ReduceSumSquare gives
      // x², ReduceLogSum log x), as the ONNX spec says since onnx 1.16.
      constexpr bool composite = op == RedOp::L1 || op == RedOp::L2 || op == RedOp::LogSum ||
                                 op == RedOp::LogSumExp || op == RedOp::SumSquare;
      if constexpr (composite) {
        dispatch(x.dtype(), kAllNumeric, ctx.node, [&](auto tag) {
          using T = decltype(tag);
          reduce_rows<op, T>(x.data<T>(), y.data<T>(), x.numel(), 1);
        });
      } else {
        std::memcpy(y.raw(), x.raw(), x.nbytes());
      }
      return;
    }
    if constexpr (op == RedOp::Max || op == RedOp::Min) {
      // bool (opset 20): ReduceMax is "any", ReduceMin "all" — the uint8 max/min of 0/1 bytes;
      // an empty ReduceMin gives uint8's 255 there, which is true.
      if (x.dtype() == DType::Bool) {
        Tensor xb = x.reinterpreted(DType::UInt8), yb = y.reinterpreted(DType::UInt8);
        reduce_typed<op, uint8_t>(xb, yb, s);
        uint8_t* out = yb.data<uint8_t>();
        for (int64_t i = 0; i < yb.numel(); i++) out[i] = out[i] != 0;
        return;
      }
    }
    dispatch(x.dtype(), kAllNumeric, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      reduce_typed<op, T>(x, y, s);
    });
  };
  return k;
}

// ---- ArgMax / ArgMin
// -----------------------------------------------------------------------------

template <bool is_max>
OpKernel make_arg_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& in = ctx.input(0);
    int64_t rank = in.rank();
    int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), rank, ctx.node);
    bool keepdims = ctx.node.attr_int("keepdims", 1) != 0;
    Shape out;
    for (int64_t i = 0; i < rank; i++) {
      if (i != axis)
        out.push_back(in.shape[i]);
      else if (keepdims)
        out.push_back(1);
    }
    ctx.set_output(0, DType::Int64, out);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& xt = ctx.input(0);
    int64_t rank = xt.rank();
    int64_t axis = normalize_axis(ctx.node.attr_int("axis", 0), rank, ctx.node);
    bool last = ctx.node.attr_int("select_last_index", 0) != 0;
    int64_t O = 1, R = xt.shape()[axis], I = 1;
    for (int64_t i = 0; i < axis; i++) O *= xt.shape()[i];
    for (int64_t i = axis + 1; i < rank; i++) I *= xt.shape()[i];
    int64_t* y = ctx.output(0).data<int64_t>();
    if (O * I == 0) return;
    ONYX_CHECK(R > 0, ctx.node.describe(), ": cannot take ", is_max ? "ArgMax" : "ArgMin",
               " over an empty axis of ", shape_str(xt.shape()));
    dispatch(xt.dtype(), kAllNumeric, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      using A = typename Elem<T>::acc;
      const T* x = xt.data<T>();
      // better(v, best): v replaces the current best. NaN wins (numpy returns the first NaN).
      auto better = [&](A v, A best) {
        if (best != best) return false;
        if (v != v) return true;
        if constexpr (is_max)
          return last ? v >= best : v > best;
        else
          return last ? v <= best : v < best;
      };
      parallel_for(O, grain_for(R * I), [&](int64_t b, int64_t e) {
        std::vector<A> best(I);
        for (int64_t o = b; o < e; o++) {
          const T* xo = x + o * R * I;
          int64_t* yo = y + o * I;
          for (int64_t j = 0; j < I; j++) {
            best[j] = Elem<T>::load(xo[j]);
            yo[j] = 0;
          }
          for (int64_t r = 1; r < R; r++)
            for (int64_t j = 0; j < I; j++) {
              A v = Elem<T>::load(xo[r * I + j]);
              if (better(v, best[j])) {
                best[j] = v;
                yo[j] = r;
              }
            }
        }
      });
    });
  };
  return k;
}

// ---- CumSum
// --------------------------------------------------------------------------------------

OpKernel make_cumsum_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& in = ctx.input(0);
    const TensorMeta& ax = ctx.input(1);
    ONYX_CHECK(ax.numel() == 1 && ax.rank() <= 1, ctx.node.describe(),
               ": axis must be a scalar or a 1-element 1-D tensor, got shape ",
               shape_str(ax.shape));
    ctx.set_output(0, in.dtype, in.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& xt = ctx.input(0);
    std::vector<int64_t> av = ctx.input(1).to_int64_vector();
    ONYX_CHECK(av.size() == 1, ctx.node.describe(), ": axis must hold one value");
    int64_t rank = xt.rank();
    int64_t axis = normalize_axis(av[0], rank, ctx.node);
    bool exclusive = ctx.node.attr_int("exclusive", 0) != 0;
    bool reverse = ctx.node.attr_int("reverse", 0) != 0;
    int64_t O = 1, R = rank ? xt.shape()[axis] : 1, I = 1;
    for (int64_t i = 0; i < axis; i++) O *= xt.shape()[i];
    for (int64_t i = axis + 1; i < rank; i++) I *= xt.shape()[i];
    if (xt.numel() == 0) return;
    Tensor& yt = ctx.output(0);
    dispatch(xt.dtype(), kAllNumeric, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      using A = typename Elem<T>::acc;
      const T* x = xt.data<T>();
      T* y = yt.data<T>();
      parallel_for(O, grain_for(R * I), [&](int64_t b, int64_t e) {
        std::vector<A> acc(I);
        for (int64_t o = b; o < e; o++) {
          std::fill(acc.begin(), acc.end(), A(0));
          for (int64_t s = 0; s < R; s++) {
            int64_t r = reverse ? R - 1 - s : s;
            const T* xr = x + (o * R + r) * I;
            T* yr = y + (o * R + r) * I;
            for (int64_t j = 0; j < I; j++) {
              A v = Elem<T>::load(xr[j]);
              if (exclusive) {
                yr[j] = Elem<T>::store(acc[j]);
                acc[j] += v;
              } else {
                acc[j] += v;
                yr[j] = Elem<T>::store(acc[j]);
              }
            }
          }
        }
      });
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(reduce, Cpu) {
  r.add("", "ReduceSum", make_reduce_kernel<RedOp::Sum>());
  r.add("", "ReduceMean", make_reduce_kernel<RedOp::Mean>());
  r.add("", "ReduceProd", make_reduce_kernel<RedOp::Prod>());
  r.add("", "ReduceMax", make_reduce_kernel<RedOp::Max>());
  r.add("", "ReduceMin", make_reduce_kernel<RedOp::Min>());
  r.add("", "ReduceL1", make_reduce_kernel<RedOp::L1>());
  r.add("", "ReduceL2", make_reduce_kernel<RedOp::L2>());
  r.add("", "ReduceLogSum", make_reduce_kernel<RedOp::LogSum>());
  r.add("", "ReduceLogSumExp", make_reduce_kernel<RedOp::LogSumExp>());
  r.add("", "ReduceSumSquare", make_reduce_kernel<RedOp::SumSquare>());
  r.add("", "ArgMax", make_arg_kernel<true>());
  r.add("", "ArgMin", make_arg_kernel<false>());
  r.add("", "CumSum", make_cumsum_kernel());
}

}  // namespace onyx::kernels
