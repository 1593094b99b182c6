// onyx/dtype.h — element types, numbered as ONNX's TensorProto.DataType so conversion is the
// identity. float16 / bfloat16 are storage types: kernels convert to float for math.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace onyx {

enum class DType : int32_t {
  Undefined = 0,
  Float32 = 1,
  UInt8 = 2,
  Int8 = 3,
  UInt16 = 4,
  Int16 = 5,
  Int32 = 6,
  Int64 = 7,
  String = 8,
  Bool = 9,
  Float16 = 10,
  Float64 = 11,
  UInt32 = 12,
  UInt64 = 13,
  BFloat16 = 16,
};

size_t dtype_size(DType t);                   // bytes per element; throws for Undefined/String
const char* dtype_name(DType t);              // "float32", "int64", ...
const char* safetensors_dtype_name(DType t);  // "F32", "I64", ... ; throws if none
DType dtype_from_safetensors(const std::string& s);  // throws onyx::Error on unknown
bool is_float(DType t);                              // float16, bfloat16, float32, float64
bool is_integer(DType t);                            // signed or unsigned ints (not bool)
bool is_valid_onnx_dtype(int32_t code);

// IEEE half and bfloat16 as raw bits, with conversions (round to nearest even).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t f;
  if (exp == 0) {
    if (mant == 0) {
      f = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        exp--;
      }
      mant &= 0x3ff;
      f = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    f = sign | 0x7f800000u | (mant << 13);
  } else {
    f = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

inline uint16_t float_to_half(float v) {
  uint32_t f;
  std::memcpy(&f, &v, 4);
  uint32_t sign = (f >> 16) & 0x8000;
  uint32_t absf = f & 0x7fffffff;
  if (absf >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (absf > 0x7f800000u ? 0x200 : 0));
  if (absf >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // overflow -> inf
  if (absf < 0x38800000u) {                                   // subnormal or zero in half
    if (absf < 0x33000000u) return (uint16_t)sign;
    uint32_t e = absf >> 23;
    uint32_t m = (absf & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t half_m = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1))) half_m++;
    return (uint16_t)(sign | half_m);
  }
  uint32_t h = ((absf - 0x38000000u) >> 13);
  uint32_t rem = absf & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

inline float bf16_to_float(uint16_t b) {
  uint32_t f = (uint32_t)b << 16;
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

inline uint16_t float_to_bf16(float v) {
  uint32_t f;
  std::memcpy(&f, &v, 4);
  if ((f & 0x7fffffff) > 0x7f800000u) return (uint16_t)((f >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fff + ((f >> 16) & 1);
  return (uint16_t)((f + rounding) >> 16);
}

}  // namespace onyx
