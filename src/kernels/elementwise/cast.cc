// kernels/elementwise/cast.cc — Cast (attribute `to`) and CastLike (dtype of input 1) between every
// pair of float32/float16/bfloat16/float64/int8..64/uint8..64/bool. Float to integer truncates
// toward zero; anything to bool is x != 0; float16/bfloat16 round to nearest even, and double goes
// to them through a round-to-odd float so the result is rounded once. Strings are Unsupported.
// Hand-written because the conversion rules (truncation, NaN, halves) must be exact and the same
// on every path, and mixed-precision training casts large activations.
#include "kernels/elementwise/elementwise.h"

namespace onyx::kernels {
namespace {

using namespace ew;

// double -> float rounded to odd: correct as a first step before rounding to a narrower format.
inline float double_to_float_odd(double d) {
  float f = (float)d;
  if (std::isfinite(f) && (double)f != d) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 1) == 0) f = std::nextafter(f, d > (double)f ? INFINITY : -INFINITY);
  }
  return f;
}

template <class From, class To>
inline To convert(From v) {
  if constexpr (std::is_same_v<From, To>) {
    return v;
  } else if constexpr (is_half_like<From>) {
    return convert<float, To>(load(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<From, bool>) {
    return store<To>(v ? 1 : 0);
  } else if constexpr (is_half_like<To>) {
    if constexpr (std::is_same_v<From, float>)
      return store<To>(v);
    else
      return store<To>(double_to_float_odd((double)v));
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    return float_to_int<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

bool is_half_like_dtype(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

void cast_tensor(const Tensor& x, Tensor& y, const ir::Node& node) {
  if (x.dtype() == y.dtype()) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  // float32 <-> float16/bfloat16: the vectorized array conversions.
  if (x.dtype() == DType::Float32 && is_half_like_dtype(y.dtype())) {
    const float* src = x.data<float>();
    parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      if (y.dtype() == DType::Float16)
        from_float(src + b, y.data<Half>() + b, e - b);
      else
        from_float(src + b, y.data<BFloat16>() + b, e - b);
    });
    return;
  }
  if (y.dtype() == DType::Float32 && is_half_like_dtype(x.dtype())) {
    float* dst = y.data<float>();
    parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
      if (x.dtype() == DType::Float16)
        to_float(x.data<Half>() + b, dst + b, e - b);
      else
        to_float(x.data<BFloat16>() + b, dst + b, e - b);
    });
    return;
  }
  dispatch(x.dtype(), AllTypes{}, node, [&](auto tf) {
    using From = typename decltype(tf)::type;
    dispatch(y.dtype(), AllTypes{}, node, [&](auto tt) {
      using To = typename decltype(tt)::type;
      const From* src = x.data<From>();
      To* dst = y.data<To>();
      parallel_for(x.numel(), kGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
        for (int64_t i = b; i < e; i++) dst[i] = convert<From, To>(src[i]);
      });
    });
  });
}

void check_castable(DType from, DType to, const ir::Node& node) {
  require_dtype(from, AllTypes{}, node, "input");
  require_dtype(to, AllTypes{}, node, "target");
}

}  // namespace

ONYX_REGISTER_KERNELS(cast, Cpu) {
  OpKernel cast;
  cast.infer = [](InferContext& c) {
    int64_t to = c.node.attr_int_required("to");
    ONYX_CHECK(is_valid_onnx_dtype((int32_t)to), c.node.describe(), ": 'to' = ", to,
               " is not an ONNX dtype");
    check_castable(c.input(0).dtype, (DType)to, c.node);
    c.set_output(0, (DType)to, c.input(0).shape);
  };
  cast.compute = [](KernelContext& c) { cast_tensor(c.input(0), c.output(0), c.node); };
  r.add("", "Cast", std::move(cast)).per_token = OpTraits::PerToken::Unary;

  OpKernel like;
  like.infer = [](InferContext& c) {
    check_castable(c.input(0).dtype, c.input(1).dtype, c.node);
    c.set_output(0, c.input(1).dtype, c.input(0).shape);
  };
  like.compute = [](KernelContext& c) { cast_tensor(c.input(0), c.output(0), c.node); };
  r.add("", "CastLike", std::move(like)).meta_only_inputs = {1};  // only its dtype is read
}

}  // namespace onyx::kernels
