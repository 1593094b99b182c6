// quant/bnb4.cc — bitsandbytes' NF4 / FP4 blockwise quantization (see bnb4.h).
#include "quant/bnb4.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "onyx/error.h"

namespace onyx::quant {
namespace {

constexpr std::array<float, 16> kNf4 = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// FP4 (1 sign, 2 exponent bits with bias 2, 1 mantissa bit) in bit-pattern order, divided by 12.
std::array<float, 16> make_fp4() {
  const float raw[16] = {0,  0.0625f,  8.0f,  12.0f,  4.0f,  6.0f,  2.0f,  3.0f,
                         -0, -0.0625f, -8.0f, -12.0f, -4.0f, -6.0f, -2.0f, -3.0f};
  std::array<float, 16> t;
  for (int i = 0; i < 16; i++) t[i] = raw[i] / 12.0f;
  return t;
}

// torch.linspace(0.1, 1, n) in float32 as PyTorch's CPU kernel computes it: the first half
// start + step * i, the second end - step * (n - 1 - i), each rounded once.
std::vector<float> linspace_01_1(int n) {
  const float a = 0.1f, b = 1.0f, step = (b - a) / (float)(n - 1);
  std::vector<float> v(n);
  for (int i = 0; i < n; i++)
    v[i] = i < n / 2 ? std::fmaf(step, (float)i, a) : std::fmaf(-step, (float)(n - 1 - i), b);
  return v;
}

std::array<float, 256> make_dynamic_map() {
  // signed, 7 exponent bits, 8 bits: for exponent i the means of 2^i + 1 points in [0.1, 1],
  // times 10^(i - 6), with both signs; then 0 and 1; sorted.
  std::vector<float> data;
  for (int i = 0; i < 7; i++) {
    std::vector<float> b = linspace_01_1((1 << i) + 1);
    const float s = (float)std::pow(10.0, i - 6);
    for (size_t j = 0; j + 1 < b.size(); j++) {
      const float mean = (b[j] + b[j + 1]) / 2.0f;
      data.push_back(s * mean);
      data.push_back(-s * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  ONYX_CHECK(data.size() == 256, "dynamic map: ", data.size(), " values");
  std::sort(data.begin(), data.end());
  std::array<float, 256> m;
  std::copy(data.begin(), data.end(), m.begin());
  return m;
}

// The quantizer of a code table: bucket bounds between its sorted values, and each bucket's index
// into the table (a stable sort: FP4's 0 and -0 keep their order).
struct Buckets {
  std::vector<float> bounds;
  std::vector<uint8_t> index;

  template <size_t N>
  explicit Buckets(const std::array<float, N>& code) {
    std::vector<int> order(N);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return code[x] < code[y]; });
    for (size_t i = 0; i + 1 < N; i++)
      bounds.push_back((code[order[i]] + code[order[i + 1]]) / 2.0f);
    for (int o : order) index.push_back((uint8_t)o);
  }
  // torch.bucketize(x, bounds, right=False): the number of bounds strictly below x.
  uint8_t operator()(float x) const {
    return index[std::lower_bound(bounds.begin(), bounds.end(), x) - bounds.begin()];
  }
};

// Blockwise absmax scaling as bitsandbytes' reference quantizers do it: full blocks multiplied by
// the reciprocal of max(absmax, 1e-38), the last partial one divided by its (clamped) absmax;
// scaled values clamped to [-1, 1] and bucketed. Writes one index per element; returns absmax
// per block (a full block's unclamped, the partial block's clamped).
template <class Bucket>
std::vector<float> blockwise(const float* x, int64_t n, int64_t bs, const Bucket& bucket,
                             uint8_t* idx) {
  const int64_t full = n - n % bs;
  std::vector<float> absmax((n + bs - 1) / bs);
  const int64_t blocks = (int64_t)absmax.size();
#pragma omp parallel for schedule(static) if (n > (1 << 20))
  for (int64_t blk = 0; blk < blocks; blk++) {
    const int64_t b0 = blk * bs;
    const int64_t e = std::min(n, b0 + bs);
    float m = 0;
    for (int64_t i = b0; i < e; i++) m = std::max(m, std::fabs(x[i]));
    const float clamped = std::max(m, 1e-38f);
    const bool partial = b0 >= full;
    const float inv = 1.0f / clamped;
    for (int64_t i = b0; i < e; i++) {
      const float s = partial ? x[i] / clamped : x[i] * inv;
      idx[i] = bucket(std::clamp(s, -1.0f, 1.0f));
    }
    absmax[b0 / bs] = partial ? clamped : m;
  }
  return absmax;
}

void check_finite(const float* w, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; i++)
    ONYX_CHECK(std::isfinite(w[i]), what, ": value ", w[i], " at flat index ", i,
               " cannot be quantized (not finite)");
}

}  // namespace

Code4 parse_code4(const std::string& name, const std::string& what) {
  if (name == "nf4") return Code4::Nf4;
  if (name == "fp4") return Code4::Fp4;
  throw Error(cat(what, ": 4-bit quant type '", name, "' is not supported (nf4, fp4)"));
}

const char* code4_name(Code4 type) { return type == Code4::Nf4 ? "nf4" : "fp4"; }

const std::array<float, 16>& code4_table(Code4 type) {
  static const std::array<float, 16> fp4 = make_fp4();
  return type == Code4::Nf4 ? kNf4 : fp4;
}

const std::array<float, 256>& dynamic_map() {
  static const std::array<float, 256> m = make_dynamic_map();
  return m;
}

Blockwise8 quantize_blockwise8(const float* x, int64_t n, int64_t blocksize) {
  static const Buckets buckets(dynamic_map());
  Blockwise8 r;
  r.codes.resize(n);
  r.absmax = blockwise(x, n, blocksize, buckets, r.codes.data());
  return r;
}

Quant4 quantize_4bit(const float* w, const Shape& shape, Code4 type, int64_t blocksize,
                     bool double_quant, const std::string& what) {
  static const Buckets nf4(code4_table(Code4::Nf4)), fp4(code4_table(Code4::Fp4));
  ONYX_CHECK(blocksize >= 32 && blocksize <= 4096 && (blocksize & (blocksize - 1)) == 0, what,
             ": blocksize ", blocksize, " is not one of 32, 64, ..., 4096");
  Quant4 q;
  q.type = type;
  q.shape = shape;
  q.blocksize = blocksize;
  const int64_t n = q.numel();
  ONYX_CHECK(n > 0, what, ": an empty weight cannot be quantized");
  check_finite(w, n, what);
  std::vector<uint8_t> idx(n + 1, 0);
  const Buckets& bucket = type == Code4::Nf4 ? nf4 : fp4;
  q.absmax = blockwise(w, n, blocksize, bucket, idx.data());
  if (n % 2) idx[n] = bucket(0.0f);  // the pad element of an odd count
  q.packed.resize((n + 1) / 2);
  for (size_t i = 0; i < q.packed.size(); i++)
    q.packed[i] = (uint8_t)((idx[2 * i] << 4) | idx[2 * i + 1]);
  if (!double_quant) return q;
  // offset: the mean of the absmax values, summed in double and rounded once. bitsandbytes takes
  // PyTorch's float32 mean, whose summation order depends on the device, the vector width and the
  // thread count: the two can differ in the last place (and nested_absmax with them).
  double sum = 0;
  for (float a : q.absmax) sum += a;
  q.offset = (float)(sum / (double)q.absmax.size());
  std::vector<float> centered(q.absmax.size());
  for (size_t i = 0; i < centered.size(); i++) centered[i] = q.absmax[i] - q.offset;
  Blockwise8 b = quantize_blockwise8(centered.data(), (int64_t)centered.size(), q.nested_blocksize);
  q.nested = true;
  q.absmax_codes = std::move(b.codes);
  q.nested_absmax = std::move(b.absmax);
  q.absmax.clear();
  return q;
}

void Quant4View::dequantize(int64_t begin, int64_t count, float* out) const {
  int64_t e = begin;
  const int64_t end = begin + count;
  while (e < end) {
    const int64_t block = e / blocksize;
    const int64_t stop = std::min(end, (block + 1) * blocksize);
    const float s = scale(block);
    for (; e < stop; e++) {
      const uint8_t byte = packed[e >> 1];
      const int nib = (e & 1) ? (byte & 0xF) : (byte >> 4);
      *out++ = code[nib] * s;
    }
  }
}

Quant4View view_of(const Quant4& q) {
  Quant4View v;
  v.packed = q.packed.data();
  v.code = code4_table(q.type).data();
  v.blocksize = q.blocksize;
  if (q.nested) {
    v.absmax_codes = q.absmax_codes.data();
    v.nested_absmax = q.nested_absmax.data();
    v.nested_code = dynamic_map().data();
    v.offset = q.offset;
    v.nested_blocksize = q.nested_blocksize;
  } else {
    v.absmax = q.absmax.data();
  }
  return v;
}

std::string quant_state_json(const Quant4& q) {
  // As Transformers writes it: Python's json.dumps (", " and ": " separators, the shortest
  // round-trip repr of a float), keys quant_type, blocksize, dtype, shape, then the nested state.
  std::string shape;
  for (size_t i = 0; i < q.shape.size(); i++) shape += (i ? ", " : "") + std::to_string(q.shape[i]);
  std::string j = cat("{\"quant_type\": \"", code4_name(q.type), "\", \"blocksize\": ", q.blocksize,
                      ", \"dtype\": \"float32\", \"shape\": [", shape, "]");
  if (q.nested)
    j += cat(", \"nested_blocksize\": ", q.nested_blocksize,
             ", \"nested_dtype\": \"float32\", \"nested_offset\": ",
             nlohmann::json((double)q.offset).dump());
  return j + "}";
}

void read_quant_state_json(const std::string& json, Quant4& q, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  ONYX_CHECK(j.is_object(), what, ": the quant_state is not a JSON object");
  try {
    q.type = parse_code4(j.at("quant_type").get<std::string>(), what);
    q.blocksize = j.at("blocksize").get<int64_t>();
    q.shape = j.at("shape").get<Shape>();
    q.nested = j.contains("nested_blocksize");
    if (q.nested) {
      q.nested_blocksize = j.at("nested_blocksize").get<int64_t>();
      q.offset = j.at("nested_offset").get<float>();
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat(what, ": the quant_state lacks a field or has a wrong type (", e.what(), ")"));
  }
  ONYX_CHECK(q.blocksize > 0 && q.nested_blocksize > 0, what, ": non-positive blocksize");
  for (int64_t d : q.shape)
    ONYX_CHECK(d > 0, what, ": shape ", shape_str(q.shape), " is not valid");
}

}  // namespace onyx::quant
