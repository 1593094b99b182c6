// kernels/pool/pool.cc — MaxPool (with optional Indices, storage_order), AveragePool
// (count_include_pad), GlobalAveragePool and GlobalMaxPool (ONNX domain ""), 1-D, 2-D and 3-D
// NC[D]H[W], with strides, dilations, explicit or automatic (SAME_UPPER / SAME_LOWER / VALID)
// padding and ceil_mode; and their backward kernels ("onyx" domain, emitted by
// autodiff/gradients/nn_spatial.cc):
//   MaxPoolGrad(dY, X)    the forward's attributes   dX: dY added at each window's argmax
//   AveragePoolGrad(dY)   the forward's attributes + input_shape   dX: dY / divisor over the window
// The grad kernels take the forward node's attributes verbatim and recompute the same geometry
// (pool_geom), so auto_pad and ceil_mode are resolved in one place. MaxPoolGrad recomputes the
// argmax from X (first maximum in window order, NaN wins, exactly as the forward picks it) instead
// of keeping an int64 Indices tensor alive until the backward.
//
// Hand-written: the window of each output index along each dim is precomputed once (valid input
// positions plus the count of positions inside the padded extent, for count_include_pad), so one
// loop nest serves every attribute combination; (N, C) planes are threaded, and a plane's dX is
// owned by one thread (no races, deterministic). Float types compare/accumulate in their own type
// (float32) or double (others); MaxPool also runs on integer types.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

// Spatial dims left-padded to three (size 1, kernel 1, stride 1, no pad).
struct PoolGeom {
  int nsp = 0;
  int64_t N = 0, C = 0;
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, out[3] = {1, 1, 1}, st[3] = {1, 1, 1},
          dl[3] = {1, 1, 1}, pb[3] = {0, 0, 0}, pe[3] = {0, 0, 0};
  int64_t in_sz = 1, out_sz = 1;
  // Per dim and output index: the in-image input positions of its window (in window order) and
  // the number of window positions inside the padded extent [-pb, in + pe).
  std::vector<int64_t> win_start[3], win_pos[3], padded_count[3];
  Shape out_shape(const Shape& x) const {
    Shape s{x[0], x[1]};
    for (int i = 3 - nsp; i < 3; i++) s.push_back(out[i]);
    return s;
  }
};

PoolGeom pool_geom(const ir::Node& node, int64_t opset, const Shape& x, bool global) {
  ONYX_CHECK(x.size() >= 3, node.describe(), ": input must be (N, C, D1, ...), got ", shape_str(x));
  ONYX_CHECK(x.size() <= 5, node.describe(),
             ": pooling over more than 3 spatial dims is not "
             "supported, got input ",
             shape_str(x));
  PoolGeom g;
  g.nsp = (int)x.size() - 2;
  int nsp = g.nsp;
  g.N = x[0];
  g.C = x[1];
  std::vector<int64_t> in(x.begin() + 2, x.end());
  std::vector<int64_t> ks, st, dl, pads;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;
  if (global) {
    ks = in;
    st.assign(nsp, 1);
    dl.assign(nsp, 1);
    pads.assign(2 * nsp, 0);
  } else {
    ks = node.attr_ints_required("kernel_shape");
    st = node.attr_ints("strides", std::vector<int64_t>(nsp, 1));
    dl = node.attr_ints("dilations", std::vector<int64_t>(nsp, 1));
    pads = node.attr_ints("pads", std::vector<int64_t>(2 * nsp, 0));
    auto_pad = node.attr_string("auto_pad", "NOTSET");
    ceil_mode = node.attr_int("ceil_mode", 0) != 0;
    (void)opset;
  }
  ONYX_CHECK((int)ks.size() == nsp && (int)st.size() == nsp && (int)dl.size() == nsp &&
                 (int)pads.size() == 2 * nsp,
             node.describe(), ": kernel_shape ", shape_str(ks), ", strides ", shape_str(st),
             ", dilations ", shape_str(dl), ", pads ", shape_str(pads), " do not fit ", nsp,
             " spatial dims of input ", shape_str(x));
  int off = 3 - nsp;
  for (int s = 0; s < nsp; s++) {
    int i = s + off;
    ONYX_CHECK(ks[s] >= 1 && st[s] >= 1 && dl[s] >= 1 && pads[s] >= 0 && pads[s + nsp] >= 0,
               node.describe(), ": kernel_shape ", shape_str(ks), ", strides ", shape_str(st),
               ", dilations ", shape_str(dl), " must be >= 1 and pads ", shape_str(pads), " >= 0");
    g.in[i] = in[s];
    g.k[i] = ks[s];
    g.st[i] = st[s];
    g.dl[i] = dl[s];
    int64_t ek = (ks[s] - 1) * dl[s] + 1;
    if (auto_pad == "NOTSET" || auto_pad.empty()) {
      g.pb[i] = pads[s];
      g.pe[i] = pads[s + nsp];
      int64_t span = in[s] + g.pb[i] + g.pe[i] - ek;
      ONYX_CHECK(span >= 0, node.describe(), ": kernel ", shape_str(ks), " (dilations ",
                 shape_str(dl), ") is larger than the padded input ", shape_str(x));
      if (ceil_mode) {
        g.out[i] = (span + st[s] - 1) / st[s] + 1;
        // the last window must start inside the input or its begin padding
        if ((g.out[i] - 1) * st[s] >= in[s] + g.pb[i]) g.out[i]--;
      } else {
        g.out[i] = span / st[s] + 1;
      }
    } else if (auto_pad == "VALID") {
      ONYX_CHECK(in[s] >= ek, node.describe(), ": kernel ", shape_str(ks),
                 " is larger than the input ", shape_str(x));
      g.out[i] = (in[s] - ek) / st[s] + 1;
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      g.out[i] = (in[s] + st[s] - 1) / st[s];
      int64_t total = std::max<int64_t>(0, (g.out[i] - 1) * st[s] + ek - in[s]);
      g.pb[i] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pe[i] = total - g.pb[i];
    } else {
      ONYX_UNSUPPORTED(node.describe(), ": auto_pad '", auto_pad, "'");
    }
  }
  for (int i = 0; i < 3; i++) {
    g.in_sz *= g.in[i];
    g.out_sz *= g.out[i];
    g.win_start[i].assign(g.out[i] + 1, 0);
    g.padded_count[i].assign(g.out[i], 0);
    for (int64_t o = 0; o < g.out[i]; o++) {
      g.win_start[i][o] = (int64_t)g.win_pos[i].size();
      for (int64_t kk = 0; kk < g.k[i]; kk++) {
        int64_t p = o * g.st[i] - g.pb[i] + kk * g.dl[i];
        if (p >= -g.pb[i] && p < g.in[i] + g.pe[i]) g.padded_count[i][o]++;
        if (p >= 0 && p < g.in[i]) g.win_pos[i].push_back(p);
      }
    }
    g.win_start[i][g.out[i]] = (int64_t)g.win_pos[i].size();
  }
  return g;
}

// Calls f(o, list of plane offsets of output o's in-image window) for every output of a plane,
// offsets in window order (dim 0 slowest).
template <class F>
void for_each_window(const PoolGeom& g, F&& f) {
  std::vector<int64_t> offs;
  for (int64_t o0 = 0; o0 < g.out[0]; o0++)
    for (int64_t o1 = 0; o1 < g.out[1]; o1++)
      for (int64_t o2 = 0; o2 < g.out[2]; o2++) {
        offs.clear();
        for (int64_t a = g.win_start[0][o0]; a < g.win_start[0][o0 + 1]; a++)
          for (int64_t b = g.win_start[1][o1]; b < g.win_start[1][o1 + 1]; b++) {
            int64_t base = (g.win_pos[0][a] * g.in[1] + g.win_pos[1][b]) * g.in[2];
            for (int64_t c = g.win_start[2][o2]; c < g.win_start[2][o2 + 1]; c++)
              offs.push_back(base + g.win_pos[2][c]);
          }
        int64_t o = (o0 * g.out[1] + o1) * g.out[2] + o2;
        f(o, offs, o0, o1, o2);
      }
}

int64_t plane_grain(const PoolGeom& g) {
  return std::max<int64_t>(
      1, 16384 / std::max<int64_t>(1, g.out_sz * std::max<int64_t>(1, g.k[0] * g.k[1] * g.k[2])));
}

// Index of the maximum among x[offs] (first maximum; NaN wins), or -1 for an empty window.
template <class T>
int64_t arg_max(const T* x, const std::vector<int64_t>& offs) {
  int64_t best = -1;
  if constexpr (Elem<T>::is_float) {
    double m = 0;
    for (int64_t p : offs) {
      double v = Elem<T>::load(x[p]);
      if (best < 0 || v > m || (std::isnan(v) && !std::isnan(m))) {
        best = p;
        m = v;
      }
    }
  } else {
    T m{};
    for (int64_t p : offs)
      if (best < 0 || x[p] > m) {
        best = p;
        m = x[p];
      }
  }
  return best;
}

// Flat Indices value of in-plane offset p (row-major), for storage_order 0 / 1 (column-major
// over the spatial dims).
int64_t index_value(const PoolGeom& g, int64_t plane, int64_t p, bool col_major) {
  if (!col_major) return plane * g.in_sz + p;
  int64_t i2 = p % g.in[2], i1 = (p / g.in[2]) % g.in[1], i0 = p / (g.in[2] * g.in[1]);
  // the real spatial dims are the last nsp of (i0, i1, i2); column-major: first dim fastest
  int64_t idx;
  if (g.nsp == 1)
    idx = i2;
  else if (g.nsp == 2)
    idx = i1 + g.in[1] * i2;
  else
    idx = i0 + g.in[0] * (i1 + g.in[1] * i2);
  return plane * g.in_sz + idx;
}

// ---- MaxPool / GlobalMaxPool --------------------------------------------------------------------

template <bool GLOBAL>
OpKernel make_max_pool_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    PoolGeom g = pool_geom(ctx.node, ctx.opset, x.shape, GLOBAL);
    ctx.set_output(0, x.dtype, g.out_shape(x.shape));
    if (!GLOBAL && ctx.num_outputs() > 1) ctx.set_output(1, DType::Int64, g.out_shape(x.shape));
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& xt = ctx.input(0);
    PoolGeom g = pool_geom(ctx.node, ctx.opset, xt.shape(), GLOBAL);
    Tensor& yt = ctx.output(0);
    int64_t* ind = !GLOBAL && ctx.has_output(1) ? ctx.output(1).data<int64_t>() : nullptr;
    bool col_major = ctx.node.attr_int("storage_order", 0) != 0;
    if (yt.numel() == 0) return;
    dispatch(xt.dtype(), kAllNumeric, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      T* y = yt.data<T>();
      parallel_for(g.N * g.C, plane_grain(g), [&](int64_t p0, int64_t p1) {
        for (int64_t pl = p0; pl < p1; pl++) {
          const T* xp = x + pl * g.in_sz;
          T* yp = y + pl * g.out_sz;
          for_each_window(
              g, [&](int64_t o, const std::vector<int64_t>& offs, int64_t, int64_t, int64_t) {
                int64_t a = arg_max(xp, offs);
                if (a < 0) {  // a window entirely in the padding (cannot happen with valid pads)
                  if constexpr (Elem<T>::is_float)
                    yp[o] = Elem<T>::store(-INFINITY);
                  else
                    yp[o] = std::numeric_limits<T>::lowest();
                  if (ind) ind[pl * g.out_sz + o] = -1;
                  return;
                }
                yp[o] = xp[a];
                if (ind) ind[pl * g.out_sz + o] = index_value(g, pl, a, col_major);
              });
        }
      });
    });
  };
  return k;
}

// ---- AveragePool / GlobalAveragePool ------------------------------------------------------------

template <bool GLOBAL>
OpKernel make_avg_pool_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    PoolGeom g = pool_geom(ctx.node, ctx.opset, x.shape, GLOBAL);
    ctx.set_output(0, x.dtype, g.out_shape(x.shape));
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& xt = ctx.input(0);
    PoolGeom g = pool_geom(ctx.node, ctx.opset, xt.shape(), GLOBAL);
    Tensor& yt = ctx.output(0);
    bool include_pad = !GLOBAL && ctx.node.attr_int("count_include_pad", 0) != 0;
    if (yt.numel() == 0) return;
    dispatch(xt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      T* y = yt.data<T>();
      parallel_for(g.N * g.C, plane_grain(g), [&](int64_t p0, int64_t p1) {
        for (int64_t pl = p0; pl < p1; pl++) {
          const T* xp = x + pl * g.in_sz;
          T* yp = y + pl * g.out_sz;
          if (GLOBAL) {
            double s = 0;
            for (int64_t i = 0; i < g.in_sz; i++) s += Elem<T>::load(xp[i]);
            yp[0] = Elem<T>::store(g.in_sz > 0 ? s / (double)g.in_sz : NAN);
            continue;
          }
          for_each_window(g, [&](int64_t o, const std::vector<int64_t>& offs, int64_t o0,
                                 int64_t o1, int64_t o2) {
            double s = 0;
            for (int64_t p : offs) s += Elem<T>::load(xp[p]);
            int64_t div =
                include_pad ? g.padded_count[0][o0] * g.padded_count[1][o1] * g.padded_count[2][o2]
                            : (int64_t)offs.size();
            yp[o] = Elem<T>::store(div > 0 ? s / (double)div : NAN);
          });
        }
      });
    });
  };
  return k;
}

// ---- MaxPoolGrad / AveragePoolGrad --------------------------------------------------------------
// The grad node carries the forward's attributes; "global" = 1 for GlobalMaxPool /
// GlobalAveragePool.

void check_dy(const ir::Node& node, const PoolGeom& g, const Shape& x, const Shape& dy) {
  ONYX_CHECK(dy == g.out_shape(x), node.describe(), ": dY ", shape_str(dy),
             " is not the pooled shape ", shape_str(g.out_shape(x)), " of input ", shape_str(x));
}

OpKernel make_max_pool_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    const TensorMeta& x = ctx.input(1);
    bool global = ctx.node.attr_int("global", 0) != 0;
    PoolGeom g = pool_geom(ctx.node, ctx.opset, x.shape, global);
    check_dy(ctx.node, g, x.shape, dy.shape);
    ONYX_CHECK(dy.dtype == x.dtype, ctx.node.describe(), ": dY is ", dtype_name(dy.dtype),
               " but X is ", dtype_name(x.dtype));
    ctx.set_output(0, x.dtype, x.shape);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& dyt = ctx.input(0);
    const Tensor& xt = ctx.input(1);
    bool global = ctx.node.attr_int("global", 0) != 0;
    PoolGeom g = pool_geom(ctx.node, ctx.opset, xt.shape(), global);
    Tensor& dxt = ctx.output(0);
    if (dxt.numel() == 0) return;
    dispatch(xt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T* x = xt.data<T>();
      const T* dy = dyt.data<T>();
      T* dx = dxt.data<T>();
      parallel_for(g.N * g.C, plane_grain(g), [&](int64_t p0, int64_t p1) {
        std::vector<double> acc(g.in_sz);
        for (int64_t pl = p0; pl < p1; pl++) {
          const T* xp = x + pl * g.in_sz;
          const T* dyp = dy + pl * g.out_sz;
          T* dxp = dx + pl * g.in_sz;
          if constexpr (std::is_same_v<T, float>) {
            std::fill(dxp, dxp + g.in_sz, 0.0f);
            for_each_window(
                g, [&](int64_t o, const std::vector<int64_t>& offs, int64_t, int64_t, int64_t) {
                  int64_t a = arg_max(xp, offs);
                  if (a >= 0) dxp[a] += dyp[o];
                });
          } else {
            std::fill(acc.begin(), acc.end(), 0.0);
            for_each_window(
                g, [&](int64_t o, const std::vector<int64_t>& offs, int64_t, int64_t, int64_t) {
                  int64_t a = arg_max(xp, offs);
                  if (a >= 0) acc[a] += Elem<T>::load(dyp[o]);
                });
            for (int64_t i = 0; i < g.in_sz; i++) dxp[i] = Elem<T>::store(acc[i]);
          }
        }
      });
    });
  };
  return k;
}

OpKernel make_avg_pool_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    Shape x = ctx.node.attr_ints_required("input_shape");
    bool global = ctx.node.attr_int("global", 0) != 0;
    PoolGeom g = pool_geom(ctx.node, ctx.opset, x, global);
    check_dy(ctx.node, g, x, dy.shape);
    ctx.set_output(0, dy.dtype, x);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& dyt = ctx.input(0);
    Tensor& dxt = ctx.output(0);
    bool global = ctx.node.attr_int("global", 0) != 0;
    PoolGeom g = pool_geom(ctx.node, ctx.opset, dxt.shape(), global);
    bool include_pad = !global && ctx.node.attr_int("count_include_pad", 0) != 0;
    if (dxt.numel() == 0) return;
    dispatch(dyt.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      const T* dy = dyt.data<T>();
      T* dx = dxt.data<T>();
      parallel_for(g.N * g.C, plane_grain(g), [&](int64_t p0, int64_t p1) {
        std::vector<double> acc(g.in_sz);
        for (int64_t pl = p0; pl < p1; pl++) {
          const T* dyp = dy + pl * g.out_sz;
          T* dxp = dx + pl * g.in_sz;
          if (global) {
            T v = Elem<T>::store(Elem<T>::load(dyp[0]) / (double)std::max<int64_t>(1, g.in_sz));
            std::fill(dxp, dxp + g.in_sz, v);
            continue;
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          for_each_window(g, [&](int64_t o, const std::vector<int64_t>& offs, int64_t o0,
                                 int64_t o1, int64_t o2) {
            int64_t div =
                include_pad ? g.padded_count[0][o0] * g.padded_count[1][o1] * g.padded_count[2][o2]
                            : (int64_t)offs.size();
            if (div == 0) return;
            double v = Elem<T>::load(dyp[o]) / (double)div;
            for (int64_t p : offs) acc[p] += v;
          });
          for (int64_t i = 0; i < g.in_sz; i++) dxp[i] = Elem<T>::store(acc[i]);
        }
      });
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(pool, Cpu) {
  r.add("", "MaxPool", make_max_pool_kernel<false>());
  r.add("", "GlobalMaxPool", make_max_pool_kernel<true>());
  r.add("", "AveragePool", make_avg_pool_kernel<false>());
  r.add("", "GlobalAveragePool", make_avg_pool_kernel<true>());
  r.add("onyx", "MaxPoolGrad", make_max_pool_grad_kernel());
  r.add("onyx", "AveragePoolGrad", make_avg_pool_grad_kernel());
}

}  // namespace onyx::kernels
