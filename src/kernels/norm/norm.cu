// kernels/norm/norm.cu — the CUDA kernels of LayerNormalization ("" and onyx domains),
// onyx.LayerNormGrad, onyx.RMSNorm and onyx.RMSNormGrad (formulas in layer_norm.cc), float32,
// bfloat16 and float16 rows with float32 statistics. One block per row for the forward and dx
// (two-pass mean / variance, block reductions); dscale / dbias are column sums over the rows in a
// fixed order (32 columns × 8 row groups per block), added into bound gradients when the run
// accumulates. Scale / B may broadcast over the leading normalized axes (element j reads
// scale[j mod its size]). Not yet on cuda (Unsupported, naming the node): other broadcasts,
// stash_type float64, and the `normalized` (saved bf16 xhat) forms of the gradients.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_util.cuh"

namespace onyx::kernels {
namespace {

using cuda::from_f;
using cuda::to_f;
using runtime::KernelContext;
using runtime::OpKernel;

constexpr int kThreads = 256;

// y = (x − mean)·inv·scale + bias over each row (rms: y = x·inv·scale, inv = 1/√(mean(x²)+eps)).
template <bool kRms, class TX, class TY>
__global__ void norm_rows(const TX* x, TY* y, const TX* scale, const TX* bias, int64_t cols,
                          int64_t period, float eps, float* mean_out, float* inv_out) {
  const TX* xr = x + blockIdx.x * cols;
  TY* yr = y + blockIdx.x * cols;
  float mean = 0.f;
  if (!kRms) {
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += to_f(xr[j]);
    mean = cuda::block_sum(s) / (float)cols;
  }
  float ss = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float d = to_f(xr[j]) - mean;
    ss += d * d;
  }
  const float inv = rsqrtf(cuda::block_sum(ss) / (float)cols + eps);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float v = (to_f(xr[j]) - mean) * inv * to_f(scale[j % period]);
    if (bias) v += to_f(bias[j % period]);
    yr[j] = from_f<TY>(v);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[blockIdx.x] = mean;
    if (inv_out) inv_out[blockIdx.x] = inv;
  }
}

// dx = inv·(g − mean(g) − xhat·mean(g·xhat)), g = dy·scale, xhat = (x − mean)·inv; rms: no mean
// term and xhat = x·inv.
template <bool kRms, class T>
__global__ void norm_grad_rows(const T* dy, const T* x, const T* scale, const float* mean,
                               const float* inv, T* dx, int64_t cols, int64_t period) {
  const int64_t off = blockIdx.x * cols;
  const float m = kRms ? 0.f : mean[blockIdx.x], iv = inv[blockIdx.x];
  float sg = 0.f, sgx = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float g = to_f(dy[off + j]) * to_f(scale[j % period]);
    float xh = (to_f(x[off + j]) - m) * iv;
    sg += g;
    sgx += g * xh;
  }
  sg = kRms ? 0.f : cuda::block_sum(sg) / (float)cols;
  sgx = cuda::block_sum(sgx) / (float)cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float g = to_f(dy[off + j]) * to_f(scale[j % period]);
    float xh = (to_f(x[off + j]) - m) * iv;
    dx[off + j] = from_f<T>(iv * (g - sg - xh * sgx));
  }
}

// dscale[c] (+)= Σ_r dy·xhat, dbias[c] (+)= Σ_r dy.
template <bool kRms, class T, class TS>
__global__ void norm_param_grads(const T* dy, const T* x, const float* mean, const float* inv,
                                 int64_t rows, int64_t cols, TS* dscale, TS* dbias, bool add_s,
                                 bool add_b) {
  __shared__ float ps[8][33], pb[8][33];
  const int64_t col = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f, b = 0.f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += 8) {
      float g = to_f(dy[r * cols + col]);
      float xh = (to_f(x[r * cols + col]) - (kRms ? 0.f : mean[r])) * inv[r];
      s += g * xh;
      b += g;
    }
  }
  ps[threadIdx.y][threadIdx.x] = s;
  pb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float ts = 0.f, tb = 0.f;
    for (int j = 0; j < 8; j++) {
      ts += ps[j][threadIdx.x];
      tb += pb[j][threadIdx.x];
    }
    if (dscale) dscale[col] = from_f<TS>(add_s ? to_f(dscale[col]) + ts : ts);
    if (dbias) dbias[col] = from_f<TS>(add_b ? to_f(dbias[col]) + tb : tb);
  }
}

struct Rows {
  int64_t rows = 1, cols = 1;
};

Rows rows_of(const Shape& s, int64_t axis) {
  Rows r;
  for (int64_t i = 0; i < (int64_t)s.size(); i++) (i < axis ? r.rows : r.cols) *= s[i];
  return r;
}

float* stat_output(KernelContext& c, int i) {
  if (!c.has_output(i)) return nullptr;
  ONYX_CHECK(c.output(i).dtype() == DType::Float32, c.node.describe(),
             ": float32 statistics only on cuda (stash_type 1)");
  return c.output(i).data<float>();
}

// Scale / B: its values repeat with period = its size along the normalized axes, i.e. its shape
// without leading 1s is a suffix of the normalized shape. Returns the period (cols when absent).
int64_t param_period(const KernelContext& c, int i, DType dt, const Shape& x, int64_t axis) {
  const int64_t cols = shape_numel(Shape(x.begin() + axis, x.end()));
  if (!c.has_input(i)) return cols;
  const Tensor& p = c.input(i);
  Shape s = p.shape();
  while (!s.empty() && s.front() == 1) s.erase(s.begin());
  bool suffix = s.size() <= x.size() - axis && std::equal(s.begin(), s.end(), x.end() - s.size());
  if (p.dtype() != dt || !suffix || p.numel() == 0)
    ONYX_UNSUPPORTED(c.node.describe(), ": input ", i, " ", dtype_name(p.dtype()), " ",
                     shape_str(p.shape()), " on cuda needs ", dtype_name(dt),
                     " values broadcasting over the leading normalized axes of ", shape_str(x));
  return std::max<int64_t>(1, p.numel());
}

template <bool kRms>
OpKernel norm_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    const Tensor& x = c.input(0);
    Tensor& y = c.output(0);
    const int64_t axis =
        kRms ? x.rank() - 1
             : runtime::normalize_axis(c.node.attr_int("axis", -1), x.rank(), c.node);
    const Rows d = rows_of(x.shape(), axis);
    const int64_t period = param_period(c, 1, x.dtype(), x.shape(), axis);
    if (!kRms && c.has_input(2))
      ONYX_CHECK(param_period(c, 2, x.dtype(), x.shape(), axis) == period, c.node.describe(),
                 ": Scale and B broadcast differently (not yet on cuda)");
    float* mean = kRms ? nullptr : stat_output(c, 1);
    float* inv = stat_output(c, kRms ? 1 : 2);
    if (d.rows == 0 || d.cols == 0) return;
    const float eps = c.node.attr_float("epsilon", 1e-5f);
    cuda::dispatch_float(x.dtype(), c.node, [&](auto tx) {
      cuda::dispatch_float(y.dtype(), c.node, [&](auto ty) {
        using TX = typename decltype(tx)::type;
        using TY = typename decltype(ty)::type;
        const TX* bias = !kRms && c.has_input(2) ? c.input(2).data<TX>() : nullptr;
        norm_rows<kRms, TX, TY><<<(unsigned)d.rows, kThreads, 0, cuda::stream()>>>(
            x.data<TX>(), y.data<TY>(), c.input(1).data<TX>(), bias, d.cols, period, eps, mean,
            inv);
      });
    });
    cuda::check_launch(c.node);
  };
  return k;
}

// LayerNormGrad(dy, x, scale, mean, inv) -> dx, dscale, dbias; RMSNormGrad(dy, x, scale, inv)
// -> dx, dscale.
template <bool kRms>
OpKernel norm_grad_kernel() {
  OpKernel k;
  k.compute = [](KernelContext& c) {
    cuda::require_device_tensors(c);
    if (c.node.attr_int("normalized", 0) != 0)
      ONYX_UNSUPPORTED(c.node.describe(), ": normalized = 1 (a saved bf16 xhat) on cuda");
    const Tensor& dy = c.input(0);
    const Tensor& x = c.input(1);
    const Tensor& scale = c.input(2);
    const Tensor& inv_t = c.input(kRms ? 3 : 4);
    const int64_t axis =
        kRms ? x.rank() - 1
             : runtime::normalize_axis(c.node.attr_int("axis", -1), x.rank(), c.node);
    const Rows d = rows_of(x.shape(), axis);
    ONYX_CHECK(dy.dtype() == x.dtype() && scale.dtype() == x.dtype(), c.node.describe(),
               ": dy, x and scale must share a dtype on cuda");
    const int64_t period = param_period(c, 2, x.dtype(), x.shape(), axis);
    ONYX_CHECK(inv_t.dtype() == DType::Float32 && (kRms || c.input(3).dtype() == DType::Float32),
               c.node.describe(), ": float32 statistics only on cuda");
    const float* mean = kRms ? nullptr : c.input(3).data<float>();
    const float* inv = inv_t.data<float>();
    Tensor* ds = c.has_output(1) ? &c.output(1) : nullptr;
    Tensor* db = !kRms && c.has_output(2) ? &c.output(2) : nullptr;
    if (d.rows == 0 || d.cols == 0) return;
    cuda::dispatch_float(x.dtype(), c.node, [&](auto tag) {
      using T = typename decltype(tag)::type;
      norm_grad_rows<kRms, T><<<(unsigned)d.rows, kThreads, 0, cuda::stream()>>>(
          dy.data<T>(), x.data<T>(), scale.data<T>(), mean, inv, c.output(0).data<T>(), d.cols,
          period);
      if (ds || db)
        norm_param_grads<kRms, T, T>
            <<<(unsigned)((d.cols + 31) / 32), dim3(32, 8), 0, cuda::stream()>>>(
                dy.data<T>(), x.data<T>(), mean, inv, d.rows, d.cols, ds ? ds->data<T>() : nullptr,
                db ? db->data<T>() : nullptr, c.accumulates(1), c.accumulates(2));
    });
    cuda::check_launch(c.node);
  };
  return k;
}

}  // namespace

ONYX_REGISTER_KERNELS(layer_norm, Cuda) {
  r.add("", "LayerNormalization", norm_kernel<false>());
  r.add("onyx", "LayerNormalization", norm_kernel<false>());
  r.add("onyx", "LayerNormGrad", norm_grad_kernel<false>());
  r.add("onyx", "RMSNorm", norm_kernel<true>());
  r.add("onyx", "RMSNormGrad", norm_grad_kernel<true>());
}

}  // namespace onyx::kernels
