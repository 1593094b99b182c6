// train/optimizer.cc — AdamW (fused flat pass and per-tensor reference), SGD, and the flat-buffer
// helpers (grad norm, scale). See optimizer.h.
//
// Multiply-adds are written out exactly where PyTorch's float32 CPU kernels have them (Debian's
// torch 1.13, AVX2 kernels): add with alpha is an FMA (vec::fmadd), addcmul's self + (s*t1)*t2
// is compiled to an FMA, mul / div / addcdiv are separate roundings. Checked bit for bit against
// torch.optim.AdamW and SGD (foreach on and off) over 30 steps with decay and no-decay groups.
// The vector kernels of the fused AdamW, SGD and the grad norm are in
// kernels/cpu/simd/optimizer.cc (one per SIMD path, the same bits on each); this file keeps the
// threading, the weight-decay ranges, the scalars and the per-tensor reference AdamW, which runs
// the same arithmetic in plain scalar code.
// GCC contracts a*b + c into an FMA by default, which would silently change the rounding, so
// contraction is off for this file (as for the kernels') and every FMA below is explicit.
#pragma GCC optimize("fp-contract=off")

#include "train/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/optimizer.h"
#include "kernels/cpu/simd/simd.h"
#include "runtime/parallel.h"

namespace onyx::train {
namespace {

constexpr int64_t kUnit = 16;          // threads split buffers on multiples of 16 elements
constexpr int64_t kGrainUnits = 8192;  // 128K elements per thread at least; smaller runs inline

// Runs f(begin, end) over element ranges of [0, n) split evenly across the pool's threads.
template <class F>
void parallel_elements(int64_t n, F&& f) {
  int64_t units = (n + kUnit - 1) / kUnit;
  runtime::parallel_for(units, kGrainUnits,
                        [&](int64_t ub, int64_t ue) { f(ub * kUnit, std::min(n, ue * kUnit)); });
}

// ---------------------------------------------------------------------------------------------
// Weight-decay ranges: contiguous element ranges of the flat buffer with one decay flag each,
// tiling [0, numel) (the padding after a tensor belongs to that tensor), adjacent equal flags
// merged — so a fused pass needs no per-element lookup.
struct DecayRange {
  int64_t begin, end;
  bool decay;
};

std::vector<DecayRange> make_decay_ranges(const FlatLayout& layout, const std::vector<bool>& mask) {
  std::vector<size_t> order(layout.entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return layout.entries[a].offset < layout.entries[b].offset;
  });
  std::vector<DecayRange> ranges;
  for (size_t k = 0; k < order.size(); ++k) {
    size_t i = order[k];
    int64_t begin = k == 0 ? 0 : layout.entries[i].offset;
    int64_t end = k + 1 < order.size() ? layout.entries[order[k + 1]].offset : layout.numel;
    bool decay = mask.empty() || mask[i];
    if (begin >= end) continue;
    if (!ranges.empty() && ranges.back().decay == decay && ranges.back().end == begin)
      ranges.back().end = end;
    else
      ranges.push_back({begin, end, decay});
  }
  return ranges;
}

// Calls f(b, e, decay) for each part of [begin, end) with one decay flag.
template <class F>
void for_each_decay_range(const std::vector<DecayRange>& ranges, int64_t begin, int64_t end,
                          F&& f) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), begin,
                             [](int64_t x, const DecayRange& r) { return x < r.end; });
  for (; it != ranges.end() && it->begin < end; ++it)
    f(std::max(begin, it->begin), std::min(end, it->end), it->decay);
}

// ---------------------------------------------------------------------------------------------
// AdamW. Scalars are computed in double, as torch does in Python, and rounded to float where
// torch's kernels receive them.
struct AdamWScalars : simd::AdamWConstants {
  float keep_decay;  // 1 - lr * weight_decay (decoupled decay, torch's param.mul_)
};

AdamWScalars adamw_scalars(const OptimizerConfig& c, double lr, int64_t t) {
  double bias_correction1 = 1 - std::pow(c.beta1, (double)t);
  double bias_correction2 = 1 - std::pow(c.beta2, (double)t);
  AdamWScalars k;
  k.keep_decay = (float)(1 - lr * c.weight_decay);
  k.beta1 = (float)c.beta1;
  k.one_minus_beta1 = (float)(1 - c.beta1);
  k.beta2 = (float)c.beta2;
  k.one_minus_beta2 = (float)(1 - c.beta2);
  k.bias_correction2_sqrt = (float)std::sqrt(bias_correction2);
  k.eps = (float)c.eps;
  k.neg_step_size = (float)(-(lr / bias_correction1));
  return k;
}

// One AdamW update of n elements in plain scalar code (the reference), operation for operation as
// torch 1.13's float32 CPU kernels and as simd::adamw_update, the fused pass's kernel:
//   g = g * grad_scale                             clip_grad_norm_'s mul_ (1: none)
//   p = p * keep                                   mul_
//   m = fma(g, 1-b1, m * b1)                       mul_, add_(alpha) (vectorized add is an FMA)
//   v = fma((1-b2) * g, g, v * b2)                 mul_, addcmul_ (FMA in torch's build)
//   p = p + (-step_size * m) / (sqrt(v) / sqrt(bc2) + eps)      sqrt, div, add_, addcdiv_
// `keep` is k.keep_decay for tensors with weight decay and 1 (torch's 1 - lr*0) for the others.
inline void adamw_update_scalar(float* p, const float* g, float* m, float* v, int64_t n,
                                const AdamWScalars& k, float keep) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * k.grad_scale;
    float pi = p[i] * keep;
    float mi = std::fma(gi, k.one_minus_beta1, m[i] * k.beta1);
    float vi = std::fma(k.one_minus_beta2 * gi, gi, v[i] * k.beta2);
    float denom = std::sqrt(vi) / k.bias_correction2_sqrt + k.eps;
    p[i] = pi + (k.neg_step_size * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

// ---------------------------------------------------------------------------------------------
// Shared by all optimizers here: the layout, decay ranges, named flat state buffers, checks.
class FlatOptimizer : public Optimizer {
 public:
  FlatOptimizer(std::string name, const OptimizerConfig& config, const FlatLayout& layout,
                const std::vector<bool>& decay_mask, const std::vector<std::string>& buffer_names,
                int64_t begin, int64_t end)
      : name_(std::move(name)),
        config_(config),
        layout_(layout),
        decay_mask_(decay_mask),
        ranges_(make_decay_ranges(layout, decay_mask)) {
    range_begin = begin;
    range_end = end;
    for (auto& b : buffer_names) buffers_[b] = Tensor::zeros(DType::Float32, {end - begin});
  }

  const std::string& name() const override { return name_; }

  std::map<std::string, Tensor> state() const override {
    std::map<std::string, Tensor> s = buffers_;
    s["step"] = Tensor::scalar_i64(step_count);
    return s;
  }

  void load_state(const std::map<std::string, Tensor>& state) override {
    std::string expected;
    for (auto& [key, t] : buffers_) expected += key + ", ";
    expected += "step";
    for (auto& [key, t] : state)
      ONYX_CHECK(key == "step" || buffers_.count(key), name_, " optimizer state: unexpected key '",
                 key, "' (expected ", expected, ")");
    for (auto& [key, buf] : buffers_) {
      auto it = state.find(key);
      ONYX_CHECK(it != state.end(), name_, " optimizer state: missing key '", key, "' (expected ",
                 expected, ")");
      const Tensor& t = it->second;
      ONYX_CHECK(t.defined() && t.dtype() == DType::Float32 && t.shape() == buf.shape(), name_,
                 " optimizer state '", key, "': expected float32 ", shape_str(buf.shape()),
                 ", got ", t.defined() ? dtype_name(t.dtype()) : "undefined", " ",
                 shape_str(t.shape()));
    }
    auto it = state.find("step");
    ONYX_CHECK(it != state.end(), name_, " optimizer state: missing key 'step' (expected ",
               expected, ")");
    const Tensor& st = it->second;
    ONYX_CHECK(st.defined() && is_integer(st.dtype()) && st.numel() == 1, name_,
               " optimizer state 'step': expected an int64 scalar, got ",
               st.defined() ? dtype_name(st.dtype()) : "undefined", " ", shape_str(st.shape()));
    int64_t step = st.to_int64_vector()[0];
    ONYX_CHECK(step >= 0, name_, " optimizer state 'step': negative value ", step);
    for (auto& [key, buf] : buffers_) std::memcpy(buf.raw(), state.at(key).raw(), buf.nbytes());
    step_count = step;
  }

 protected:
  // `b` has the optimizer's layout (entries, offsets, shapes, names) with elements of `dtype`.
  void check_layout(const FlatBuffer& b, DType dtype, const char* what) const {
    const FlatLayout& l = b.layout();
    ONYX_CHECK(
        l.dtype == dtype && l.numel == layout_.numel && l.entries.size() == layout_.entries.size(),
        name_, ".step: the ", what, " buffer (", dtype_name(l.dtype), ", ", l.entries.size(),
        " tensors, ", l.numel, " elements) does not have the optimizer's layout (",
        dtype_name(dtype), ", ", layout_.entries.size(), " tensors, ", layout_.numel, " elements)");
    for (size_t i = 0; i < l.entries.size(); ++i) {
      auto &a = l.entries[i], &e = layout_.entries[i];
      ONYX_CHECK(a.offset == e.offset && a.shape == e.shape && a.name == e.name, name_,
                 ".step: the ", what, " buffer's tensor #", i, " is '", a.name, "' ",
                 shape_str(a.shape), " at ", a.offset, ", the optimizer's is '", e.name, "' ",
                 shape_str(e.shape), " at ", e.offset);
    }
  }
  void check_buffers(const FlatBuffer& params, const FlatBuffer& grads) const {
    check_layout(params, DType::Float32, "params");
    check_layout(grads, DType::Float32, "grads");
  }
  // The optimizers that do not read a gradient scale into their update (scales_gradients()
  // false) take none.
  void check_unscaled(float grad_scale) const {
    ONYX_CHECK(grad_scale == 1.0f, "optimizer '", name_, "' takes no gradient scale (got ",
               grad_scale, "): scale the gradients before step()");
  }
  // The bf16 shadow's first element (nullptr without one), checked against the layout.
  uint16_t* shadow_data(FlatBuffer* shadow) const {
    if (!shadow) return nullptr;
    check_layout(*shadow, DType::BFloat16, "bf16 shadow");
    return shadow->flat().data<uint16_t>();
  }
  // shadow[range] = params[range] rounded to bf16 (the optimizers without a fused write).
  void write_shadow(const FlatBuffer& params, FlatBuffer* shadow) const {
    uint16_t* s = shadow_data(shadow);
    if (!s) return;
    const float* p = params.flat().data<float>();
    kernels::f32_to_bf16(p + range_begin, s + range_begin, range_end - range_begin);
  }

  bool decays(size_t entry) const { return decay_mask_.empty() || decay_mask_[entry]; }
  float* buffer(const std::string& key) { return buffers_.at(key).data<float>(); }

  std::string name_;
  OptimizerConfig config_;
  FlatLayout layout_;
  std::vector<bool> decay_mask_;
  std::vector<DecayRange> ranges_;
  std::map<std::string, Tensor> buffers_;
};

// One threaded, vectorized pass over the flat buffers.
class FusedAdamW : public FlatOptimizer {
 public:
  FusedAdamW(const OptimizerConfig& c, const FlatLayout& l, const std::vector<bool>& mask,
             int64_t b, int64_t e)
      : FlatOptimizer("adamw_fused", c, l, mask, {"exp_avg", "exp_avg_sq"}, b, e) {}
  bool scales_gradients() const override { return true; }

  void step(FlatBuffer& params, const FlatBuffer& grads, double lr, FlatBuffer* bf16_shadow,
            float grad_scale) override {
    check_buffers(params, grads);
    uint16_t* s = shadow_data(bf16_shadow);
    ++step_count;
    AdamWScalars k = adamw_scalars(config_, lr, step_count);
    k.grad_scale = grad_scale;
    float* p = params.flat().data<float>();
    const float* g = grads.flat().data<float>();
    // state element i belongs to buffer element range_begin + i
    float* m = buffer("exp_avg") - range_begin;
    float* v = buffer("exp_avg_sq") - range_begin;
    parallel_elements(range_end - range_begin, [&](int64_t begin, int64_t end) {
      for_each_decay_range(
          ranges_, range_begin + begin, range_begin + end, [&](int64_t b, int64_t e, bool decay) {
            const float keep = decay ? k.keep_decay : 1.0f;
            if (!s) return simd::adamw_update(p + b, g + b, m + b, v + b, e - b, k, keep);
            // the shadow rounded from each block of updated weights while it is in L1
            for (int64_t c = b; c < e; c += kShadowBlock) {
              const int64_t n = std::min(kShadowBlock, e - c);
              simd::adamw_update(p + c, g + c, m + c, v + c, n, k, keep);
              kernels::f32_to_bf16(p + c, s + c, n);
            }
          });
    });
  }

 private:
  static constexpr int64_t kShadowBlock = 2048;  // 8 KB of each of p, g, m, v
};

// The reference: tensor by tensor, plain scalar code, one thread. Same math as FusedAdamW.
class ReferenceAdamW : public FlatOptimizer {
 public:
  ReferenceAdamW(const OptimizerConfig& c, const FlatLayout& l, const std::vector<bool>& mask,
                 int64_t b, int64_t e)
      : FlatOptimizer("adamw", c, l, mask, {"exp_avg", "exp_avg_sq"}, b, e) {}
  bool scales_gradients() const override { return true; }

  void step(FlatBuffer& params, const FlatBuffer& grads, double lr, FlatBuffer* bf16_shadow,
            float grad_scale) override {
    check_buffers(params, grads);
    shadow_data(bf16_shadow);  // checked before anything changes
    ++step_count;
    AdamWScalars k = adamw_scalars(config_, lr, step_count);
    k.grad_scale = grad_scale;
    float* m = buffer("exp_avg") - range_begin;
    float* v = buffer("exp_avg_sq") - range_begin;
    float* p = params.flat().data<float>();
    const float* g = grads.flat().data<float>();
    for (size_t i = 0; i < layout_.entries.size(); ++i) {  // each tensor's part of the range
      const FlatLayout::Entry& e = layout_.entries[i];
      int64_t b = std::max(range_begin, e.offset);
      int64_t end = std::min(range_end, e.offset + shape_numel(e.shape));
      if (end > b)
        adamw_update_scalar(p + b, g + b, m + b, v + b, end - b, k,
                            decays(i) ? k.keep_decay : 1.0f);
    }
    write_shadow(params, bf16_shadow);
  }
};

// SGD, as torch 1.13's _single_tensor_sgd (dampening 0), computed by simd::sgd_update:
//   d = decay ? fma(p, wd, g) : g                  d_p.add(param, alpha=wd)
//   buf = first ? d : buf * mu + d                 clone / buf.mul_(mu).add_(d_p)
//   d = nesterov ? fma(buf, mu, d) : buf           d_p.add(buf, alpha=mu)
//   p = fma(d, -lr, p)                             param.add_(d_p, alpha=-lr)
class Sgd : public FlatOptimizer {
 public:
  Sgd(const OptimizerConfig& c, const FlatLayout& l, const std::vector<bool>& mask, int64_t b,
      int64_t e)
      : FlatOptimizer("sgd", c, l, mask,
                      c.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                                      : std::vector<std::string>{},
                      b, e) {}

  void step(FlatBuffer& params, const FlatBuffer& grads, double lr, FlatBuffer* bf16_shadow,
            float grad_scale) override {
    check_buffers(params, grads);
    check_unscaled(grad_scale);
    shadow_data(bf16_shadow);  // checked before anything changes
    bool momentum = config_.momentum != 0, first = step_count == 0;
    simd::SgdConstants k{(float)config_.weight_decay, (float)config_.momentum, (float)(-lr)};
    bool any_decay = config_.weight_decay != 0;  // torch skips the decay add when wd == 0
    unsigned flags = (momentum ? simd::kSgdMomentum : 0u) | (first ? simd::kSgdFirst : 0u) |
                     (config_.nesterov ? simd::kSgdNesterov : 0u);
    float* p = params.flat().data<float>();
    const float* g = grads.flat().data<float>();
    float* buf = momentum ? buffer("momentum_buffer") - range_begin : nullptr;
    parallel_elements(range_end - range_begin, [&](int64_t begin, int64_t end) {
      for_each_decay_range(ranges_, range_begin + begin, range_begin + end,
                           [&](int64_t b, int64_t e, bool decay) {
                             simd::sgd_update(p + b, g + b, buf ? buf + b : nullptr, e - b, k,
                                              flags | (decay && any_decay ? simd::kSgdDecay : 0u));
                           });
    });
    write_shadow(params, bf16_shadow);
    ++step_count;
  }
};

// Adafactor (Shazeer & Stern 2018) as Transformers' transformers.optimization.Adafactor runs
// under the Trainer's optim="adafactor": scale_parameter, relative_step and warmup_init off,
// beta1 None (no first moment), eps (1e-30, 1e-3), clip_threshold 1, decay_rate -0.8, the
// Trainer's learning rate and weight decay. A tensor of rank >= 2 keeps factored second moments
// (means of g^2 + eps over its last and second-to-last dimension), others a full one:
//   beta2t = 1 - step^-0.8
//   row = row*beta2t + (1-beta2t)*mean_c(g^2+eps)   col = col*beta2t + (1-beta2t)*mean_r(g^2+eps)
//   u = rsqrt(row / mean_r(row)) * rsqrt(col) * g   (full: u = rsqrt(v) * g)
//   u = u / max(rms(u) / clip_threshold, 1) * lr;  p += p * (-wd*lr);  p -= u
// float32 storage and arithmetic with the means and the RMS summed in double (PyTorch reduces in
// float32): within float rounding of Transformers', not bit for bit. The state is per tensor, so
// it is not sharded across ranks (zero_stage 0 only).
class Adafactor : public FlatOptimizer {
 public:
  Adafactor(const OptimizerConfig& c, const FlatLayout& l, const std::vector<bool>& mask, int64_t b,
            int64_t e)
      : FlatOptimizer("adafactor", c, l, mask, {}, b, e) {
    ONYX_CHECK(b == 0 && e == l.numel,
               "optimizer 'adafactor' keeps per-tensor state that ZeRO does not shard: use "
               "zero_stage 0 (data parallelism without sharding)");
    for (auto& en : l.entries) {
      const int64_t n = shape_numel(en.shape);
      if (en.shape.size() >= 2 && n > 0) {
        const int64_t R = en.shape[en.shape.size() - 2], C = en.shape.back();
        buffers_["exp_avg_sq_row." + en.name] = Tensor::zeros(DType::Float32, {n / C});
        buffers_["exp_avg_sq_col." + en.name] = Tensor::zeros(DType::Float32, {n / R});
      } else {
        buffers_["exp_avg_sq." + en.name] = Tensor::zeros(DType::Float32, {n});
      }
    }
  }

  void step(FlatBuffer& params, const FlatBuffer& grads, double lr, FlatBuffer* bf16_shadow,
            float grad_scale) override {
    check_buffers(params, grads);
    check_unscaled(grad_scale);
    shadow_data(bf16_shadow);  // checked before anything changes
    ++step_count;
    const double beta2t = 1.0 - std::pow((double)step_count, -0.8);
    const float b2 = (float)beta2t, one_minus_b2 = (float)(1.0 - beta2t);
    float* p = params.flat().data<float>();
    const float* g = grads.flat().data<float>();
    std::vector<float> u;
    for (size_t i = 0; i < layout_.entries.size(); ++i) {
      const FlatLayout::Entry& en = layout_.entries[i];
      const int64_t n = shape_numel(en.shape);
      if (n == 0) continue;
      u.assign((size_t)n, 0.0f);
      const float* gi = g + en.offset;
      if (en.shape.size() >= 2)
        factored_update(en, gi, b2, one_minus_b2, u.data());
      else
        full_update(en, gi, n, b2, one_minus_b2, u.data());
      double sq = 0;
      for (int64_t k = 0; k < n; k++) sq += (double)u[k] * u[k];
      const float rms = (float)(std::sqrt(sq) / std::sqrt((double)n));
      const float div = std::max(rms / 1.0f, 1.0f);  // clip_threshold 1
      const float wd = decays(i) ? (float)(-config_.weight_decay * lr) : 0.0f;
      float* pi = p + en.offset;
      for (int64_t k = 0; k < n; k++) {
        const float uk = u[k] / div * (float)lr;
        if (wd != 0) pi[k] = pi[k] + pi[k] * wd;
        pi[k] = pi[k] - uk;
      }
    }
    write_shadow(params, bf16_shadow);
  }

 private:
  void full_update(const FlatLayout::Entry& en, const float* g, int64_t n, float b2,
                   float one_minus_b2, float* u) {
    float* v = buffer("exp_avg_sq." + en.name);
    for (int64_t k = 0; k < n; k++) {
      v[k] = v[k] * b2 + one_minus_b2 * (g[k] * g[k] + 1e-30f);
      u[k] = g[k] / std::sqrt(v[k]);
    }
  }
  void factored_update(const FlatLayout::Entry& en, const float* g, float b2, float one_minus_b2,
                       float* u) {
    const int64_t R = en.shape[en.shape.size() - 2], C = en.shape.back();
    const int64_t B = shape_numel(en.shape) / (R * C);
    float* row = buffer("exp_avg_sq_row." + en.name);  // [B, R]
    float* col = buffer("exp_avg_sq_col." + en.name);  // [B, C]
    std::vector<double> col_sum((size_t)C);
    std::vector<float> c_factor((size_t)C);
    for (int64_t b = 0; b < B; b++) {
      const float* gb = g + b * R * C;
      std::fill(col_sum.begin(), col_sum.end(), 0.0);
      for (int64_t r = 0; r < R; r++) {
        double s = 0;
        for (int64_t c = 0; c < C; c++) {
          const double sq = (double)(gb[r * C + c] * gb[r * C + c] + 1e-30f);
          s += sq;
          col_sum[c] += sq;
        }
        float& rv = row[b * R + r];
        rv = rv * b2 + one_minus_b2 * (float)(s / (double)C);
      }
      double row_mean = 0;
      for (int64_t r = 0; r < R; r++) row_mean += row[b * R + r];
      const float rm = (float)(row_mean / (double)R);
      for (int64_t c = 0; c < C; c++) {
        float& cv = col[b * C + c];
        cv = cv * b2 + one_minus_b2 * (float)(col_sum[c] / (double)R);
        c_factor[c] = 1.0f / std::sqrt(cv);
      }
      for (int64_t r = 0; r < R; r++) {
        const float r_factor = 1.0f / std::sqrt(row[b * R + r] / rm);
        for (int64_t c = 0; c < C; c++)
          u[b * R * C + r * C + c] = r_factor * c_factor[c] * gb[r * C + c];
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
void check_float32(const FlatBuffer& b, const char* what) {
  if (b.layout().dtype != DType::Float32)
    ONYX_UNSUPPORTED(what, ": flat buffers of ", dtype_name(b.layout().dtype),
                     " are not supported (float32 only)");
}

bool contains(const std::string& haystack, const char* needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names = {"adamw_fused", "adamw", "sgd", "adafactor"};
  return names;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c, const FlatLayout& layout,
                                          const std::vector<bool>& decay_mask, int64_t begin,
                                          int64_t end) {
  if (end < 0) end = layout.numel;
  ONYX_CHECK(0 <= begin && begin <= end && end <= layout.numel, "optimizer '", c.name,
             "': element range [", begin, ", ", end, ") is outside the buffer of ", layout.numel,
             " elements");
  const auto& names = optimizer_names();
  if (std::find(names.begin(), names.end(), c.name) == names.end()) {
    std::string valid;
    for (auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
    throw Error(cat("unknown optimizer '", c.name, "' (valid: ", valid, ")"));
  }
  if (layout.dtype != DType::Float32)
    ONYX_UNSUPPORTED("optimizer '", c.name, "': flat buffers of ", dtype_name(layout.dtype),
                     " are not supported (float32 only)");
  ONYX_CHECK(decay_mask.empty() || decay_mask.size() == layout.entries.size(), "optimizer '",
             c.name, "': the weight-decay mask has ", decay_mask.size(),
             " entries, the layout has ", layout.entries.size(), " tensors");
  ONYX_CHECK(c.lr >= 0, "optimizer '", c.name, "': invalid learning rate ", c.lr);
  ONYX_CHECK(c.weight_decay >= 0, "optimizer '", c.name, "': invalid weight_decay ",
             c.weight_decay);
  if (c.name == "adafactor") return std::make_unique<Adafactor>(c, layout, decay_mask, begin, end);
  if (c.name == "sgd") {
    ONYX_CHECK(c.momentum >= 0, "optimizer 'sgd': invalid momentum ", c.momentum);
    ONYX_CHECK(!c.nesterov || c.momentum > 0, "optimizer 'sgd': nesterov needs momentum > 0");
    return std::make_unique<Sgd>(c, layout, decay_mask, begin, end);
  }
  ONYX_CHECK(c.beta1 >= 0 && c.beta1 < 1, "optimizer '", c.name, "': invalid beta1 ", c.beta1,
             " (must be in [0, 1))");
  ONYX_CHECK(c.beta2 >= 0 && c.beta2 < 1, "optimizer '", c.name, "': invalid beta2 ", c.beta2,
             " (must be in [0, 1))");
  ONYX_CHECK(c.eps >= 0, "optimizer '", c.name, "': invalid eps ", c.eps);
  if (c.name == "adamw") return std::make_unique<ReferenceAdamW>(c, layout, decay_mask, begin, end);
  return std::make_unique<FusedAdamW>(c, layout, decay_mask, begin, end);
}

std::vector<bool> hf_decay_mask(const FlatLayout& layout, bool generic_onnx) {
  std::vector<bool> mask;
  mask.reserve(layout.entries.size());
  for (auto& e : layout.entries) {
    std::string n = e.name;
    for (char& ch : n) ch = (char)std::tolower((unsigned char)ch);
    bool no_decay = contains(n, "bias") || contains(n, "layernorm") || contains(n, "layer_norm") ||
                    contains(n, "ln_") || contains(n, "norm");
    if (generic_onnx && e.shape.size() <= 1) no_decay = true;
    mask.push_back(!no_decay);
  }
  return mask;
}

// ---- SquareSum: limb i holds digits of weight 2^(32 i - 1074) --------------------------------
void SquareSum::add(double x) {
  if (!std::isfinite(x)) {
    special += x;
    return;
  }
  if (x == 0) return;
  // x = mant * 2^(pos - 1074) with mant read from x's bits (no frexp / ldexp: this runs once
  // per 64 gradients): a normal x has the 53-bit mantissa 2^52 + fraction at pos = exponent - 1,
  // a subnormal its fraction at pos 0 (both exact)
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  const int biased = (int)((u >> 52) & 0x7ff);
  const uint64_t fraction = u & ((uint64_t(1) << 52) - 1);
  const uint64_t mant = biased == 0 ? fraction : fraction | (uint64_t(1) << 52);
  const int pos = biased == 0 ? 0 : biased - 1;
  unsigned __int128 v = (unsigned __int128)mant << (pos % 32);
  int li = pos / 32;
  limb[li] += (uint32_t)v;
  limb[li + 1] += (uint32_t)(v >> 32);
  limb[li + 2] += (uint64_t)(v >> 64);
  if (++pending >= (int64_t(1) << 30)) normalize();
}

void SquareSum::normalize() {
  uint64_t carry = 0;
  for (int i = 0; i < kLimbs; i++) {
    uint64_t t = limb[i] + carry;
    limb[i] = t & 0xffffffffu;
    carry = t >> 32;
  }
  pending = 0;
}

void SquareSum::merge(const SquareSum& other) {
  SquareSum o = other;
  o.normalize();
  normalize();
  for (int i = 0; i < kLimbs; i++) limb[i] += o.limb[i];
  special += o.special;
  normalize();
}

double SquareSum::value() const {
  SquareSum s = *this;
  s.normalize();
  if (s.special != 0 || std::isnan(s.special)) return s.special;
  int top = kLimbs - 1;
  while (top >= 0 && s.limb[top] == 0) top--;
  if (top < 0) return 0;
  // The top four digits (at least 97 significant bits), high to low: a fixed function of the
  // exact sum.
  double v = 0;
  for (int i = top; i >= 0 && i > top - 4; i--) v += std::ldexp((double)s.limb[i], 32 * i - 1074);
  return v;
}

SquareSum square_sum(const FlatBuffer& grads, int64_t begin, int64_t end) {
  check_float32(grads, "square_sum");
  const int64_t n = grads.layout().numel;
  if (end < 0 || end > n) end = n;
  ONYX_CHECK(begin % 64 == 0 && begin >= 0, "square_sum: begin ", begin,
             " is not a multiple of 64");
  const float* g = grads.flat().data<float>();
  constexpr int64_t kBlock = simd::kSquareSumBlock;
  constexpr int64_t kBatch = 1024;  // blocks per kernel call (and per thread at least)
  int64_t blocks = (std::max<int64_t>(0, end - begin) + kBlock - 1) / kBlock;
  int nt = std::max(1, runtime::num_threads());
  std::vector<SquareSum> partial((size_t)nt);
  runtime::parallel_for(blocks, kBatch, [&](int64_t bb, int64_t be) {
    SquareSum& acc = partial[(size_t)(omp_in_parallel() ? omp_get_thread_num() : 0)];
    double sums[kBatch];
    for (int64_t blk = bb; blk < be; blk += kBatch) {
      const int64_t nb = std::min(kBatch, be - blk), b = begin + blk * kBlock;
      simd::block_sum_squares(g + b, std::min(nb * kBlock, end - b), sums);
      for (int64_t j = 0; j < nb; ++j) acc.add(sums[j]);
    }
  });
  SquareSum total;
  for (auto& p : partial) total.merge(p);
  return total;
}

double global_grad_norm(const FlatBuffer& grads) { return std::sqrt(square_sum(grads).value()); }

void scale(FlatBuffer& buffer, float factor, int64_t begin, int64_t end) {
  check_float32(buffer, "scale");
  if (end < 0) end = buffer.layout().numel;
  float* x = buffer.flat().data<float>() + begin;
  parallel_elements(end - begin,
                    [&](int64_t b, int64_t e) { simd::row_scale(x + b, e - b, factor); });
}

void add_into(FlatBuffer& dst, const FlatBuffer& src, int64_t begin, int64_t end) {
  check_float32(dst, "add_into");
  ONYX_CHECK(src.layout().numel == dst.layout().numel, "add_into: buffers of ", dst.layout().numel,
             " and ", src.layout().numel, " elements");
  if (end < 0) end = dst.layout().numel;
  float* x = dst.flat().data<float>() + begin;
  const float* y = src.flat().data<float>() + begin;
  parallel_elements(end - begin, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] += y[i];
  });
}

}  // namespace onyx::train
