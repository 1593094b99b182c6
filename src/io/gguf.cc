// io/gguf.cc — see gguf.h.
#include "io/gguf.h"

#include <cmath>
#include <cstring>

#include "io/safetensors.h"
#include "onyx/error.h"

namespace onyx::io {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr uint64_t kAlignment = 32;

enum ValueType : uint32_t {
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
};

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_value(std::string& out, const GgufWriter::Value& v) {
  if (auto* p = std::get_if<uint32_t>(&v)) {
    put<uint32_t>(out, U32);
    put(out, *p);
  } else if (auto* p = std::get_if<int32_t>(&v)) {
    put<uint32_t>(out, I32);
    put(out, *p);
  } else if (auto* p = std::get_if<float>(&v)) {
    put<uint32_t>(out, F32);
    put(out, *p);
  } else if (auto* p = std::get_if<bool>(&v)) {
    put<uint32_t>(out, BOOL);
    put<uint8_t>(out, *p ? 1 : 0);
  } else if (auto* p = std::get_if<std::string>(&v)) {
    put<uint32_t>(out, STRING);
    put_string(out, *p);
  } else if (auto* p = std::get_if<std::vector<std::string>>(&v)) {
    put<uint32_t>(out, ARRAY);
    put<uint32_t>(out, STRING);
    put<uint64_t>(out, p->size());
    for (auto& s : *p) put_string(out, s);
  } else if (auto* p = std::get_if<std::vector<int32_t>>(&v)) {
    put<uint32_t>(out, ARRAY);
    put<uint32_t>(out, I32);
    put<uint64_t>(out, p->size());
    for (int32_t x : *p) put(out, x);
  } else if (auto* p = std::get_if<std::vector<float>>(&v)) {
    put<uint32_t>(out, ARRAY);
    put<uint32_t>(out, F32);
    put<uint64_t>(out, p->size());
    for (float x : *p) put(out, x);
  }
}

void pad(std::string& out) {
  while (out.size() % kAlignment) out.push_back('\0');
}

// ggml's roundf: half away from zero.
float round_away(float x) { return std::round(x); }

std::string encode(const float* x, int64_t n, GgmlType type) {
  std::string out;
  switch (type) {
    case GgmlType::F32:
      out.assign(reinterpret_cast<const char*>(x), n * sizeof(float));
      break;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; i++) put(out, float_to_half(x[i]));
      break;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        std::memcpy(&b, &x[i], 4);
        // round to nearest even (NaN kept quiet), as PyTorch's float32 -> bfloat16
        const uint16_t h = std::isnan(x[i]) ? (uint16_t)((b >> 16) | 0x40)
                                            : (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
        put(out, h);
      }
      break;
    case GgmlType::Q8_0:
      out = encode_q8_0(x, n);
      break;
    case GgmlType::Q4_0:
      out = encode_q4_0(x, n);
      break;
  }
  return out;
}

}  // namespace

GgmlType parse_ggml_type(const std::string& name, const std::string& what) {
  if (name == "f32") return GgmlType::F32;
  if (name == "f16") return GgmlType::F16;
  if (name == "bf16") return GgmlType::BF16;
  if (name == "q8_0") return GgmlType::Q8_0;
  if (name == "q4_0") return GgmlType::Q4_0;
  throw Error(
      cat(what, ": tensor type '", name, "' is not supported (f32, f16, bf16, q8_0, q4_0)"));
}

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return "f32";
    case GgmlType::F16:
      return "f16";
    case GgmlType::BF16:
      return "bf16";
    case GgmlType::Q8_0:
      return "q8_0";
    case GgmlType::Q4_0:
      return "q4_0";
  }
  return "?";
}

uint32_t gguf_file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 0;
    case GgmlType::F16:
      return 1;
    case GgmlType::Q8_0:
      return 7;
    case GgmlType::Q4_0:
      return 2;
    case GgmlType::BF16:
      return 32;
  }
  return 0;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) return (uint16_t)(sign | 0x7E00);   // NaN
  if (abs >= 0x477FF000) return (uint16_t)(sign | 0x7C00);  // rounds to infinity (or is one)
  if (abs < 0x38800000) {  // a half subnormal (or zero): round |f| * 2^24 to an integer, even ties
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact: a power of two
    uint32_t m = (uint32_t)scaled;
    const float rest = scaled - (float)m;
    if (rest > 0.5f || (rest == 0.5f && (m & 1))) m++;
    return (uint16_t)(sign | m);
  }
  // normal: drop 13 mantissa bits with round to nearest even; a carry moves into the exponent
  const uint32_t rebiased = abs - (112u << 23);
  const uint32_t h = (rebiased + 0xFFF + ((rebiased >> 13) & 1)) >> 13;
  return (uint16_t)(sign | h);
}

std::string encode_q8_0(const float* x, int64_t n) {
  ONYX_CHECK(n % 32 == 0, "Q8_0: ", n, " values are not whole blocks of 32");
  std::string out;
  for (int64_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(x[b + i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put(out, float_to_half(d));
    for (int i = 0; i < 32; i++) put<int8_t>(out, (int8_t)round_away(x[b + i] * id));
  }
  return out;
}

std::string encode_q4_0(const float* x, int64_t n) {
  ONYX_CHECK(n % 32 == 0, "Q4_0: ", n, " values are not whole blocks of 32");
  std::string out;
  for (int64_t b = 0; b < n; b += 32) {
    // the value of largest magnitude (the first of equals) maps to -8
    float amax = 0, max = 0;
    for (int i = 0; i < 32; i++)
      if (amax < std::fabs(x[b + i])) amax = std::fabs(x[b + i]), max = x[b + i];
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put(out, float_to_half(d));
    auto code = [&](int i) { return std::min(15, (int)(int8_t)(x[b + i] * id + 8.5f)); };
    // byte j: value j in the low nibble, value 16 + j in the high one
    for (int j = 0; j < 16; j++) put<uint8_t>(out, (uint8_t)(code(j) | (code(16 + j) << 4)));
  }
  return out;
}

bool is_block_type(GgmlType t) { return t == GgmlType::Q8_0 || t == GgmlType::Q4_0; }

void GgufWriter::set(const std::string& key, Value v) {
  for (auto& e : meta_)
    if (e.key == key) {
      e.value = std::move(v);
      return;
    }
  meta_.push_back({key, std::move(v)});
}

void GgufWriter::add_tensor(const std::string& name, const Tensor& t, GgmlType type) {
  ONYX_CHECK(t.dtype() == DType::Float32, "gguf: tensor '", name, "' must be float32");
  ONYX_CHECK(!is_block_type(type) || (!t.shape().empty() && t.shape().back() % 32 == 0),
             "gguf: tensor '", name, "' ", shape_str(t.shape()), ": ", ggml_type_name(type),
             " needs the last dimension to be a multiple of 32");
  // float32 data are written from the tensor itself; the others from their encoding
  tensors_.push_back(
      {name, t.shape(), type, t,
       type == GgmlType::F32 ? std::string() : encode(t.data<float>(), t.numel(), type)});
}

void GgufWriter::write(const std::string& path) const {
  std::string head;
  put(head, kMagic);
  put(head, kVersion);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, meta_.size());
  for (auto& e : meta_) {
    put_string(head, e.key);
    put_value(head, e.value);
  }
  uint64_t offset = 0;
  std::vector<std::pair<const void*, size_t>> data;
  static const char zeros[kAlignment] = {};
  for (auto& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, (uint32_t)t.shape.size());
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(head, (uint64_t)*it);
    put<uint32_t>(head, (uint32_t)t.type);
    put<uint64_t>(head, offset);
    const size_t n = t.type == GgmlType::F32 ? t.source.nbytes() : t.data.size();
    data.push_back({t.type == GgmlType::F32 ? t.source.raw() : (const void*)t.data.data(), n});
    const size_t padding = (kAlignment - n % kAlignment) % kAlignment;
    if (padding) data.push_back({zeros, padding});
    offset += n + padding;
  }
  pad(head);
  std::vector<std::pair<const void*, size_t>> chunks = {{head.data(), head.size()}};
  chunks.insert(chunks.end(), data.begin(), data.end());
  write_file_atomic(path, chunks);
}

}  // namespace onyx::io
