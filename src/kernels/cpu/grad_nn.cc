// kernels/cpu/grad_nn.cc — fused backward kernels of the nn family, "onyx" domain, emitted by the
// rules in autodiff/gradients/nn.cc (DESIGN decision 6):
//   SoftmaxGrad(dy, y)                         dx = y * (dy - sum(dy * y))          over the axis
//   LogSoftmaxGrad(dy, y)                      dx = dy - exp(y) * sum(dy)           over the axis
//   LayerNormGrad(dy, x, scale, mean, inv)     -> dx, dscale, dbias
//   DropoutGrad(dy, mask, [ratio], [training]) dx = dy * mask / (1 - ratio)
//   SoftmaxCrossEntropyLossGrad(dloss, logits | log_prob, labels, [weights]) -> dlogits
//   NLLLossGrad(dloss, labels, [weights])      -> d input (a scatter of -dloss * w)
//   BatchNormGrad(dy, x, scale, mean, var)     -> dx, dscale, dbias (training or inference mode)
// Hand-written because these sit on the transformer backward hot path: float32 rows use AVX2
// (nn_util.h primitives) and are threaded over rows; LayerNorm's dscale/dbias are reduced over all
// rows in the same pass through per-block partial sums (no races; fixed block split for a given
// thread count, so results are deterministic). Other float types compute in double.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "runtime/kernel.h"
#include "runtime/parallel.h"

namespace onyx::runtime {
namespace {

using namespace nnutil;

int64_t rows_grain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
}

void check_same_shape(const ir::Node& node, const TensorMeta& a, const TensorMeta& b,
                      const char* an, const char* bn) {
  ONYX_CHECK(a.shape == b.shape, node.describe(), ": ", an, " ", shape_str(a.shape), " and ", bn,
             " ", shape_str(b.shape), " must have the same shape");
}

// ---- SoftmaxGrad / LogSoftmaxGrad ---------------------------------------------------------------
// Attributes: axis; flatten = 1 for the opset < 13 semantics (the input coerced to 2-D at `axis`,
// the reduction running over every axis from `axis` on).

struct Dims3 {
  int64_t O, R, I;  // viewed as (O, R, I), reduced over R
};

Dims3 softmax_grad_dims(const ir::Node& node, const Shape& s) {
  int64_t rank = (int64_t)s.size();
  Dims3 d{1, 1, 1};
  if (rank == 0) return d;
  int64_t axis = node.attr_int("axis", -1);
  if (node.attr_int("flatten", 0) != 0) {
    ONYX_CHECK(axis >= -rank && axis <= rank, node.describe(), ": axis ", axis,
               " is out of range for rank ", rank);
    if (axis < 0) axis += rank;
    for (int64_t i = 0; i < axis; i++) d.O *= s[i];
    for (int64_t i = axis; i < rank; i++) d.R *= s[i];
  } else {
    axis = normalize_axis(axis, rank, node);
    for (int64_t i = 0; i < axis; i++) d.O *= s[i];
    d.R = s[axis];
    for (int64_t i = axis + 1; i < rank; i++) d.I *= s[i];
  }
  return d;
}

// dx = y * (dy - dot(dy, y)) over one contiguous row.
inline void softmax_grad_row(const float* dy, const float* y, float* dx, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(dy + i + 8), _mm256_loadu_ps(y + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(y + i), a0);
  float s = hsum8(_mm256_add_ps(a0, a1));
  for (; i < n; i++) s += dy[i] * y[i];
  __m256 vs = _mm256_set1_ps(s);
  i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        dx + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), _mm256_sub_ps(_mm256_loadu_ps(dy + i), vs)));
  for (; i < n; i++) dx[i] = y[i] * (dy[i] - s);
}

// dx = dy - exp(y) * sum(dy) over one contiguous row (y = log-softmax <= 0).
inline void log_softmax_grad_row(const float* dy, const float* y, float* dx, int64_t n) {
  float s = row_sum(dy, n);
  __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dx + i,
                     _mm256_fnmadd_ps(exp8(_mm256_loadu_ps(y + i)), vs, _mm256_loadu_ps(dy + i)));
  for (; i < n; i++) dx[i] = dy[i] - std::exp(y[i]) * s;
}

template <bool LOG>
void softmax_grad_f32(const float* dy, const float* y, float* dx, Dims3 d) {  // all (O, R, I)
  if (d.I == 1) {
    parallel_for(d.O, rows_grain(d.R), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; o++) {
        if constexpr (LOG)
          log_softmax_grad_row(dy + o * d.R, y + o * d.R, dx + o * d.R, d.R);
        else
          softmax_grad_row(dy + o * d.R, y + o * d.R, dx + o * d.R, d.R);
      }
    });
    return;
  }
  // Reduction over a strided axis: tasks are (o, block of 256 inner columns), vectorized over j.
  const int64_t JB = 256;
  int64_t njb = (d.I + JB - 1) / JB;
  parallel_for(d.O * njb, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.R * JB)),
               [&](int64_t b, int64_t e) {
                 float s[JB];
                 for (int64_t t = b; t < e; t++) {
                   int64_t o = t / njb, j0 = (t % njb) * JB, nj = std::min(JB, d.I - j0);
                   int64_t base = o * d.R * d.I + j0;
                   for (int64_t j = 0; j < nj; j++) s[j] = 0.f;
                   for (int64_t r = 0; r < d.R; r++) {
                     const float* dyr = dy + base + r * d.I;
                     const float* yr = y + base + r * d.I;
                     if constexpr (LOG) {
#pragma omp simd
                       for (int64_t j = 0; j < nj; j++) s[j] += dyr[j];
                     } else {
#pragma omp simd
                       for (int64_t j = 0; j < nj; j++) s[j] += dyr[j] * yr[j];
                     }
                   }
                   for (int64_t r = 0; r < d.R; r++) {
                     const float* dyr = dy + base + r * d.I;
                     const float* yr = y + base + r * d.I;
                     float* dxr = dx + base + r * d.I;
                     if constexpr (LOG) {
                       int64_t j = 0;
                       for (; j + 8 <= nj; j += 8)
                         _mm256_storeu_ps(dxr + j, _mm256_fnmadd_ps(exp8(_mm256_loadu_ps(yr + j)),
                                                                    _mm256_loadu_ps(s + j),
                                                                    _mm256_loadu_ps(dyr + j)));
                       for (; j < nj; j++) dxr[j] = dyr[j] - std::exp(yr[j]) * s[j];
                     } else {
#pragma omp simd
                       for (int64_t j = 0; j < nj; j++) dxr[j] = yr[j] * (dyr[j] - s[j]);
                     }
                   }
                 }
               });
}

template <bool LOG, class T>
void softmax_grad_generic(const T* dy, const T* y, T* dx, Dims3 d) {
  parallel_for(d.O * d.I, rows_grain(d.R), [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; q++) {
      int64_t base = (q / d.I) * d.R * d.I + q % d.I;
      double s = 0;
      for (int64_t r = 0; r < d.R; r++) {
        int64_t k = base + r * d.I;
        s += LOG ? Elem<T>::load(dy[k]) : Elem<T>::load(dy[k]) * Elem<T>::load(y[k]);
      }
      for (int64_t r = 0; r < d.R; r++) {
        int64_t k = base + r * d.I;
        double g = Elem<T>::load(dy[k]), yv = Elem<T>::load(y[k]);
        dx[k] = Elem<T>::store(LOG ? g - std::exp(yv) * s : yv * (g - s));
      }
    }
  });
}

template <bool LOG>
OpKernel make_softmax_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    check_same_shape(ctx.node, dy, ctx.input(1), "dy", "y");
    softmax_grad_dims(ctx.node, dy.shape);  // validates axis
    ctx.set_output(0, dy.dtype, dy.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    const Tensor& y = ctx.input(1);
    Tensor& dx = ctx.output(0);
    ONYX_CHECK(dy.dtype() == y.dtype(), ctx.node.describe(), ": dy and y dtypes differ");
    if (dy.numel() == 0) return;
    Dims3 d = softmax_grad_dims(ctx.node, dy.shape());
    dispatch(dy.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, float>)
        softmax_grad_f32<LOG>(dy.data<float>(), y.data<float>(), dx.data<float>(), d);
      else
        softmax_grad_generic<LOG, T>(dy.data<T>(), y.data<T>(), dx.data<T>(), d);
    });
  };
  return k;
}

// ---- LayerNormGrad ------------------------------------------------------------------------------
// x (rows, cols) normalized over axis..end; mean, inv (rows) as the forward saved them.
//   xhat = (x - mean) * inv,  g = dy * scale
//   dx = inv * (g - mean(g) - xhat * mean(g * xhat)),  dscale = sum_rows dy * xhat,  dbias =
//   sum_rows dy

// Scale (right-aligned broadcastable to the normalized shape) expanded to `cols` values.
template <class C>
std::vector<C> expand_scale(const Tensor& t, const Shape& target, const ir::Node& node) {
  int64_t n = shape_numel(target);
  const Shape& s = t.shape();
  int64_t r = (int64_t)target.size(), sr = (int64_t)s.size();
  ONYX_CHECK(sr <= r, node.describe(), ": scale of shape ", shape_str(s), " does not broadcast to ",
             shape_str(target));
  std::vector<int64_t> st(r, 0);
  int64_t acc = 1;
  for (int64_t i = sr - 1; i >= 0; i--) {
    int64_t dd = s[i], td = target[r - sr + i];
    ONYX_CHECK(dd == td || dd == 1, node.describe(), ": scale of shape ", shape_str(s),
               " does not broadcast to ", shape_str(target));
    st[r - sr + i] = dd == 1 ? 0 : acc;
    acc *= dd;
  }
  std::vector<C> out(n);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, off = 0;
    for (int64_t k = r - 1; k >= 0; k--) {
      off += (rem % target[k]) * st[k];
      rem /= target[k];
    }
    out[i] = (C)t.get_as_double(off);
  }
  return out;
}

// One float32 row: writes dx, accumulates dy*xhat into ds and dy into db.
inline void layer_norm_grad_row_f32(const float* dy, const float* x, const float* scale, float mean,
                                    float inv, int64_t n, float* dx, float* ds, float* db) {
  __m256 vm = _mm256_set1_ps(mean), vi = _mm256_set1_ps(inv);
  __m256 sg = _mm256_setzero_ps(), sgx = sg;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 d = _mm256_loadu_ps(dy + i);
    __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vi);
    __m256 g = _mm256_mul_ps(d, _mm256_loadu_ps(scale + i));
    sg = _mm256_add_ps(sg, g);
    sgx = _mm256_fmadd_ps(g, xh, sgx);
    _mm256_storeu_ps(ds + i, _mm256_fmadd_ps(d, xh, _mm256_loadu_ps(ds + i)));
    _mm256_storeu_ps(db + i, _mm256_add_ps(d, _mm256_loadu_ps(db + i)));
  }
  float s_g = hsum8(sg), s_gx = hsum8(sgx);
  for (; i < n; i++) {
    float xh = (x[i] - mean) * inv, g = dy[i] * scale[i];
    s_g += g;
    s_gx += g * xh;
    ds[i] += dy[i] * xh;
    db[i] += dy[i];
  }
  float mg = s_g / (float)n, mgx = s_gx / (float)n;
  __m256 vmg = _mm256_set1_ps(mg), vmgx = _mm256_set1_ps(mgx);
  i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vi);
    __m256 g = _mm256_mul_ps(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(scale + i));
    __m256 t = _mm256_fnmadd_ps(xh, vmgx, _mm256_sub_ps(g, vmg));
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(t, vi));
  }
  for (; i < n; i++) {
    float xh = (x[i] - mean) * inv, g = dy[i] * scale[i];
    dx[i] = (g - mg - xh * mgx) * inv;
  }
}

// Generic row in double (any float storage T, statistics of type U).
template <class T>
void layer_norm_grad_row_generic(const T* dy, const T* x, const double* scale, double mean,
                                 double inv, int64_t n, T* dx, double* ds, double* db) {
  double s_g = 0, s_gx = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = Elem<T>::load(dy[i]), xh = (Elem<T>::load(x[i]) - mean) * inv, g = d * scale[i];
    s_g += g;
    s_gx += g * xh;
    ds[i] += d * xh;
    db[i] += d;
  }
  double mg = s_g / (double)n, mgx = s_gx / (double)n;
  for (int64_t i = 0; i < n; i++) {
    double xh = (Elem<T>::load(x[i]) - mean) * inv, g = Elem<T>::load(dy[i]) * scale[i];
    dx[i] = Elem<T>::store((g - mg - xh * mgx) * inv);
  }
}

// Rows split into P contiguous blocks (P <= threads); block p accumulates its dscale/dbias partial
// sums in part[p]; the partials are then summed per column (threaded over columns).
template <class A, class RowFn, class Store>
void blocked_row_reduce(int64_t rows, int64_t cols, RowFn&& row, Store&& store) {
  int64_t grain = rows_grain(cols);
  int64_t P = std::min<int64_t>(num_threads(), (rows + grain - 1) / grain);
  P = std::max<int64_t>(1, P);
  std::vector<A> part((size_t)(2 * P * cols), A(0));
  parallel_for(P, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; p++) {
      int64_t r0 = rows * p / P, r1 = rows * (p + 1) / P;
      A* ds = part.data() + 2 * p * cols;
      for (int64_t r = r0; r < r1; r++) row(r, ds, ds + cols);
    }
  });
  parallel_for(cols, 4096, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; c++) {
      A s = 0, t = 0;
      for (int64_t p = 0; p < P; p++) {
        s += part[2 * p * cols + c];
        t += part[2 * p * cols + cols + c];
      }
      store(c, s, t);
    }
  });
}

OpKernel make_layer_norm_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    const TensorMeta& x = ctx.input(1);
    const TensorMeta& scale = ctx.input(2);
    check_same_shape(ctx.node, dy, x, "dy", "x");
    int64_t axis = normalize_axis(ctx.node.attr_int("axis", -1), x.rank(), ctx.node);
    int64_t rows = 1;
    for (int64_t i = 0; i < axis; i++) rows *= x.shape[i];
    ONYX_CHECK(ctx.input(3).numel() == rows && ctx.input(4).numel() == rows, ctx.node.describe(),
               ": mean and inv_std_dev must have ", rows, " elements, got ",
               shape_str(ctx.input(3).shape), " and ", shape_str(ctx.input(4).shape));
    Shape norm(x.shape.begin() + axis, x.shape.end());
    ctx.set_output(0, x.dtype, x.shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, scale.dtype, norm);
    if (ctx.num_outputs() > 2) ctx.set_output(2, scale.dtype, norm);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& dyt = ctx.input(0);
    const Tensor& xt = ctx.input(1);
    const Tensor& mt = ctx.input(3);
    const Tensor& it = ctx.input(4);
    const Shape& s = xt.shape();
    int64_t axis = normalize_axis(node.attr_int("axis", -1), xt.rank(), node);
    Shape norm(s.begin() + axis, s.end());
    int64_t rows = 1, cols = shape_numel(norm);
    for (int64_t i = 0; i < axis; i++) rows *= s[i];
    Tensor& dxt = ctx.output(0);
    Tensor* dst = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    Tensor* dbt = ctx.has_output(2) ? &ctx.output(2) : nullptr;
    ONYX_CHECK(dyt.dtype() == xt.dtype(), node.describe(), ": dy and x dtypes differ");
    ONYX_CHECK(mt.dtype() == it.dtype(), node.describe(), ": mean and inv_std_dev dtypes differ");
    // dscale (output 1) / dbias (output 2) bound to a gradient buffer that accumulates: the
    // column sum is added to what is there (float32 only, as onyx.AccumulateGrad did).
    const bool add_s = ctx.accumulates(1), add_b = ctx.accumulates(2);
    ONYX_CHECK((!add_s || dst->dtype() == DType::Float32) &&
                   (!add_b || dbt->dtype() == DType::Float32),
               node.describe(), ": accumulation supports float32 gradients");
    auto store_param = [&](Tensor* t, int64_t c, double v) {
      dispatch(t->dtype(), kFloats, node, [&](auto tag) {
        using P = decltype(tag);
        if ((t == dst && add_s) || (t == dbt && add_b))
          t->data<float>()[c] += (float)v;
        else
          t->data<P>()[c] = Elem<P>::store(v);
      });
    };
    if (cols == 0) return;
    if (rows == 0) {
      if (add_s || add_b) return;  // adding zeros
      for (int64_t c = 0; c < cols; c++) {
        if (dst) store_param(dst, c, 0.0);
        if (dbt) store_param(dbt, c, 0.0);
      }
      return;
    }
    bool fast = xt.dtype() == DType::Float32 && mt.dtype() == DType::Float32;
    if (fast) {
      std::vector<float> scale = expand_scale<float>(ctx.input(2), norm, node);
      const float *dy = dyt.data<float>(), *x = xt.data<float>();
      const float *mean = mt.data<float>(), *inv = it.data<float>();
      float* dx = dxt.data<float>();
      // dscale/dbias land in float vectors first when the parameters are not float32 (the dtype
      // switch may throw, which must not happen inside a threaded loop).
      bool f32_params =
          (!dst || dst->dtype() == DType::Float32) && (!dbt || dbt->dtype() == DType::Float32);
      std::vector<float> ds_buf, db_buf;
      if (!f32_params) {
        ds_buf.resize(cols);
        db_buf.resize(cols);
      }
      float* dsp = f32_params ? (dst ? dst->data<float>() : nullptr) : ds_buf.data();
      float* dbp = f32_params ? (dbt ? dbt->data<float>() : nullptr) : db_buf.data();
      blocked_row_reduce<float>(
          rows, cols,
          [&](int64_t r, float* ds, float* db) {
            layer_norm_grad_row_f32(dy + r * cols, x + r * cols, scale.data(), mean[r], inv[r],
                                    cols, dx + r * cols, ds, db);
          },
          [&](int64_t c, float sv, float bv) {
            if (dsp) dsp[c] = add_s ? dsp[c] + sv : sv;
            if (dbp) dbp[c] = add_b ? dbp[c] + bv : bv;
          });
      if (!f32_params)
        for (int64_t c = 0; c < cols; c++) {
          if (dst) store_param(dst, c, ds_buf[c]);
          if (dbt) store_param(dbt, c, db_buf[c]);
        }
      return;
    }
    dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      std::vector<double> scale = expand_scale<double>(ctx.input(2), norm, node);
      std::vector<double> mean = mt.to_double_vector(), inv = it.to_double_vector();
      const T *dy = dyt.data<T>(), *x = xt.data<T>();
      T* dx = dxt.data<T>();
      // Parameter gradients are written after the threaded part (dispatch throws only there).
      std::vector<double> ds(cols), db(cols);
      blocked_row_reduce<double>(
          rows, cols,
          [&](int64_t r, double* pds, double* pdb) {
            layer_norm_grad_row_generic<T>(dy + r * cols, x + r * cols, scale.data(), mean[r],
                                           inv[r], cols, dx + r * cols, pds, pdb);
          },
          [&](int64_t c, double sv, double bv) {
            ds[c] = sv;
            db[c] = bv;
          });
      for (int64_t c = 0; c < cols; c++) {
        if (dst) store_param(dst, c, ds[c]);
        if (dbt) store_param(dbt, c, db[c]);
      }
    });
  };
  return k;
}

// ---- DropoutGrad --------------------------------------------------------------------------------
// Inputs: dy, mask (bool, as the forward produced it), ratio (optional scalar, default 0.5),
// training_mode (optional bool scalar; absent means the node asks for training). Like the forward,
// dropout is active only when the node asks for it AND the run is a training run
// (RunOptions::training, seen here as ctx.training). Not active or ratio 0: dx = dy, as the forward
// was the identity (its mask is then all true, so it alone cannot tell). Otherwise dx = mask ? dy *
// (float)(1 / (1 - ratio)) : 0, the same float scale the forward multiplied by.
OpKernel make_dropout_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    check_same_shape(ctx.node, dy, ctx.input(1), "dy", "mask");
    ctx.set_output(0, dy.dtype, dy.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& dyt = ctx.input(0);
    const Tensor& mt = ctx.input(1);
    Tensor& dxt = ctx.output(0);
    double ratio = ctx.has_input(2) ? ctx.input(2).get_as_double(0) : 0.5;
    bool training = (ctx.has_input(3) ? ctx.input(3).get_as_double(0) != 0 : true) && ctx.training;
    int64_t n = dyt.numel();
    if (!training || ratio == 0) {
      if (dxt.raw() != dyt.raw()) std::memcpy(dxt.raw(), dyt.raw(), dyt.nbytes());
      return;
    }
    ONYX_CHECK(mt.dtype() == DType::Bool, node.describe(), ": mask must be bool, got ",
               dtype_name(mt.dtype()));
    const double scale = ratio >= 1 ? 0.0 : 1.0 / (1.0 - ratio);
    const bool* m = mt.data<bool>();
    dispatch(dyt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* dy = dyt.data<T>();
      T* dx = dxt.data<T>();
      const float fs = (float)scale;
      parallel_for(n, 32768, [&](int64_t b, int64_t e) {
        int64_t i = b;
        if constexpr (std::is_same_v<T, float>) {
          const __m256 vs = _mm256_set1_ps(fs);
          const __m256i zero = _mm256_setzero_si256();
          for (; i + 8 <= e; i += 8) {
            __m256i mi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(m + i)));
            __m256 drop = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mi, zero));
            __m256 g = _mm256_mul_ps(_mm256_loadu_ps(dy + i), vs);
            _mm256_storeu_ps(dx + i, _mm256_andnot_ps(drop, g));
          }
          for (; i < e; i++) dx[i] = m[i] ? dy[i] * fs : 0.0f;
        } else {
          for (; i < e; i++)
            dx[i] = m[i] ? Elem<T>::store(Elem<T>::load(dy[i]) * scale) : Elem<T>::store(0.0);
        }
      });
    });
  };
  return k;
}

// ---- SoftmaxCrossEntropyLossGrad / NLLLossGrad --------------------------------------------------
// Same semantics as loss.cc: input (N, C, d1..dk) viewed as (N, C, D), targets (N, D); a target
// equal to ignore_index (only when the attribute is present) contributes nothing; weight w[c]
// scales its target's loss; mean divides by the sum of the weights of the non-ignored targets
// (their count without weights). coef[q] = d loss / d (per-target loss q) * w[t_q]:
//   none: dloss[q] * w,  sum: dloss * w,  mean: dloss * w / sum(w).

enum class Reduction { None, Sum, Mean };

Reduction reduction_of(const ir::Node& node) {
  std::string r = node.attr_string("reduction", "mean");
  if (r == "none") return Reduction::None;
  if (r == "sum") return Reduction::Sum;
  if (r == "mean") return Reduction::Mean;
  ONYX_UNSUPPORTED(node.describe(), ": reduction '", r, "' is not supported (none, sum, mean)");
}

// Per-target coefficients (0 for ignored targets) and the targets (-1 where ignored).
void loss_coefficients(const KernelContext& ctx, int labels_input, int64_t C,
                       std::vector<int64_t>& tgt, std::vector<double>& coef) {
  const ir::Node& node = ctx.node;
  const Tensor& dl = ctx.input(0);
  const Tensor& t = ctx.input(labels_input);
  const Tensor* w = ctx.has_input(labels_input + 1) ? &ctx.input(labels_input + 1) : nullptr;
  bool has_ii = node.has_attr("ignore_index");
  int64_t ii = node.attr_int("ignore_index", 0);
  tgt = t.to_int64_vector();
  int64_t M = (int64_t)tgt.size();
  std::vector<double> weights = w ? w->to_double_vector() : std::vector<double>{};
  if (w)
    ONYX_CHECK((int64_t)weights.size() == C, node.describe(), ": weight must have ", C,
               " elements, got ", shape_str(w->shape()));
  coef.assign(M, 0.0);
  double ws = 0;
  for (int64_t q = 0; q < M; q++) {
    if (has_ii && tgt[q] == ii) {
      tgt[q] = -1;
      continue;
    }
    ONYX_CHECK(tgt[q] >= 0 && tgt[q] < C, node.describe(), ": target value ", tgt[q],
               " at flat index ", q, " is outside [0, ", C, ")",
               has_ii ? " and is not ignore_index" : "");
    coef[q] = w ? weights[tgt[q]] : 1.0;
    ws += coef[q];
  }
  Reduction red = reduction_of(node);
  if (red == Reduction::None) {
    ONYX_CHECK(dl.numel() == M, node.describe(), ": dloss must have ", M, " elements, got ",
               shape_str(dl.shape()));
    for (int64_t q = 0; q < M; q++)
      if (tgt[q] >= 0) coef[q] *= dl.get_as_double(q);
    return;
  }
  ONYX_CHECK(dl.numel() == 1, node.describe(), ": dloss must be a scalar, got ",
             shape_str(dl.shape()));
  double g = dl.get_as_double(0);
  if (red == Reduction::Mean) g = ws != 0 ? g / ws : 0.0;
  for (int64_t q = 0; q < M; q++) coef[q] *= g;
}

void check_targets_meta(const ir::Node& node, const Shape& x, const TensorMeta& t) {
  ONYX_CHECK(x.size() >= 2, node.describe(), ": input must be (N, C, d1..dk), got ", shape_str(x));
  Shape expect{x[0]};
  expect.insert(expect.end(), x.begin() + 2, x.end());
  ONYX_CHECK(t.shape == expect, node.describe(), ": target shape ", shape_str(t.shape),
             " does not match input shape ", shape_str(x));
  ONYX_CHECK(t.dtype == DType::Int32 || t.dtype == DType::Int64, node.describe(),
             ": target must be int32 or int64, got ", dtype_name(t.dtype));
}

// dx = coef * exp(lp) over one row (lp <= 0).
inline void scaled_exp_row(const float* lp, float* dx, int64_t n, float coef) {
  __m256 vc = _mm256_set1_ps(coef);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dx + i, _mm256_mul_ps(exp8(_mm256_loadu_ps(lp + i)), vc));
  for (; i < n; i++) dx[i] = std::exp(lp[i]) * coef;
}

// Inputs: dloss, X (logits, or log_prob when attribute log_prob=1), labels, [weights].
// dX[n, c, j] = coef[n, j] * (softmax(X)[n, c, j] - [c == t[n, j]]).
OpKernel make_sce_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(1);
    check_targets_meta(ctx.node, x.shape, ctx.input(2));
    reduction_of(ctx.node);
    ctx.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& xt = ctx.input(1);
    Tensor& dxt = ctx.output(0);
    const Shape& s = xt.shape();
    int64_t N = s[0], C = s[1], D = 1;
    for (size_t i = 2; i < s.size(); i++) D *= s[i];
    bool is_lp = node.attr_int("log_prob", 0) != 0;
    std::vector<int64_t> tgt;
    std::vector<double> coef;
    loss_coefficients(ctx, 2, C, tgt, coef);
    if (xt.numel() == 0) return;
    dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      T* dx = dxt.data<T>();
      int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, C * D));
      parallel_for(N, grain, [&](int64_t b, int64_t e) {
        for (int64_t n = b; n < e; n++) {
          const T* xn = x + n * C * D;
          T* dn = dx + n * C * D;
          if constexpr (std::is_same_v<T, float>) {
            if (D == 1) {  // contiguous class row
              int64_t c = tgt[n];
              if (c < 0) {
                std::memset(dn, 0, C * sizeof(float));
                continue;
              }
              float cf = (float)coef[n];
              if (is_lp) {
                scaled_exp_row(xn, dn, C, cf);
              } else {
                float m = row_max(xn, C);
                float sum = row_sum_exp(xn, C, m, dn);
                row_scale(dn, C, cf / sum);
              }
              dn[c] -= cf;
              continue;
            }
          }
          for (int64_t j = 0; j < D; j++) {
            int64_t q = n * D + j, c = tgt[q];
            if (c < 0) {
              for (int64_t k2 = 0; k2 < C; k2++) dn[k2 * D + j] = Elem<T>::store(0.0);
              continue;
            }
            double cf = coef[q];
            if (is_lp) {
              for (int64_t k2 = 0; k2 < C; k2++)
                dn[k2 * D + j] = Elem<T>::store(
                    cf * (std::exp((double)Elem<T>::load(xn[k2 * D + j])) - (k2 == c ? 1.0 : 0.0)));
              continue;
            }
            double m = -INFINITY;
            for (int64_t k2 = 0; k2 < C; k2++) {
              double v = Elem<T>::load(xn[k2 * D + j]);
              m = (v > m || v != v) ? v : m;
            }
            double sum = 0;
            for (int64_t k2 = 0; k2 < C; k2++) sum += std::exp(Elem<T>::load(xn[k2 * D + j]) - m);
            double inv = 1.0 / sum;
            for (int64_t k2 = 0; k2 < C; k2++)
              dn[k2 * D + j] = Elem<T>::store(
                  cf * (std::exp(Elem<T>::load(xn[k2 * D + j]) - m) * inv - (k2 == c ? 1.0 : 0.0)));
          }
        }
      });
    });
  };
  return k;
}

// Inputs: dloss, labels, [weights]; attribute input_shape = the forward input's shape (N, C, d..).
// dX = 0 except dX[n, t, j] = -coef[n, j].
OpKernel make_nll_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    Shape xs = ctx.node.attr_ints_required("input_shape");
    check_targets_meta(ctx.node, xs, ctx.input(1));
    reduction_of(ctx.node);
    ctx.set_output(0, ctx.input(0).dtype, xs);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    Tensor& dxt = ctx.output(0);
    const Shape& s = dxt.shape();
    int64_t N = s[0], C = s[1], D = 1;
    for (size_t i = 2; i < s.size(); i++) D *= s[i];
    std::vector<int64_t> tgt;
    std::vector<double> coef;
    loss_coefficients(ctx, 1, C, tgt, coef);
    dispatch(dxt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      T* dx = dxt.data<T>();
      const T zero = Elem<T>::store(0.0);
      parallel_for(N, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, C * D)),
                   [&](int64_t b, int64_t e) {
                     if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
                       std::memset(dx + b * C * D, 0, (e - b) * C * D * sizeof(T));
                     else
                       std::fill(dx + b * C * D, dx + e * C * D, zero);
                     for (int64_t n = b; n < e; n++)
                       for (int64_t j = 0; j < D; j++) {
                         int64_t q = n * D + j;
                         if (tgt[q] >= 0) dx[(n * C + tgt[q]) * D + j] = Elem<T>::store(-coef[q]);
                       }
                   });
    });
  };
  return k;
}

// ---- BatchNormGrad ------------------------------------------------------------------------------
// Inputs: dy, x (N, C, d..), scale (C), mean (C), var (C); attributes epsilon, training_mode.
// training_mode=1: the forward normalized with the batch statistics (recomputed here, as the
// forward at opset >= 14 saves none):
//   dx = scale * inv * (dy - mean(dy) - xhat * mean(dy * xhat)) per channel
// training_mode=0: the forward used the given running statistics: dx = dy * scale * inv.
// Both: dscale = sum(dy * xhat), dbias = sum(dy).
OpKernel make_batch_norm_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    const TensorMeta& x = ctx.input(1);
    check_same_shape(ctx.node, dy, x, "dy", "x");
    ONYX_CHECK(x.rank() >= 2, ctx.node.describe(), ": input must have rank >= 2, got ",
               shape_str(x.shape));
    for (int i = 2; i <= 4; i++)
      ONYX_CHECK(ctx.input(i).numel() == x.shape[1], ctx.node.describe(), ": input ", i,
                 " must have ", x.shape[1], " elements, got ", shape_str(ctx.input(i).shape));
    ctx.set_output(0, x.dtype, x.shape);
    for (int i = 1; i < ctx.num_outputs() && i < 3; i++)
      ctx.set_output(i, ctx.input(2).dtype, ctx.input(2).shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& dyt = ctx.input(0);
    const Tensor& xt = ctx.input(1);
    const Shape& s = xt.shape();
    int64_t N = s[0], C = s[1], S = 1;
    for (size_t i = 2; i < s.size(); i++) S *= s[i];
    std::vector<double> scale = ctx.input(2).to_double_vector();
    std::vector<double> rmean = ctx.input(3).to_double_vector();
    std::vector<double> rvar = ctx.input(4).to_double_vector();
    double eps = node.attr_float("epsilon", 1e-5f);
    bool training = node.attr_int("training_mode", 0) != 0;
    std::vector<double> ds(C, 0.0), db(C, 0.0);
    double cnt = (double)(N * S);
    dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      const T* dy = dyt.data<T>();
      T* dx = ctx.output(0).data<T>();
      parallel_for(C, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; c++) {
          double m = rmean[c], var = rvar[c];
          if (training) {
            double sum = 0, ss = 0;
            for (int64_t n = 0; n < N; n++)
              for (int64_t i = 0; i < S; i++) sum += Elem<T>::load(x[(n * C + c) * S + i]);
            m = cnt > 0 ? sum / cnt : 0;
            for (int64_t n = 0; n < N; n++)
              for (int64_t i = 0; i < S; i++) {
                double d = Elem<T>::load(x[(n * C + c) * S + i]) - m;
                ss += d * d;
              }
            var = cnt > 0 ? ss / cnt : 0;
          }
          double inv = 1.0 / std::sqrt(var + eps);
          double sdy = 0, sdyx = 0;
          for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < S; i++) {
              int64_t kk = (n * C + c) * S + i;
              double g = Elem<T>::load(dy[kk]);
              sdy += g;
              sdyx += g * (Elem<T>::load(x[kk]) - m) * inv;
            }
          ds[c] = sdyx;
          db[c] = sdy;
          double a = scale[c] * inv;
          double mg = training && cnt > 0 ? sdy / cnt : 0.0;
          double mgx = training && cnt > 0 ? sdyx / cnt : 0.0;
          for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < S; i++) {
              int64_t kk = (n * C + c) * S + i;
              double g = Elem<T>::load(dy[kk]);
              double xh = (Elem<T>::load(x[kk]) - m) * inv;
              dx[kk] = Elem<T>::store(a * (g - mg - xh * mgx));
            }
        }
      });
    });
    for (int o = 1; o <= 2; o++) {
      if (!ctx.has_output(o)) continue;
      Tensor& out = ctx.output(o);
      const std::vector<double>& v = o == 1 ? ds : db;
      dispatch(out.dtype(), kFloats, node, [&](auto tag) {
        using P = decltype(tag);
        for (int64_t c = 0; c < C; c++) out.data<P>()[c] = Elem<P>::store(v[c]);
      });
    }
  };
  return k;
}

}  // namespace

void register_nn_grad_kernels(KernelRegistry& r) {
  r.add("onyx", "SoftmaxGrad", make_softmax_grad_kernel<false>());
  r.add("onyx", "LogSoftmaxGrad", make_softmax_grad_kernel<true>());
  OpKernel ln = make_layer_norm_grad_kernel();
  ln.accumulate_outputs = {1, 2};  // dscale, dbias can add into bound gradients
  r.add("onyx", "LayerNormGrad", std::move(ln)).precision = OpTraits::Precision::Fp32;
  r.add("onyx", "DropoutGrad", make_dropout_grad_kernel());
  r.add("onyx", "SoftmaxCrossEntropyLossGrad", make_sce_grad_kernel());
  r.add("onyx", "NLLLossGrad", make_nll_grad_kernel());
  r.add("onyx", "BatchNormGrad", make_batch_norm_grad_kernel());
}

}  // namespace onyx::runtime
