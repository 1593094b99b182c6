// kernels/norm/layer_norm.cc — LayerNormalization (opset 17; also as onyx.LayerNormalization,
// which layer_norm_fusion emits into models importing an older opset) and onyx.RMSNorm
// (rms_norm_fusion), with their fused backward kernels (DESIGN decision 6):
//   LayerNormGrad(dy, x, scale, mean, inv)  -> dx, dscale, dbias
//   RMSNormGrad(dy, x, scale, inv_rms)      -> dx, dscale
// Hand-written because LayerNorm and RMSNorm, forward and backward, sit on the transformer hot
// path: float32 rows are threaded over rows here and processed by the SIMD row kernels of
// simd/nn.h (simd/norm.cc: two-pass mean/variance), which run AVX-512, AVX2 or portable code by
// run-time dispatch; other float types convert through float32 or compute in double.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

// Values of `t` (shape right-aligned-broadcastable to `target`) expanded to target's row-major
// layout, as C. Used for LayerNorm's Scale/B and LayerNormGrad's scale, which are small (one
// row).
template <class C>
std::vector<C> broadcast_values(const Tensor& t, const Shape& target, const ir::Node& node,
                                const char* what) {
  int64_t n = shape_numel(target);
  const Shape& s = t.shape();
  int64_t r = (int64_t)target.size(), sr = (int64_t)s.size();
  ONYX_CHECK(sr <= r, node.describe(), ": ", what, " of shape ", shape_str(s),
             " does not broadcast to ", shape_str(target));
  for (int64_t i = 0; i < sr; i++) {
    int64_t d = s[i], td = target[r - sr + i];
    ONYX_CHECK(d == td || d == 1, node.describe(), ": ", what, " of shape ", shape_str(s),
               " does not broadcast to ", shape_str(target));
  }
  std::vector<C> out(n);
  if (t.numel() == n) {
    for (int64_t i = 0; i < n; i++) out[i] = (C)t.get_as_double(i);
    return out;
  }
  // strides of t in target's index space (0 where broadcast)
  std::vector<int64_t> st(r, 0);
  int64_t acc = 1;
  for (int64_t i = sr - 1; i >= 0; i--) {
    st[r - sr + i] = s[i] == 1 ? 0 : acc;
    acc *= s[i];
  }
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

// ---- LayerNormalization -------------------------------------------------------------------------

// One row: y = (x - mean) * inv * scale + bias; returns mean and inv (1/sqrt(var + eps)). float32
// rows run simd::layer_norm_row; this is the float64 row.
inline void layer_norm_row_f64(const double* x, double* y, int64_t n, const double* scale,
                               const double* bias, double eps, double* mean_out, double* inv_out) {
  double mean = 0, var = 0;
  for (int64_t i = 0; i < n; i++) mean += x[i];
  mean /= (double)n;
  for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
  var /= (double)n;
  double inv = 1.0 / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * scale[i] + (bias ? bias[i] : 0.0);
  *mean_out = mean;
  *inv_out = inv;
}

DType stash_dtype(const ir::Node& node) {
  int64_t st = node.attr_int("stash_type", 1);
  if (st == 1) return DType::Float32;
  if (st == 11) return DType::Float64;
  ONYX_UNSUPPORTED(node.describe(), ": stash_type ", st,
                   " is not supported (float32 or float64 only)");
}

Shape stat_shape(const Shape& s, int64_t axis) {
  Shape r(s.begin(), s.begin() + axis);
  r.resize(s.size(), 1);
  return r;
}

// Calls row(r, xr, yr) for every row of x / y (rows, cols), in parallel, with the row in compute
// type C: storage rows of another type (float16, bfloat16) are converted into per-thread buffers
// before the call and yr stored back after it; rows already of type C are passed in place. X and
// Y may differ in type (a float32 LayerNorm writing bf16 for the mixed-precision pass).
template <class C, class TX, class TY, class F>
void for_each_row_as(const TX* x, TY* y, int64_t rows, int64_t cols, F&& row) {
  parallel_for(rows, rows_grain(cols), [&](int64_t b, int64_t e) {
    std::vector<C> xb(std::is_same_v<TX, C> ? 0 : cols), yb(std::is_same_v<TY, C> ? 0 : cols);
    for (int64_t r = b; r < e; r++) {
      const C* xr;
      if constexpr (std::is_same_v<TX, C>) {
        xr = x + r * cols;
      } else {
        for (int64_t i = 0; i < cols; i++) xb[i] = (C)Elem<TX>::load(x[r * cols + i]);
        xr = xb.data();
      }
      if constexpr (std::is_same_v<TY, C>) {
        row(r, xr, y + r * cols);
      } else {
        row(r, xr, yb.data());
        TY* yr = y + r * cols;
        if constexpr (std::is_same_v<C, float> && std::is_same_v<TY, BFloat16>) {
          ew::from_float(yb.data(), yr, cols);
        } else {
          for (int64_t i = 0; i < cols; i++) yr[i] = Elem<TY>::store(yb[i]);
        }
      }
    }
  });
}

// Runs LayerNorm in compute type C over (rows, cols); converts X/Y rows of storage types TX / TY
// as needed.
// xhat_t (float32 compute only, else null): the normalized rows (x - mean) * inv, stored bf16
// (output 3, which the mixed-precision pass adds for LayerNormGrad's normalized form).
// ycopy_t (float32 compute and Y only, else null): Y's rows rounded to bf16 as they are written
// (output 4, which the mixed-precision pass adds where a post-LN block's output feeds both the
// residual stream in float32 and the next GEMMs in bf16: no separate Cast pass over Y).
template <class C, class TX, class TY, class U>
void layer_norm_typed(const Tensor& xt, Tensor& yt, const std::vector<C>& scale,
                      const std::vector<C>* bias, C eps, int64_t rows, int64_t cols, Tensor* mean_t,
                      Tensor* inv_t, Tensor* xhat_t, Tensor* ycopy_t) {
  U* mo = mean_t ? mean_t->data<U>() : nullptr;
  U* io = inv_t ? inv_t->data<U>() : nullptr;
  BFloat16* xh = xhat_t ? xhat_t->data<BFloat16>() : nullptr;
  BFloat16* yc = ycopy_t ? ycopy_t->data<BFloat16>() : nullptr;
  const C* bp = bias ? bias->data() : nullptr;
  for_each_row_as<C>(xt.data<TX>(), yt.data<TY>(), rows, cols, [&](int64_t r, const C* xr, C* yr) {
    C mean, inv;
    if constexpr (std::is_same_v<C, float>) {
      thread_local std::vector<float> hb;  // this worker's float32 xhat row
      if (xh) hb.resize((size_t)cols);
      simd::layer_norm_row(xr, yr, cols, scale.data(), bp, eps, &mean, &inv,
                           xh ? hb.data() : nullptr);
      if (xh) ew::from_float(hb.data(), xh + r * cols, cols);
      if (yc) ew::from_float(yr, yc + r * cols, cols);
    } else {
      layer_norm_row_f64(xr, yr, cols, scale.data(), bp, eps, &mean, &inv);
    }
    if (mo) mo[r] = (U)mean;
    if (io) io[r] = (U)inv;
  });
}

// Output 3 of onyx.LayerNormalization / onyx.RMSNorm's output 2: the normalized input xhat in
// bf16, which the backward reads instead of x (attribute `normalized` of LayerNormGrad /
// RMSNormGrad). Only float32 x with float32 statistics has it.
void check_normalized_output(const InferContext& ctx, DType x, DType stats) {
  ONYX_CHECK(ctx.node.domain == "onyx", ctx.node.describe(), ": has ", ctx.num_outputs(),
             " outputs; the normalized-input output is onyx-domain only");
  ONYX_CHECK(x == DType::Float32 && stats == DType::Float32, ctx.node.describe(),
             ": the normalized-input output (bf16 xhat) needs float32 x and statistics, got x ",
             dtype_name(x), ", statistics ", dtype_name(stats));
}

// Output 4 of onyx.LayerNormalization: a bf16 copy of a float32 Y (float32 x and statistics).
void check_bf16_copy_output(const InferContext& ctx, DType x, DType y, DType stats) {
  ONYX_CHECK(ctx.node.domain == "onyx", ctx.node.describe(), ": has ", ctx.num_outputs(),
             " outputs; the bf16 copy of Y (output 4) is onyx-domain only");
  ONYX_CHECK(x == DType::Float32 && y == DType::Float32 && stats == DType::Float32,
             ctx.node.describe(),
             ": the bf16 copy of Y (output 4) needs float32 x, Y and statistics, got x ",
             dtype_name(x), ", Y ", dtype_name(y), ", statistics ", dtype_name(stats));
}

OpKernel make_layer_norm_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    ctx.input(1);  // Scale is required
    int64_t axis = normalize_axis(ctx.node.attr_int("axis", -1), x.rank(), ctx.node);
    DType u = stash_dtype(ctx.node);
    const DType y = low_precision_output(ctx.node, x.dtype);
    ctx.set_output(0, y, x.shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, u, stat_shape(x.shape, axis));
    if (ctx.num_outputs() > 2) ctx.set_output(2, u, stat_shape(x.shape, axis));
    if (ctx.num_outputs() > 3 && !ctx.node.outputs[3].empty()) {
      check_normalized_output(ctx, x.dtype, u);
      ctx.set_output(3, DType::BFloat16, x.shape);
    }
    if (ctx.num_outputs() > 4) {
      ONYX_CHECK(ctx.num_outputs() == 5, ctx.node.describe(), ": has ", ctx.num_outputs(),
                 " outputs, at most 5 (Y, mean, inv_std, bf16 xhat, bf16 copy of Y)");
      check_bf16_copy_output(ctx, x.dtype, y, u);
      ctx.set_output(4, DType::BFloat16, x.shape);
    }
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Shape& s = x.shape();
    int64_t axis = normalize_axis(ctx.node.attr_int("axis", -1), x.rank(), ctx.node);
    Shape norm_shape(s.begin() + axis, s.end());
    int64_t rows = 1, cols = shape_numel(norm_shape);
    for (int64_t i = 0; i < axis; i++) rows *= s[i];
    float eps = ctx.node.attr_float("epsilon", 1e-5f);
    DType u = stash_dtype(ctx.node);
    Tensor* mean_t = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    Tensor* inv_t = ctx.has_output(2) ? &ctx.output(2) : nullptr;
    Tensor* xhat_t = ctx.has_output(3) ? &ctx.output(3) : nullptr;
    Tensor* ycopy_t = ctx.has_output(4) ? &ctx.output(4) : nullptr;
    if (rows == 0) return;
    ONYX_CHECK(cols > 0, ctx.node.describe(), ": cannot normalize over an empty shape ",
               shape_str(norm_shape), " of input ", shape_str(s));
    dispatch(x.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      auto run = [&](auto ctag, auto utag) {
        using C = decltype(ctag);
        using U = decltype(utag);
        std::vector<C> scale = broadcast_values<C>(ctx.input(1), norm_shape, ctx.node, "Scale");
        std::vector<C> bias;
        if (ctx.has_input(2)) bias = broadcast_values<C>(ctx.input(2), norm_shape, ctx.node, "B");
        const std::vector<C>* bp = ctx.has_input(2) ? &bias : nullptr;
        const bool f32 = std::is_same_v<T, float> && std::is_same_v<C, float>;
        Tensor* xh = f32 ? xhat_t : nullptr;
        if constexpr (std::is_same_v<T, float>) {
          if (ctx.output(0).dtype() == DType::BFloat16)
            return layer_norm_typed<C, T, BFloat16, U>(x, ctx.output(0), scale, bp, (C)eps, rows,
                                                       cols, mean_t, inv_t, xh, nullptr);
        }
        layer_norm_typed<C, T, T, U>(x, ctx.output(0), scale, bp, (C)eps, rows, cols, mean_t, inv_t,
                                     xh, f32 ? ycopy_t : nullptr);
      };
      if (u == DType::Float32)
        run(float{}, float{});
      else
        run(double{}, double{});
    });
  };
  return k;
}

// ---- onyx.LayerNormGrad -------------------------------------------------------------------------
// LayerNormGrad(dy, x, scale, mean, inv) -> dx, dscale, dbias; attribute axis.
// x (rows, cols) normalized over axis..end; mean, inv (rows) as the forward saved them.
//   xhat = (x - mean) * inv,  g = dy * scale
//   dx = inv * (g - mean(g) - xhat * mean(g * xhat)),  dscale = sum_rows dy * xhat,
//   dbias = sum_rows dy
// dscale/dbias are reduced over all rows in the same pass through per-block partial sums (no
// races; a fixed block split for a given thread count, so results are deterministic).
// Attribute normalized = 1 (mixed precision): input 1 is the forward's xhat itself (its output 3,
// bf16 or float32), mean (input 3) may be absent; float32 dy and statistics only. dx is float32.

// One row: writes dx, accumulates dy*xhat into ds and dy into db. float32 rows (with float32
// statistics) run simd::layer_norm_grad_row; this is the generic row in double (any float storage
// T, statistics of type U).
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
    const bool normalized = ctx.node.attr_int("normalized", 0) != 0;
    ONYX_CHECK((normalized && !ctx.has_input(3)) || ctx.input(3).numel() == rows,
               ctx.node.describe(), ": mean must have ", rows, " elements, got ",
               shape_str(ctx.input(3).shape));
    ONYX_CHECK(ctx.input(4).numel() == rows, ctx.node.describe(), ": inv_std_dev must have ", rows,
               " elements, got ", shape_str(ctx.input(4).shape));
    if (normalized)
      ONYX_CHECK(dy.dtype == DType::Float32 && ctx.input(4).dtype == DType::Float32 &&
                     (x.dtype == DType::Float32 || x.dtype == DType::BFloat16),
                 ctx.node.describe(),
                 ": normalized = 1 takes float32 dy and inv_std_dev and a "
                 "float32 or bfloat16 xhat, got dy ",
                 dtype_name(dy.dtype), ", xhat ", dtype_name(x.dtype));
    Shape norm(x.shape.begin() + axis, x.shape.end());
    ctx.set_output(0, normalized ? dy.dtype : x.dtype, x.shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, scale.dtype, norm);
    if (ctx.num_outputs() > 2) ctx.set_output(2, scale.dtype, norm);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& dyt = ctx.input(0);
    const Tensor& xt = ctx.input(1);
    const bool normalized = node.attr_int("normalized", 0) != 0;
    const Tensor& it = ctx.input(4);
    const Tensor& mt = normalized && !ctx.has_input(3) ? it : ctx.input(3);  // unread if absent
    const Shape& s = xt.shape();
    int64_t axis = normalize_axis(node.attr_int("axis", -1), xt.rank(), node);
    Shape norm(s.begin() + axis, s.end());
    int64_t rows = 1, cols = shape_numel(norm);
    for (int64_t i = 0; i < axis; i++) rows *= s[i];
    Tensor& dxt = ctx.output(0);
    Tensor* dst = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    Tensor* dbt = ctx.has_output(2) ? &ctx.output(2) : nullptr;
    ONYX_CHECK(normalized || dyt.dtype() == xt.dtype(), node.describe(),
               ": dy and x dtypes differ");
    ONYX_CHECK(mt.dtype() == it.dtype(), node.describe(), ": mean and inv_std_dev dtypes differ");
    // dscale (output 1) / dbias (output 2) bound to a gradient buffer that accumulates: the
    // column sum is added to what is there (float32 only, as onyx.AccumulateGrad did).
    const bool add_s = ctx.accumulates(1), add_b = ctx.accumulates(2);
    ONYX_CHECK(
        (!add_s || dst->dtype() == DType::Float32) && (!add_b || dbt->dtype() == DType::Float32),
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
    bool fast = (xt.dtype() == DType::Float32 || normalized) && mt.dtype() == DType::Float32;
    if (fast) {
      std::vector<float> scale = broadcast_values<float>(ctx.input(2), norm, node, "scale");
      const float* dy = dyt.data<float>();
      const float* x = xt.dtype() == DType::Float32 ? xt.data<float>() : nullptr;
      const BFloat16* xh16 = x ? nullptr : xt.data<BFloat16>();  // normalized bf16 xhat
      const float *mean = normalized ? nullptr : mt.data<float>(), *inv = it.data<float>();
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
            const float* xr = x ? x + r * cols : nullptr;
            if (!xr) {  // bf16 xhat widened into this worker's row
              thread_local std::vector<float> wide;
              wide.resize((size_t)cols);
              ew::to_float(xh16 + r * cols, wide.data(), cols);
              xr = wide.data();
            }
            simd::layer_norm_grad_row(dy + r * cols, xr, scale.data(), mean ? mean[r] : 0.0f,
                                      inv[r], cols, dx + r * cols, ds, db, normalized);
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
      std::vector<double> scale = broadcast_values<double>(ctx.input(2), norm, node, "scale");
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

// ---- onyx.RMSNorm -------------------------------------------------------------------------------
// RMSNorm(x, scale) -> y[, inv_rms]; attribute epsilon (default 1e-5). Normalizes over the last
// axis: inv = 1 / sqrt(mean(x^2) + eps), y = (x * inv) * scale (Transformers' LlamaRMSNorm, in this
// order of rounding). inv_rms (x's shape with the last dim 1; float64 for float64 x, else float32)
// is what RMSNormGrad reads. Formed by rms_norm_fusion.cc: ONNX's RMSNormalization is opset 23
// (newer than the models import, DESIGN decision 11) and has no inverse-RMS output to save.

// One row: y = x * inv * scale; returns inv. float32 rows run simd::rms_norm_row, which takes the
// mean of squares as the unfused Mul(x, x) and ReduceMean kernels take it (rounded squares, a row
// sum), so the forward is the unfused graph's bit for bit when ReduceMean sums with the same
// simd::row_sum; this is the float64 row.
inline double rms_norm_row_f64(const double* x, double* y, int64_t n, const double* scale,
                               double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
  double inv = 1.0 / std::sqrt(ss / (double)n + eps);
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv * scale[i];
  return inv;
}

// The statistics' dtype: float64 for float64 x, float32 otherwise.
DType rms_stat_dtype(DType x) { return x == DType::Float64 ? DType::Float64 : DType::Float32; }

// x viewed as (rows, cols) over its last axis; throws for a scalar or an empty last axis.
std::pair<int64_t, int64_t> rms_rows_cols(const ir::Node& node, const Shape& s) {
  ONYX_CHECK(!s.empty(), node.describe(), ": x must have at least one axis");
  int64_t cols = s.back(), rows = 1;
  for (size_t i = 0; i + 1 < s.size(); i++) rows *= s[i];
  ONYX_CHECK(cols > 0 || rows == 0, node.describe(), ": cannot normalize an empty last axis of ",
             shape_str(s));
  return {rows, cols};
}

OpKernel make_rms_norm_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    const TensorMeta& scale = ctx.input(1);
    ONYX_CHECK(is_float(x.dtype), ctx.node.describe(), ": x must be a float tensor, got ",
               dtype_name(x.dtype));
    ONYX_CHECK(!x.shape.empty() && scale.dtype == x.dtype && scale.shape.size() == 1 &&
                   scale.shape[0] == x.shape.back(),
               ctx.node.describe(), ": scale must be a ", dtype_name(x.dtype),
               " vector of x's last dim; x ", shape_str(x.shape), ", scale ",
               shape_str(scale.shape));
    ctx.set_output(0, low_precision_output(ctx.node, x.dtype), x.shape);
    if (ctx.num_outputs() > 1)
      ctx.set_output(1, rms_stat_dtype(x.dtype), stat_shape(x.shape, x.rank() - 1));
    if (ctx.num_outputs() > 2) {
      check_normalized_output(ctx, x.dtype, rms_stat_dtype(x.dtype));
      ctx.set_output(2, DType::BFloat16, x.shape);
    }
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& xt = ctx.input(0);
    auto [rows, cols] = rms_rows_cols(ctx.node, xt.shape());
    float eps = ctx.node.attr_float("epsilon", 1e-5f);
    Tensor* inv_t = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    BFloat16* xh = ctx.has_output(2) ? ctx.output(2).data<BFloat16>() : nullptr;  // bf16 xhat
    if (rows == 0) return;
    dispatch(xt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
      std::vector<C> scale(cols);
      for (int64_t i = 0; i < cols; i++) scale[i] = (C)ctx.input(1).get_as_double(i);
      C* inv = inv_t ? inv_t->data<C>() : nullptr;
      auto row = [&](int64_t r, const C* xr, C* yr) {
        C v;
        if constexpr (std::is_same_v<C, float>) {
          thread_local std::vector<float> hb;  // this worker's float32 xhat row
          if (xh) hb.resize((size_t)cols);
          v = simd::rms_norm_row(xr, yr, cols, scale.data(), eps, xh ? hb.data() : nullptr);
          if (xh) ew::from_float(hb.data(), xh + r * cols, cols);
        } else {
          v = rms_norm_row_f64(xr, yr, cols, scale.data(), (double)eps);
        }
        if (inv) inv[r] = v;
      };
      if constexpr (std::is_same_v<T, float>) {
        if (ctx.output(0).dtype() == DType::BFloat16)  // output_dtype = BFLOAT16
          return for_each_row_as<C>(xt.data<T>(), ctx.output(0).data<BFloat16>(), rows, cols, row);
      }
      for_each_row_as<C>(xt.data<T>(), ctx.output(0).data<T>(), rows, cols, row);
    });
  };
  return k;
}

// ---- onyx.RMSNormGrad ---------------------------------------------------------------------------
// RMSNormGrad(dy, x, scale, inv_rms) -> dx, dscale, with inv_rms as RMSNorm saved it:
//   xhat = x * inv,  g = dy * scale
//   dx = inv * (g - xhat * mean(g * xhat)),  dscale = sum_rows dy * xhat
// dscale is reduced over the rows in the same pass (blocked_row_reduce: per-block partials, a
// fixed split for a given thread count) and may be added into a bound gradient (accumulate).
// Attribute normalized = 1 (mixed precision): x is RMSNorm's xhat output (bf16 or float32)
// itself; float32 dy and inv_rms only, dx float32.

// One row: writes dx, accumulates dy*xhat into ds. float32 rows run simd::rms_norm_grad_row; this
// is the generic row in double.
template <class T>
void rms_norm_grad_row_generic(const T* dy, const T* x, const double* scale, double inv, int64_t n,
                               T* dx, double* ds) {
  double s_gx = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = Elem<T>::load(dy[i]), xh = Elem<T>::load(x[i]) * inv;
    s_gx += d * scale[i] * xh;
    ds[i] += d * xh;
  }
  double mgx = s_gx / (double)n;
  for (int64_t i = 0; i < n; i++) {
    double xh = Elem<T>::load(x[i]) * inv;
    dx[i] = Elem<T>::store((Elem<T>::load(dy[i]) * scale[i] - xh * mgx) * inv);
  }
}

// Element i of a float tensor of any float dtype set to v.
void store_as(Tensor& t, int64_t i, double v, const ir::Node& node) {
  dispatch(t.dtype(), kFloats, node, [&](auto tag) {
    using P = decltype(tag);
    t.data<P>()[i] = Elem<P>::store(v);
  });
}

OpKernel make_rms_norm_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    const TensorMeta& x = ctx.input(1);
    const TensorMeta& scale = ctx.input(2);
    check_same_shape(ctx.node, dy, x, "dy", "x");
    ONYX_CHECK(!x.shape.empty() && scale.shape.size() == 1 && scale.shape[0] == x.shape.back(),
               ctx.node.describe(), ": scale ", shape_str(scale.shape),
               " must be a vector of x's last dim, x ", shape_str(x.shape));
    int64_t rows = x.numel() / std::max<int64_t>(1, x.shape.back());
    ONYX_CHECK(ctx.input(3).numel() == rows, ctx.node.describe(), ": inv_rms must have ", rows,
               " elements, got ", shape_str(ctx.input(3).shape));
    const bool normalized = ctx.node.attr_int("normalized", 0) != 0;
    if (normalized)
      ONYX_CHECK(dy.dtype == DType::Float32 && ctx.input(3).dtype == DType::Float32 &&
                     scale.dtype == DType::Float32 &&
                     (x.dtype == DType::Float32 || x.dtype == DType::BFloat16),
                 ctx.node.describe(),
                 ": normalized = 1 takes float32 dy, scale and inv_rms and "
                 "a float32 or bfloat16 xhat, got dy ",
                 dtype_name(dy.dtype), ", xhat ", dtype_name(x.dtype));
    ctx.set_output(0, normalized ? dy.dtype : x.dtype, x.shape);
    if (ctx.num_outputs() > 1) ctx.set_output(1, scale.dtype, scale.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const ir::Node& node = ctx.node;
    const Tensor& dyt = ctx.input(0);
    const Tensor& xt = ctx.input(1);
    const Tensor& it = ctx.input(3);
    auto [rows, cols] = rms_rows_cols(node, xt.shape());
    Tensor& dxt = ctx.output(0);
    Tensor* dst = ctx.has_output(1) ? &ctx.output(1) : nullptr;
    const bool normalized = node.attr_int("normalized", 0) != 0;
    ONYX_CHECK(normalized || dyt.dtype() == xt.dtype(), node.describe(),
               ": dy and x dtypes differ");
    // dscale bound to a gradient buffer that accumulates: the column sums are added to it.
    const bool add_s = ctx.accumulates(1);
    ONYX_CHECK(!add_s || dst->dtype() == DType::Float32, node.describe(),
               ": accumulation supports float32 gradients");
    if (cols == 0) return;
    if (rows == 0) {
      if (dst && !add_s)
        for (int64_t c = 0; c < cols; c++) store_as(*dst, c, 0.0, node);
      return;
    }
    if ((xt.dtype() == DType::Float32 || normalized) && it.dtype() == DType::Float32 &&
        (!dst || dst->dtype() == DType::Float32)) {
      std::vector<float> scale(cols);
      for (int64_t c = 0; c < cols; c++) scale[c] = (float)ctx.input(2).get_as_double(c);
      const float *dy = dyt.data<float>(), *inv = it.data<float>();
      const float* x = xt.dtype() == DType::Float32 ? xt.data<float>() : nullptr;
      const BFloat16* xh16 = x ? nullptr : xt.data<BFloat16>();  // normalized bf16 xhat
      float* dx = dxt.data<float>();
      float* dsp = dst ? dst->data<float>() : nullptr;
      blocked_row_reduce<float>(
          rows, cols,
          [&](int64_t r, float* ds, float*) {
            const float* xr = x ? x + r * cols : nullptr;
            if (!xr) {  // bf16 xhat widened into this worker's row
              thread_local std::vector<float> wide;
              wide.resize((size_t)cols);
              ew::to_float(xh16 + r * cols, wide.data(), cols);
              xr = wide.data();
            }
            simd::rms_norm_grad_row(dy + r * cols, xr, scale.data(), inv[r], cols, dx + r * cols,
                                    ds, normalized);
          },
          [&](int64_t c, float sv, float) {
            if (dsp) dsp[c] = add_s ? dsp[c] + sv : sv;
          });
      return;
    }
    dispatch(xt.dtype(), kFloats, node, [&](auto tag) {
      using T = decltype(tag);
      std::vector<double> scale(cols);
      for (int64_t c = 0; c < cols; c++) scale[c] = ctx.input(2).get_as_double(c);
      std::vector<double> inv = it.to_double_vector();
      const T* dy = dyt.data<T>();
      const T* x = xt.data<T>();
      T* dx = dxt.data<T>();
      std::vector<double> ds(cols);
      blocked_row_reduce<double>(
          rows, cols,
          [&](int64_t r, double* pds, double*) {
            rms_norm_grad_row_generic<T>(dy + r * cols, x + r * cols, scale.data(), inv[r], cols,
                                         dx + r * cols, pds);
          },
          [&](int64_t c, double sv, double) { ds[c] = sv; });
      // written after the threaded part (the dtype switch may throw)
      if (dst)
        for (int64_t c = 0; c < cols; c++)
          store_as(*dst, c, add_s ? dst->get_as_double(c) + ds[c] : ds[c], node);
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(layer_norm, Cpu) {
  for (const char* domain : {"", "onyx"})
    r.add(domain, "LayerNormalization", make_layer_norm_kernel()).precision =
        OpTraits::Precision::Fp32;
  OpKernel ln = make_layer_norm_grad_kernel();
  ln.accumulate_outputs = {1, 2};  // dscale, dbias can add into bound gradients
  r.add("onyx", "LayerNormGrad", std::move(ln)).precision = OpTraits::Precision::Fp32;
  r.add("onyx", "RMSNorm", make_rms_norm_kernel()).precision = OpTraits::Precision::Fp32;
  OpKernel rms = make_rms_norm_grad_kernel();
  rms.accumulate_outputs = {1};  // dscale can add into a bound gradient
  r.add("onyx", "RMSNormGrad", std::move(rms)).precision = OpTraits::Precision::Fp32;
}

}  // namespace onyx::kernels
