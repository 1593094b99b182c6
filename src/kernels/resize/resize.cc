// kernels/resize/resize.cc — Resize (ONNX domain "", opsets 11–19: modes nearest / linear / cubic,
// every coordinate_transformation_mode, nearest_mode, cubic_coeff_a, exclude_outside,
// extrapolation_value, antialias, axes, keep_aspect_ratio_policy; inputs X, roi, scales, sizes)
// and its backward, onyx.ResizeGrad(dY, roi, scales, sizes) with the forward's attributes plus
// input_shape (emitted by autodiff/gradients/nn_spatial.cc); and onyx.PadGrad(dY), the backward
// of Pad in every mode, which is the same kind of per-axis map.
//
// Resize is separable: along each resized axis every output position is a fixed weighted sum of
// a few input positions (its taps), computed once per axis exactly as the ONNX reference
// (onnx/reference/ops/op_resize.py) computes them — source coordinate per mode, the n nearest
// indices with ties to the smaller, edge clamping, exclude_outside renormalization,
// tf_crop_and_resize positions outside the input set to extrapolation_value. The forward applies
// the axes one after another (intermediates in double, as the reference computes); the gradient
// applies the transposed maps in reverse order (each input position gathers the output
// positions whose taps hit it: no scatter, no races, deterministic). Extrapolated positions are
// constants and pass no gradient.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/nn_util.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

using namespace nnutil;

struct AxisMap {
  int axis = 0;
  int64_t in = 0, out = 0;
  int64_t taps = 0;
  std::vector<int64_t> idx;     // out * taps, clamped into [0, in)
  std::vector<double> w;        // out * taps
  std::vector<uint8_t> extrap;  // out: 1 = extrapolation_value (tf_crop_and_resize)
};

struct ResizePlan {
  Shape in, out;
  std::vector<AxisMap> maps;  // the non-identity axes, in application order
  double extrapolation = 0;
};

std::vector<double> coeffs_for(const std::string& mode, const std::string& nearest_mode,
                               bool antialias, double A, double ratio, double scale,
                               const ir::Node& node) {
  if (mode == "nearest") {
    if (ratio == std::floor(ratio)) return {0, 1};
    if (nearest_mode == "round_prefer_floor")
      return {ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0};
    if (nearest_mode == "round_prefer_ceil")
      return {ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0};
    if (nearest_mode == "floor") return {1, 0};
    if (nearest_mode == "ceil") return {0, 1};
    ONYX_UNSUPPORTED(node.describe(), ": nearest_mode '", nearest_mode, "'");
  }
  if (mode == "linear") {
    if (!antialias) return {1 - ratio, ratio};
    double s = std::min(scale, 1.0);
    int64_t start = (int64_t)std::floor(-1 / s) + 1;
    int64_t foot = 2 - 2 * start;
    std::vector<double> c(foot);
    double sum = 0;
    for (int64_t i = 0; i < foot; i++) {
      double a = ((double)(start + i) - ratio) * s;
      c[i] = std::clamp(1 - std::fabs(a), 0.0, 1.0);
      sum += c[i];
    }
    for (double& v : c) v /= sum;
    return c;
  }
  if (mode == "cubic") {
    if (!antialias) {
      double r1 = ratio + 1, q = 1 - ratio, q1 = q + 1;
      return {((A * r1 - 5 * A) * r1 + 8 * A) * r1 - 4 * A,
              ((A + 2) * ratio - (A + 3)) * ratio * ratio + 1, ((A + 2) * q - (A + 3)) * q * q + 1,
              ((A * q1 - 5 * A) * q1 + 8 * A) * q1 - 4 * A};
    }
    double s = std::min(scale, 1.0);
    auto coeff = [&](double x) {
      x = std::fabs(x);
      double x2 = x * x, x3 = x * x2;
      if (x <= 1) return (A + 2) * x3 - (A + 3) * x2 + 1;
      if (x < 2) return A * x3 - 5 * A * x2 + 8 * A * x - 4 * A;
      return 0.0;
    };
    int64_t i_start = (int64_t)std::floor(-2 / s) + 1, i_end = 2 - i_start;
    std::vector<double> c;
    double sum = 0;
    for (int64_t i = i_start; i < i_end; i++) {
      c.push_back(coeff(s * ((double)i - ratio)));
      sum += c.back();
    }
    for (double& v : c) v /= sum;
    return c;
  }
  ONYX_UNSUPPORTED(node.describe(), ": Resize mode '", mode, "'");
}

// roi / scales / sizes: nullptr when absent or empty.
ResizePlan resize_plan(const ir::Node& node, int64_t opset, const Shape& x, const Tensor* roi,
                       const Tensor* scales, const Tensor* sizes) {
  ONYX_CHECK(opset >= 11, node.describe(), ": Resize opset ", opset, " is not supported");
  int64_t r = (int64_t)x.size();
  std::string mode = node.attr_string("mode", "nearest");
  std::string ctm = node.attr_string("coordinate_transformation_mode", "half_pixel");
  std::string nearest_mode = node.attr_string("nearest_mode", "round_prefer_floor");
  double A = node.attr_float("cubic_coeff_a", -0.75f);
  bool exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  bool antialias = node.attr_int("antialias", 0) != 0;
  std::string policy = node.attr_string("keep_aspect_ratio_policy", "stretch");
  ONYX_CHECK(!(antialias && mode == "nearest"), node.describe(),
             ": antialias is not defined for mode 'nearest'");
  bool known_ctm = false;
  for (const char* m : {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                        "asymmetric", "tf_crop_and_resize"})
    known_ctm = known_ctm || ctm == m;
  if (!known_ctm) ONYX_UNSUPPORTED(node.describe(), ": coordinate_transformation_mode '", ctm, "'");
  std::vector<int64_t> axes;
  if (node.has_attr("axes")) {
    for (int64_t a : node.attr_ints("axes")) axes.push_back(normalize_axis(a, r, node));
  } else {
    for (int64_t i = 0; i < r; i++) axes.push_back(i);
  }
  int64_t na = (int64_t)axes.size();
  ResizePlan p;
  p.in = x;
  p.out = x;
  p.extrapolation = node.attr_float("extrapolation_value", 0.f);
  std::vector<double> scale(r, 1.0);
  std::vector<double> roi_s(r, 0.0), roi_e(r, 1.0);
  if (roi && roi->numel() > 0) {
    auto v = roi->to_double_vector();
    ONYX_CHECK((int64_t)v.size() == 2 * na, node.describe(), ": roi has ", v.size(),
               " values, expected ", 2 * na);
    for (int64_t i = 0; i < na; i++) {
      roi_s[axes[i]] = v[i];
      roi_e[axes[i]] = v[na + i];
    }
  }
  if (scales) {
    ONYX_CHECK(!sizes, node.describe(), ": only one of scales and sizes may be given");
    auto v = scales->to_double_vector();
    ONYX_CHECK((int64_t)v.size() == na, node.describe(), ": scales has ", v.size(),
               " values, expected ", na);
    for (int64_t i = 0; i < na; i++) {
      ONYX_CHECK(v[i] > 0, node.describe(), ": scales must be positive, got ", v[i]);
      scale[axes[i]] = v[i];
      p.out[axes[i]] = (int64_t)std::floor(v[i] * (double)x[axes[i]]);
    }
  } else {
    ONYX_CHECK(sizes, node.describe(), ": one of scales and sizes must be given");
    auto v = sizes->to_int64_vector();
    ONYX_CHECK((int64_t)v.size() == na, node.describe(), ": sizes has ", v.size(),
               " values, expected ", na);
    for (int64_t i = 0; i < na; i++) {
      ONYX_CHECK(v[i] >= 0, node.describe(), ": sizes must be >= 0, got ", v[i]);
      ONYX_CHECK(x[axes[i]] > 0, node.describe(), ": cannot resize empty axis ", axes[i]);
      scale[axes[i]] = (double)v[i] / (double)x[axes[i]];
      p.out[axes[i]] = v[i];
    }
    if (policy != "stretch") {
      ONYX_CHECK(policy == "not_larger" || policy == "not_smaller", node.describe(),
                 ": keep_aspect_ratio_policy '", policy, "'");
      double s = scale[axes[0]];
      for (int64_t a : axes)
        s = policy == "not_larger" ? std::min(s, scale[a]) : std::max(s, scale[a]);
      for (int64_t a : axes) {
        scale[a] = s;
        p.out[a] = (int64_t)(s * (double)x[a] + 0.5);
      }
    }
  }
  for (int64_t a : axes) {
    int64_t in = x[a], out = p.out[a];
    double sc = scale[a];
    bool identity = std::fabs(sc - 1.0) <= 1e-9 * std::max(1.0, std::fabs(sc)) && out == in &&
                    (ctm != "tf_crop_and_resize" ||
                     (std::fabs(roi_s[a]) <= 1e-9 && std::fabs(roi_e[a] - 1.0) <= 1e-9));
    if (identity || out == 0) continue;
    ONYX_CHECK(in > 0, node.describe(), ": cannot resize empty axis ", a, " of ", shape_str(x));
    AxisMap m;
    m.axis = (int)a;
    m.in = in;
    m.out = out;
    m.extrap.assign(out, 0);
    double width = sc * (double)in;  // the reference's float output width
    for (int64_t y = 0; y < out; y++) {
      double yd = (double)y, xo;
      if (ctm == "align_corners") {
        xo = width == 1 ? 0.0 : yd * (double)(in - 1) / (width - 1);
      } else if (ctm == "asymmetric") {
        xo = yd / sc;
      } else if (ctm == "tf_crop_and_resize") {
        xo = width == 1 ? (roi_e[a] - roi_s[a]) * (double)(in - 1) / 2
                        : yd * (roi_e[a] - roi_s[a]) * (double)(in - 1) / (width - 1);
        xo += roi_s[a] * (double)(in - 1);
        m.extrap[y] = xo < 0 || xo > (double)(in - 1);
      } else if (ctm == "pytorch_half_pixel") {
        xo = width == 1 ? -0.5 : (yd + 0.5) / sc - 0.5;
      } else if (ctm == "half_pixel") {
        xo = (yd + 0.5) / sc - 0.5;
      } else {  // half_pixel_symmetric
        double adjustment = (double)out / width;
        double offset = (double)in / 2 * (1 - adjustment);
        xo = offset + (yd + 0.5) / sc - 0.5;
      }
      double xi = std::floor(xo);
      double ratio = xo == xi ? 1.0 : xo - xi;
      std::vector<double> c = coeffs_for(mode, nearest_mode, antialias, A, ratio, sc, node);
      int64_t n = (int64_t)c.size();
      if (y == 0) {
        m.taps = n;
        m.idx.resize(out * n);
        m.w.resize(out * n);
      }
      ONYX_CHECK(n == m.taps, node.describe(), ": internal error: tap count changed along an axis");
      int64_t pw = (n + 1) / 2;
      double xp = xo + (double)pw;
      double pf = std::floor(xp);
      double frac = xp - pf;
      int64_t off;
      if (n % 2 == 0)
        off = frac == 0 ? -(n / 2) : -(n / 2) + 1;
      else
        off = frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1;
      int64_t start = (int64_t)pf + off - pw;
      if (exclude_outside) {
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
          int64_t i = start + j;
          if (i < 0 || i >= in) c[j] = 0;
          sum += c[j];
        }
        if (sum == 0) sum = 1;
        for (double& v : c) v /= sum;
      }
      for (int64_t j = 0; j < n; j++) {
        m.idx[y * n + j] = std::clamp<int64_t>(start + j, 0, in - 1);
        m.w[y * n + j] = c[j];
      }
    }
    p.maps.push_back(std::move(m));
  }
  return p;
}

const Tensor* nonempty(const Tensor* t) { return t && t->numel() > 0 ? t : nullptr; }

// (outer, in, inner) -> (outer, out, inner) along one map. S, D: source / destination types.
// Threaded over the outer rows; the innermost axis (inner == 1) sums each output's taps in a
// scalar.
template <class S, class D>
void apply_map(const AxisMap& m, const S* x, D* y, int64_t outer, int64_t inner, double ext) {
  const int64_t T = m.taps;
  const int64_t* idx = m.idx.data();
  const double* wt = m.w.data();
  parallel_for(outer, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, m.out * inner * T)),
               [&](int64_t b, int64_t e) {
                 std::vector<double> acc(inner);
                 for (int64_t o = b; o < e; o++) {
                   const S* xo = x + o * m.in * inner;
                   D* yo = y + o * m.out * inner;
                   for (int64_t j = 0; j < m.out; j++) {
                     if (m.extrap[j]) {
                       for (int64_t k = 0; k < inner; k++) yo[j * inner + k] = Elem<D>::store(ext);
                       continue;
                     }
                     if (inner == 1) {
                       double sum = 0;
                       for (int64_t t = 0; t < T; t++)
                         sum += wt[j * T + t] * Elem<S>::load(xo[idx[j * T + t]]);
                       yo[j] = Elem<D>::store(sum);
                       continue;
                     }
                     std::fill(acc.begin(), acc.end(), 0.0);
                     double* ap = acc.data();
                     for (int64_t t = 0; t < T; t++) {
                       double w = wt[j * T + t];
                       if (w == 0) continue;
                       const S* src = xo + idx[j * T + t] * inner;
#pragma omp simd
                       for (int64_t k = 0; k < inner; k++) ap[k] += w * Elem<S>::load(src[k]);
                     }
                     D* dst = yo + j * inner;
                     for (int64_t k = 0; k < inner; k++) dst[k] = Elem<D>::store(ap[k]);
                   }
                 }
               });
}

// Transposed: (outer, out, inner) -> (outer, in, inner); dx[i] = sum of w * dy[j] over the taps
// (j, t) with idx == i of non-extrapolated j.
template <class S, class D>
void apply_map_transposed(const AxisMap& m, const S* dy, D* dx, int64_t outer, int64_t inner) {
  // CSR of the inverse map: for each input position, its (output position, weight) pairs.
  std::vector<int64_t> start(m.in + 1, 0);
  for (int64_t j = 0; j < m.out; j++)
    if (!m.extrap[j])
      for (int64_t t = 0; t < m.taps; t++)
        if (m.w[j * m.taps + t] != 0) start[m.idx[j * m.taps + t] + 1]++;
  for (int64_t i = 0; i < m.in; i++) start[i + 1] += start[i];
  std::vector<int64_t> src(start[m.in]);
  std::vector<double> wt(start[m.in]);
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t j = 0; j < m.out; j++)
    if (!m.extrap[j])
      for (int64_t t = 0; t < m.taps; t++) {
        double w = m.w[j * m.taps + t];
        if (w == 0) continue;
        int64_t i = m.idx[j * m.taps + t];
        src[fill[i]] = j;
        wt[fill[i]++] = w;
      }
  const int64_t per_row = std::max<int64_t>(1, start[m.in]) * inner;
  parallel_for(outer, std::max<int64_t>(1, 16384 / per_row), [&](int64_t b, int64_t e) {
    std::vector<double> acc(inner);
    for (int64_t o = b; o < e; o++) {
      const S* dyo = dy + o * m.out * inner;
      D* dxo = dx + o * m.in * inner;
      for (int64_t i = 0; i < m.in; i++) {
        if (inner == 1) {
          double sum = 0;
          for (int64_t q = start[i]; q < start[i + 1]; q++)
            sum += wt[q] * Elem<S>::load(dyo[src[q]]);
          dxo[i] = Elem<D>::store(sum);
          continue;
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double* ap = acc.data();
        for (int64_t q = start[i]; q < start[i + 1]; q++) {
          const S* p = dyo + src[q] * inner;
          double w = wt[q];
#pragma omp simd
          for (int64_t k = 0; k < inner; k++) ap[k] += w * Elem<S>::load(p[k]);
        }
        D* dst = dxo + i * inner;
        for (int64_t k = 0; k < inner; k++) dst[k] = Elem<D>::store(ap[k]);
      }
    }
  });
}

void outer_inner(const Shape& s, int axis, int64_t& outer, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int i = 0; i < axis; i++) outer *= s[i];
  for (size_t i = axis + 1; i < s.size(); i++) inner *= s[i];
}

// ---- one-tap maps (nearest-neighbour resizes, Pad's gradient) ---------------------------------
// A map whose outputs each copy one input position (a tap of weight 1, the others 0) is a gather
// forward and a sum of copies backward: no weights, no double intermediates. Same values as the
// general path for finite inputs (a copy is exact, and the backward adds the same terms in the
// same order in double); where the general path's zero-weight taps multiply an inf or NaN
// neighbour into NaN, or turn -0 into +0, the copy keeps the picked value.

// The source position per output (-1: extrapolated, a constant), or empty if `m` weighs its taps.
std::vector<int64_t> picks_of(const AxisMap& m) {
  std::vector<int64_t> pick(m.out, -1);
  for (int64_t j = 0; j < m.out; j++) {
    if (m.extrap[j]) continue;
    for (int64_t t = 0; t < m.taps; t++) {
      const double w = m.w[j * m.taps + t];
      if (w == 1 && pick[j] < 0)
        pick[j] = m.idx[j * m.taps + t];
      else if (w != 0)
        return {};
    }
    if (pick[j] < 0) return {};
  }
  return pick;
}

// y (outer, out, inner) = x (outer, in, inner) gathered along the middle axis (no -1 picks).
template <class T>
void gather_axis(const std::vector<int64_t>& pick, int64_t in, const T* x, T* y, int64_t outer,
                 int64_t inner) {
  const int64_t out = (int64_t)pick.size();
  parallel_for(outer, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, out * inner)),
               [&](int64_t b, int64_t e) {
                 for (int64_t o = b; o < e; o++) {
                   const T* xo = x + o * in * inner;
                   T* yo = y + o * out * inner;
                   if (inner == 1) {
                     for (int64_t j = 0; j < out; j++) yo[j] = xo[pick[j]];
                   } else {
                     for (int64_t j = 0; j < out; j++)
                       std::memcpy((void*)(yo + j * inner), (const void*)(xo + pick[j] * inner),
                                   inner * sizeof(T));
                   }
                 }
               });
}

// y (outer, H', W') = x (outer, H, W) picked along both last axes in one pass (an image's
// nearest-neighbour upsampling): each output row gathered from its source row, or copied from
// the output row before it when both pick the same source row. Two gather_axis passes wrote and
// read a whole intermediate: 6 ms against ~1 ms for the Fashion-MNIST UNet's (64, 64, 14, 14)
// -> 28 x 28 (ONYX_PROFILE=shapes).
template <class T>
void gather_last_two(const std::vector<int64_t>& pick_h, const std::vector<int64_t>& pick_w,
                     int64_t H, int64_t W, const T* x, T* y, int64_t outer) {
  const int64_t Ho = (int64_t)pick_h.size(), Wo = (int64_t)pick_w.size();
  parallel_for(outer, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, Ho * Wo)),
               [&](int64_t b, int64_t e) {
                 for (int64_t o = b; o < e; o++) {
                   const T* xo = x + o * H * W;
                   T* yo = y + o * Ho * Wo;
                   for (int64_t i = 0; i < Ho; i++) {
                     T* row = yo + i * Wo;
                     if (i > 0 && pick_h[i] == pick_h[i - 1]) {
                       std::memcpy((void*)row, (const void*)(row - Wo), Wo * sizeof(T));
                       continue;
                     }
                     const T* src = xo + pick_h[i] * W;
                     for (int64_t j = 0; j < Wo; j++) row[j] = src[pick_w[j]];
                   }
                 }
               });
}

// Forward of maps that all pick: true if it ran.
template <class T>
bool gather_resize(const ResizePlan& p, const T* x, T* y) {
  std::vector<std::vector<int64_t>> picks;
  for (const AxisMap& m : p.maps) {
    picks.push_back(picks_of(m));
    if (picks.back().empty() || std::count(picks.back().begin(), picks.back().end(), -1) > 0)
      return false;
  }
  const int rank = (int)p.in.size();
  if (p.maps.size() == 2 && rank >= 2 && p.maps[0].axis == rank - 2 && p.maps[1].axis == rank - 1) {
    int64_t outer, inner;
    outer_inner(p.in, rank - 2, outer, inner);
    gather_last_two(picks[0], picks[1], p.maps[0].in, p.maps[1].in, x, y, outer);
    return true;
  }
  Shape cur = p.in;
  std::vector<T> a, b;  // intermediates (exact copies)
  const T* src = x;
  for (size_t s = 0; s < p.maps.size(); s++) {
    const AxisMap& m = p.maps[s];
    int64_t outer, inner;
    outer_inner(cur, m.axis, outer, inner);
    cur[m.axis] = m.out;
    T* dst = y;
    if (s + 1 < p.maps.size()) {
      std::vector<T>& buf = s % 2 == 0 ? a : b;
      buf.resize(shape_numel(cur));
      dst = buf.data();
    }
    gather_axis(picks[s], m.in, src, dst, outer, inner);
    src = dst;
  }
  return true;
}

// The outputs that copy each input position, as CSR (start has in + 1 entries).
void invert_picks(const std::vector<int64_t>& pick, int64_t in, std::vector<int64_t>& start,
                  std::vector<int64_t>& src) {
  start.assign(in + 1, 0);
  for (int64_t i : pick)
    if (i >= 0) start[i + 1]++;
  for (int64_t i = 0; i < in; i++) start[i + 1] += start[i];
  src.resize(start[in]);
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t j = 0; j < (int64_t)pick.size(); j++)
    if (pick[j] >= 0) src[fill[pick[j]]++] = j;
}

// Backward of one picking map, or of two on the last two axes (an image's H and W), in one pass:
// dx[o, i(, k)] = sum over the outputs that copied it (the inner map's sums first); true if it ran.
template <class T>
bool scatter_resize_grad(const ResizePlan& p, const T* dy, T* dx) {
  const size_t nm = p.maps.size(), r = p.in.size();
  if (nm == 0 || nm > 2 ||
      (nm == 2 && (p.maps[0].axis != (int)r - 2 || p.maps[1].axis != (int)r - 1)))
    return false;
  std::vector<int64_t> start[2], src[2];
  for (size_t s = 0; s < nm; s++) {
    const std::vector<int64_t> pick = picks_of(p.maps[s]);
    if (pick.empty()) return false;
    invert_picks(pick, p.maps[s].in, start[s], src[s]);
  }
  const AxisMap& m = p.maps[0];
  int64_t outer, inner;
  outer_inner(p.in, m.axis, outer, inner);
  const int64_t out_inner = nm == 2 ? p.maps[1].out : inner;  // dY's inner extent
  parallel_for(outer * m.in, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, inner)),
               [&](int64_t b, int64_t e) {
                 for (int64_t row = b; row < e; row++) {
                   const int64_t o = row / m.in, i = row % m.in;
                   T* d = dx + row * inner;
                   for (int64_t k = 0; k < inner; k++) {
                     double sum = 0;
                     for (int64_t q = start[0][i]; q < start[0][i + 1]; q++) {
                       const T* dyr = dy + (o * m.out + src[0][q]) * out_inner;
                       if (nm == 1) {
                         sum += Elem<T>::load(dyr[k]);
                         continue;
                       }
                       double part = 0;
                       for (int64_t u = start[1][k]; u < start[1][k + 1]; u++)
                         part += Elem<T>::load(dyr[src[1][u]]);
                       sum += part;
                     }
                     d[k] = Elem<T>::store(sum);
                   }
                 }
               });
  return true;
}

// Runs the maps (forward) or their transposes in reverse order (backward) from `x` into `y`,
// intermediates in double.
template <class T, bool BACKWARD>
void run_maps(const ResizePlan& p, const T* x, T* y) {
  const std::vector<AxisMap>& maps = p.maps;
  int64_t nm = (int64_t)maps.size();
  Shape cur = BACKWARD ? p.out : p.in;
  if (nm == 0) {
    std::memcpy((void*)y, (const void*)x, shape_numel(cur) * sizeof(T));
    return;
  }
  if constexpr (BACKWARD) {
    if (scatter_resize_grad(p, x, y)) return;
  } else {
    if (gather_resize(p, x, y)) return;
  }
  std::unique_ptr<double[]> a, b;  // ping-pong intermediates (not zero-filled: fully written)
  int64_t a_size = 0, b_size = 0;
  const double* src_d = nullptr;
  for (int64_t s = 0; s < nm; s++) {
    const AxisMap& m = maps[BACKWARD ? nm - 1 - s : s];
    int64_t outer, inner;
    outer_inner(cur, m.axis, outer, inner);
    Shape next = cur;
    next[m.axis] = BACKWARD ? m.in : m.out;
    bool last = s == nm - 1;
    double* dst_d = nullptr;
    if (!last) {
      std::unique_ptr<double[]>& buf = (s % 2 == 0) ? a : b;
      int64_t& size = (s % 2 == 0) ? a_size : b_size;
      if (size < shape_numel(next)) {
        size = shape_numel(next);
        buf.reset(new double[size]);
      }
      dst_d = buf.get();
    }
    auto step = [&](auto* src, auto* dst) {
      if constexpr (BACKWARD)
        apply_map_transposed(m, src, dst, outer, inner);
      else
        apply_map(m, src, dst, outer, inner, p.extrapolation);
    };
    if (s == 0 && last)
      step(x, y);
    else if (s == 0)
      step(x, dst_d);
    else if (last)
      step(src_d, y);
    else
      step(src_d, dst_d);
    src_d = dst_d;
    cur = next;
  }
}

const Tensor* opt_input(const KernelContext& ctx, int i) {
  return ctx.has_input(i) ? nonempty(&ctx.input(i)) : nullptr;
}

const Tensor* opt_value(const InferContext& ctx, int i) {
  return ctx.has_input(i) ? nonempty(&ctx.value(i)) : nullptr;
}

OpKernel make_resize_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& x = ctx.input(0);
    ResizePlan p =
        resize_plan(ctx.node, ctx.opset, x.shape, nullptr, opt_value(ctx, 2), opt_value(ctx, 3));
    ctx.set_output(0, x.dtype, p.out);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ResizePlan p = resize_plan(ctx.node, ctx.opset, x.shape(), opt_input(ctx, 1), opt_input(ctx, 2),
                               opt_input(ctx, 3));
    Tensor& y = ctx.output(0);
    if (y.numel() == 0) return;
    dispatch(x.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      run_maps<T, false>(p, x.data<T>(), y.data<T>());
    });
  };
  k.value_inputs = {2, 3};
  return k;
}

// ResizeGrad(dY, roi, scales, sizes): the forward's attributes, input_shape, and resize_opset
// (the forward node's opset).
OpKernel make_resize_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    Shape x = ctx.node.attr_ints_required("input_shape");
    ResizePlan p = resize_plan(ctx.node, ctx.node.attr_int("resize_opset", 13), x, nullptr,
                               opt_value(ctx, 2), opt_value(ctx, 3));
    ONYX_CHECK(p.out == dy.shape, ctx.node.describe(), ": dY ", shape_str(dy.shape),
               " is not the resized shape ", shape_str(p.out), " of ", shape_str(x));
    ctx.set_output(0, dy.dtype, x);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    Tensor& dx = ctx.output(0);
    ResizePlan p = resize_plan(ctx.node, ctx.node.attr_int("resize_opset", 13), dx.shape(),
                               opt_input(ctx, 1), opt_input(ctx, 2), opt_input(ctx, 3));
    if (dx.numel() == 0) return;
    if (dy.numel() == 0) {
      std::memset(dx.raw(), 0, dx.nbytes());
      return;
    }
    dispatch(dy.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      run_maps<T, true>(p, dy.data<T>(), dx.data<T>());
    });
  };
  k.value_inputs = {2, 3};
  return k;
}

// ---- PadGrad ----------------------------------------------------------------------------------
// PadGrad(dY): mode (constant / reflect / edge / wrap), pads (begin..., end... for every dim of
// the input, negative = crop; the rule resolves the forward's pads and axes inputs), input_shape.
// Pad is separable too: along each padded dim every output position copies one input position
// (or the constant), so dX is the transposed one-tap maps, run like ResizeGrad's.

int64_t pad_source(const std::string& mode, int64_t o, int64_t begin, int64_t n) {
  int64_t i = o - begin;
  if (i >= 0 && i < n) return i;
  if (mode == "constant") return -1;
  if (mode == "edge") return i < 0 ? 0 : n - 1;
  if (mode == "wrap") return ((i % n) + n) % n;
  if (n == 1) return 0;
  while (i < 0 || i >= n) {  // reflect without repeating the edge
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
  }
  return i;
}

ResizePlan pad_grad_plan(const ir::Node& node, const Shape& x) {
  std::string mode = node.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    ONYX_UNSUPPORTED(node.describe(), ": Pad mode '", mode, "'");
  auto pads = node.attr_ints_required("pads");
  int64_t r = (int64_t)x.size();
  ONYX_CHECK((int64_t)pads.size() == 2 * r, node.describe(), ": pads ", shape_str(pads),
             " must have 2 entries per dim of ", shape_str(x));
  ResizePlan p;
  p.in = x;
  p.out = x;
  for (int64_t d = 0; d < r; d++) {
    int64_t b = pads[d], e = pads[d + r];
    p.out[d] = x[d] + b + e;
    ONYX_CHECK(p.out[d] >= 0, node.describe(), ": pads ", shape_str(pads), " crop more than dim ",
               d, " of ", shape_str(x));
    if (b == 0 && e == 0) continue;
    if (mode != "constant" && (b > 0 || e > 0))
      ONYX_CHECK(x[d] > 0, node.describe(), ": cannot ", mode, "-pad empty dim ", d);
    AxisMap m;
    m.axis = (int)d;
    m.in = x[d];
    m.out = p.out[d];
    m.taps = 1;
    m.idx.resize(m.out);
    m.w.assign(m.out, 1.0);
    m.extrap.assign(m.out, 0);
    for (int64_t o = 0; o < m.out; o++) {
      int64_t s = pad_source(mode, o, b, x[d]);
      m.extrap[o] = s < 0;
      m.idx[o] = s < 0 ? 0 : s;
    }
    p.maps.push_back(std::move(m));
  }
  return p;
}

OpKernel make_pad_grad_kernel() {
  OpKernel k;
  k.infer = [](InferContext& ctx) {
    const TensorMeta& dy = ctx.input(0);
    Shape x = ctx.node.attr_ints_required("input_shape");
    ResizePlan p = pad_grad_plan(ctx.node, x);
    ONYX_CHECK(p.out == dy.shape, ctx.node.describe(), ": dY ", shape_str(dy.shape),
               " is not the padded shape ", shape_str(p.out), " of ", shape_str(x));
    ctx.set_output(0, dy.dtype, x);
  };
  k.compute = [](KernelContext& ctx) {
    const Tensor& dy = ctx.input(0);
    Tensor& dx = ctx.output(0);
    ResizePlan p = pad_grad_plan(ctx.node, dx.shape());
    if (dx.numel() == 0) return;
    if (dy.numel() == 0) {
      std::memset(dx.raw(), 0, dx.nbytes());
      return;
    }
    dispatch(dy.dtype(), kFloats, ctx.node, [&](auto tag) {
      using T = decltype(tag);
      run_maps<T, true>(p, dy.data<T>(), dx.data<T>());
    });
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(resize, Cpu) {
  r.add("", "Resize", make_resize_kernel());
  r.add("onyx", "ResizeGrad", make_resize_grad_kernel());
  r.add("onyx", "PadGrad", make_pad_grad_kernel());
}

}  // namespace onyx::kernels
