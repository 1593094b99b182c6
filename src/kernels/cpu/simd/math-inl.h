// kernels/cpu/simd/math-inl.h — float32 vector math for every SIMD path, in Highway's ops: the one
// exp (ExpNeg for x <= 0, Exp for the whole range, both over ExpReduced), tanh, sigmoid, erf (its
// two branches), and the masked-tail helpers of the array kernels.
// Included once per target by the kernel files of this directory (Highway's foreach_target
// pattern: the guard toggles with HWY_TARGET_TOGGLE). Hand-written because GCC 12 does not
// vectorize expf/erff/tanhf, and Highway 1.0.3's contrib Exp has neither the x <= 0 shortcut nor
// erf; the polynomials are the ones onyx used since its first AVX2 kernels, so the AVX2 path
// computes what it did before the paths were split.
// NaN: the x86 min/max instructions return their second operand when either is NaN, which the
// clamps below rely on to pass NaN through; Highway's portable Min/Max return the other operand,
// so on that path the functions restore NaN lanes explicitly (KeepNaN).
#if defined(ONYX_SIMD_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ONYX_SIMD_MATH_INL_H_
#undef ONYX_SIMD_MATH_INL_H_
#else
#define ONYX_SIMD_MATH_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstdint>
#include <cstring>

HWY_BEFORE_NAMESPACE();
namespace onyx::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
// Highway's SVE targets (sizeless vectors: no struct members, arrays or by-copy lambda captures).
#define ONYX_SIMD_SVE                                                              \
  (HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2 || HWY_TARGET == HWY_SVE_256 || \
   HWY_TARGET == HWY_SVE2_128)
using VF = hn::Vec<DF>;

// x's NaN lanes into y (the portable, NEON and SVE paths, whose Min / Max return the number beside
// a NaN; the x86 ones already propagate them).
template <class D, class V>
HWY_INLINE V KeepNaN(D, V x, V y) {
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_NEON || ONYX_SIMD_SVE
  return hn::IfThenElse(hn::IsNaN(x), x, y);
#else
  return y;
#endif
}

// The tail of an array, m = FirstN(d, count): LoadTail reads its count elements (zeros after
// them), StoreTail writes them, and neither touches memory past them. x86's masked loads and
// stores skip the lanes off the mask; NEON has none — Highway's MaskedLoad there reads the whole
// vector (past the array's end, which may fault at a page's edge) and its BlendedStore rewrites it
// (racing with a thread that writes just past the end) — so there the tail goes through a buffer.
template <class D, class M, typename T>
HWY_INLINE hn::Vec<D> LoadTail(M m, D d, const T* HWY_RESTRICT p) {
#if HWY_TARGET == HWY_NEON
  HWY_ALIGN T buf[hn::MaxLanes(D())] = {};
  std::memcpy(buf, p, hn::CountTrue(d, m) * sizeof(T));
  return hn::Load(d, buf);
#else
  return hn::MaskedLoad(m, d, p);
#endif
}

template <class D, class M, typename T>
HWY_INLINE void StoreTail(hn::Vec<D> v, M m, D d, T* HWY_RESTRICT p) {
#if HWY_TARGET == HWY_NEON
  HWY_ALIGN T buf[hn::MaxLanes(D())];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, hn::CountTrue(d, m) * sizeof(T));
#else
  hn::BlendedStore(v, m, d, p);
#endif
}

// e^(x - n·ln2), n an integer-valued vector near x / ln2: Cody-Waite reduction r = x - n·ln2 (ln2
// in two parts) and Cephes' degree-5 expf polynomial on |r| <= ln2/2.
template <class D, class V>
HWY_INLINE V ExpReduced(D d, V x, V n) {
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693359375f), x);
  r = hn::NegMulAdd(n, hn::Set(d, -2.12194440e-4f), r);
  V p = hn::Set(d, 1.9875691500e-4f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.3981999507e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 8.3334519073e-3f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.1665795894e-2f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.6666665459e-1f));
  p = hn::MulAdd(p, r, hn::Set(d, 5.0000001201e-1f));
  return hn::MulAdd(p, hn::Mul(r, r), hn::Add(r, hn::Set(d, 1.0f)));
}

// 2^n for an integer-valued n in [-127, 128], without a float -> int conversion (Highway's
// saturates, which costs a compare and a blend the clamped callers do not need): n + 127 + 2^23
// holds n + 127 in its low mantissa bits, and a shift by 23 moves them into the exponent field
// (the bits of 2^23 shift out).
template <class D, class V>
HWY_INLINE V Pow2(D d, V n) {
  const hn::RebindToUnsigned<D> du;
  const V biased = hn::Add(n, hn::Set(d, 8388608.0f + 127.0f));
  return hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(du, biased)));
}

// exp(x) for x <= 0 (softmax, cross-entropy, attention pass x - max), ≈ 1 ulp, one 2^n scale.
// Results below FLT_MIN (x < -87.3) are exactly 0, so exp(-inf) = 0; NaN stays NaN. Positive x is
// clamped to 88.37 (never reached by callers).
template <class D, class V>
HWY_INLINE V ExpNeg(D d, V x0) {
  const V lo = hn::Set(d, -87.33654475f);
  const auto tiny = hn::Lt(x0, lo);
  V x = hn::Min(hn::Set(d, 88.3762626647949f), hn::Max(lo, x0));
  V fx = hn::Floor(hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), hn::Set(d, 0.5f)));
  V y = hn::Mul(ExpReduced(d, x, fx), Pow2(d, fx));
  return KeepNaN(d, x0, hn::IfThenZeroElse(tiny, y));
}

// exp(x) over the whole range (the Exp op and the activations): n = round(x / ln2), 2^n applied
// in two halves so results down to the subnormal range stay right; +inf above 88.72; NaN passes.
template <class D, class V>
HWY_INLINE V Exp(D d, V x) {
  const V hi = hn::Set(d, 88.72283f), lo = hn::Set(d, -103.9721f);
  V xc = hn::Max(lo, hn::Min(hi, x));
  V n = hn::Round(hn::Mul(xc, hn::Set(d, 1.44269504088896341f)));
  V y = ExpReduced(d, xc, n);
  const V n1 = hn::Floor(hn::Mul(n, hn::Set(d, 0.5f)));  // n >> 1, exactly
  y = hn::Mul(hn::Mul(y, Pow2(d, n1)), Pow2(d, hn::Sub(n, n1)));
  return KeepNaN(d, x, hn::IfThenElse(hn::Gt(x, hi), hn::Set(d, HUGE_VALF), y));
}

template <class D, class V>
HWY_INLINE V Sigmoid(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, Exp(d, hn::Neg(x))));
}

// tanh: a [13/6] rational approximation for |x| < 0.625, 1 - 2/(exp(2|x|)+1) above.
template <class D, class V>
HWY_INLINE V Tanh(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V a = hn::Abs(x);
  const V x2 = hn::Mul(x, x);
  V p = hn::Set(d, -2.76076847742355e-16f);
  p = hn::MulAdd(p, x2, hn::Set(d, 2.00018790482477e-13f));
  p = hn::MulAdd(p, x2, hn::Set(d, -8.60467152213735e-11f));
  p = hn::MulAdd(p, x2, hn::Set(d, 5.12229709037114e-08f));
  p = hn::MulAdd(p, x2, hn::Set(d, 1.48572235717979e-05f));
  p = hn::MulAdd(p, x2, hn::Set(d, 6.37261928875436e-04f));
  p = hn::MulAdd(p, x2, hn::Set(d, 4.89352455891786e-03f));
  p = hn::Mul(p, x);
  V q = hn::Set(d, 1.19825839466702e-06f);
  q = hn::MulAdd(q, x2, hn::Set(d, 1.18534705686654e-04f));
  q = hn::MulAdd(q, x2, hn::Set(d, 2.26843463243900e-03f));
  q = hn::MulAdd(q, x2, hn::Set(d, 4.89352518554385e-03f));
  V small = hn::Div(p, q);
  small = hn::IfThenElse(hn::Lt(a, hn::Set(d, 4e-4f)), x, small);
  V e = Exp(d, hn::Add(a, a));
  V large = hn::Sub(one, hn::Div(hn::Set(d, 2.0f), hn::Add(e, one)));
  large = hn::CopySignToAbs(large, x);
  return hn::IfThenElse(hn::Ge(a, hn::Set(d, 0.625f)), large, small);
}

// erf: N. Juffa's faithfully rounded erff scheme — x + x*P(x^2) for |x| <= 0.9277 (the inner
// branch), 1 - exp(-|x| + |x|*Q(|x|)) above (the outer branch; max abs error ~6e-8).
constexpr float kErfOuter = 0.927734375f;

template <class D, class V>
HWY_INLINE V ErfInner(D d, V x) {
  const V s = hn::Mul(x, x);
  V q = hn::Set(d, -0x1.38e000p-11f);
  q = hn::MulAdd(q, s, hn::Set(d, 0x1.471a58p-8f));
  q = hn::MulAdd(q, s, hn::Set(d, -0x1.b691b2p-6f));
  q = hn::MulAdd(q, s, hn::Set(d, 0x1.ce1c44p-4f));
  q = hn::MulAdd(q, s, hn::Set(d, -0x1.812700p-2f));
  q = hn::MulAdd(q, s, hn::Set(d, 0x1.06eba8p-3f));
  return hn::MulAdd(q, x, x);
}

template <class D, class V>
HWY_INLINE V ErfOuter(D d, V x) {
  const V t = hn::Abs(x);
  const V s = hn::Mul(x, x);
  V r = hn::MulAdd(hn::Set(d, -0x1.220000p-16f), t, hn::Set(d, 0x1.91cfb2p-12f));
  V u = hn::MulAdd(hn::Set(d, -0x1.fd1438p-9f), t, hn::Set(d, 0x1.8d6342p-6f));
  r = hn::MulAdd(r, s, u);
  r = hn::MulAdd(r, t, hn::Set(d, -0x1.b55cb8p-4f));
  r = hn::MulAdd(r, t, hn::Set(d, -0x1.450aa0p-1f));
  r = hn::MulAdd(r, t, hn::Set(d, -0x1.079d0cp-3f));
  r = hn::MulSub(r, t, t);
  V large = hn::Sub(hn::Set(d, 1.0f), Exp(d, r));
  return hn::CopySignToAbs(large, x);
}

// Lanes taking the outer branch (false for NaN, which takes the inner one).
template <class D, class V>
HWY_INLINE hn::Mask<D> ErfOuterMask(D d, V x) {
  return hn::Gt(hn::Abs(x), hn::Set(d, kErfOuter));
}

// One vector: the outer branch only when a lane needs it.
template <class D, class V>
HWY_INLINE V Erf(D d, V x) {
  const auto outer = ErfOuterMask(d, x);
  const V small = ErfInner(d, x);
  if (hn::AllFalse(d, outer)) return small;
  return hn::IfThenElse(outer, ErfOuter(d, x), small);
}

HWY_INLINE float ReduceSum(DF d, VF v) { return hn::GetLane(hn::SumOfLanes(d, v)); }
HWY_INLINE float ReduceMax(DF d, VF v) { return hn::GetLane(hn::MaxOfLanes(d, v)); }
HWY_INLINE float ReduceMin(DF d, VF v) { return hn::GetLane(hn::MinOfLanes(d, v)); }

// The vector loop of the array kernels: body(ld, st) runs once per full vector of [0, n) and
// once for the tail, with ld(p) the vector at p + i (zero-filled past n in the tail) and st(v, p)
// storing v at p + i (only the lanes below n). One body gives the vector loop and its masked tail,
// so every element sees the same arithmetic; a body that accumulates must treat the tail's
// zero-filled lanes as contributing nothing (they load 0).
template <class F>
HWY_INLINE void ForEachVector(int64_t n, F body) {
  const DF d;
  const int64_t L = (int64_t)hn::Lanes(d);
  int64_t i = 0;
  for (; i + L <= n; i += L)
    body([d, i](const float* p) { return hn::LoadU(d, p + i); },
         [d, i](VF v, float* p) { hn::StoreU(v, d, p + i); });
  if (i < n) {
    const auto m = hn::FirstN(d, (size_t)(n - i));
    body([d, i, &m](const float* p) { return LoadTail(m, d, p + i); },
         [d, i, &m](VF v, float* p) { StoreTail(v, m, d, p + i); });
  }
}

// y[i] = f(x[i]) (x == y allowed), through ForEachVector.
template <class F>
HWY_INLINE void Map(const float* x, float* y, int64_t n, F f) {
  const DF d;
  ForEachVector(n, [&](auto ld, auto st) { st(f(d, ld(x)), y); });
}

}  // namespace onyx::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ONYX_SIMD_MATH_INL_H_
