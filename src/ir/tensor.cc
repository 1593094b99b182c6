// tensor.cc — Tensor storage, views and dtype tables.
#include "onyx/tensor.h"

#include <cstdlib>
#include <sstream>

#include "onyx/error.h"

namespace onyx {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))  // [2^32, 2^32] would wrap to 0 elements
      throw Error(cat("shape ", shape_str(s), " has more elements than 64 bits count"));
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); i++) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32:
    case DType::Int32:
    case DType::UInt32:
      return 4;
    case DType::UInt8:
    case DType::Int8:
    case DType::Bool:
      return 1;
    case DType::UInt16:
    case DType::Int16:
    case DType::Float16:
    case DType::BFloat16:
      return 2;
    case DType::Int64:
    case DType::Float64:
    case DType::UInt64:
      return 8;
    default:
      throw Error(cat("dtype ", dtype_name(t), " has no fixed element size"));
  }
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Undefined:
      return "undefined";
    case DType::Float32:
      return "float32";
    case DType::UInt8:
      return "uint8";
    case DType::Int8:
      return "int8";
    case DType::UInt16:
      return "uint16";
    case DType::Int16:
      return "int16";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::String:
      return "string";
    case DType::Bool:
      return "bool";
    case DType::Float16:
      return "float16";
    case DType::Float64:
      return "float64";
    case DType::UInt32:
      return "uint32";
    case DType::UInt64:
      return "uint64";
    case DType::BFloat16:
      return "bfloat16";
  }
  return "unknown";
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "F32";
    case DType::Float16:
      return "F16";
    case DType::BFloat16:
      return "BF16";
    case DType::Float64:
      return "F64";
    case DType::Int64:
      return "I64";
    case DType::Int32:
      return "I32";
    case DType::Int16:
      return "I16";
    case DType::Int8:
      return "I8";
    case DType::UInt8:
      return "U8";
    case DType::UInt16:
      return "U16";
    case DType::UInt32:
      return "U32";
    case DType::UInt64:
      return "U64";
    case DType::Bool:
      return "BOOL";
    default:
      throw Error(cat("dtype ", dtype_name(t), " cannot be stored in safetensors"));
  }
}

DType dtype_from_safetensors(const std::string& s) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::Float32}, {"F16", DType::Float16}, {"BF16", DType::BFloat16},
      {"F64", DType::Float64}, {"I64", DType::Int64},   {"I32", DType::Int32},
      {"I16", DType::Int16},   {"I8", DType::Int8},     {"U8", DType::UInt8},
      {"U16", DType::UInt16},  {"U32", DType::UInt32},  {"U64", DType::UInt64},
      {"BOOL", DType::Bool}};
  for (auto& [name, t] : table)
    if (s == name) return t;
  throw Error(cat("unknown safetensors dtype '", s, "'"));
}

bool is_float(DType t) {
  return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64;
}

bool is_integer(DType t) {
  switch (t) {
    case DType::UInt8:
    case DType::Int8:
    case DType::UInt16:
    case DType::Int16:
    case DType::Int32:
    case DType::Int64:
    case DType::UInt32:
    case DType::UInt64:
      return true;
    default:
      return false;
  }
}

bool is_valid_onnx_dtype(int32_t c) { return (c >= 1 && c <= 13) || c == 16; }

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_) ONYX_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape_));
  size_t bytes = nbytes();
  size_t alloc = ((bytes + 63) / 64) * 64;
  if (alloc == 0) alloc = 64;
  void* p = std::aligned_alloc(64, alloc);
  ONYX_CHECK(p != nullptr, "out of memory allocating ", bytes, " bytes for tensor ",
             shape_str(shape_));
  storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  data_ = p;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner,
                    Device device) {
  Tensor t;
  t.device_ = device;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::move(owner);
  t.data_ = data;
  return t;
}

Tensor Tensor::scalar_f32(float v) {
  Tensor t(DType::Float32, {});
  *t.data<float>() = v;
  return t;
}

Tensor Tensor::scalar_i64(int64_t v) {
  Tensor t(DType::Int64, {});
  *t.data<int64_t>() = v;
  return t;
}

size_t Tensor::nbytes() const {
  if (dtype_ == DType::Undefined) return 0;
  return (size_t)numel() * dtype_size(dtype_);
}

Tensor Tensor::reshaped(Shape shape) const {
  ONYX_CHECK(shape_numel(shape) == numel(), "cannot view ", shape_str(shape_), " as ",
             shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reinterpreted(DType dtype) const {
  ONYX_CHECK(dtype_size(dtype) == dtype_size(dtype_), "cannot reinterpret ", dtype_name(dtype_),
             " as ", dtype_name(dtype));
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

// Element access from the host: a tensor on another device must be copied to the host first.
static void check_on_host(const Tensor& t, const char* what) {
  ONYX_CHECK(t.device() == Device::Cpu, what, ": the tensor ", shape_str(t.shape()), " is on ",
             device_name(t.device()), "; copy it to the host first");
}

Tensor Tensor::clone() const {
  check_on_host(*this, "clone");
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.raw(), data_, nbytes());
  return t;
}

// Element i of a host tensor as double (the callers check the device once).
static double host_element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::Float32:
      return t.data<float>()[i];
    case DType::Float64:
      return t.data<double>()[i];
    case DType::Float16:
      return half_to_float(t.data<uint16_t>()[i]);
    case DType::BFloat16:
      return bf16_to_float(t.data<uint16_t>()[i]);
    case DType::Int64:
      return (double)t.data<int64_t>()[i];
    case DType::Int32:
      return t.data<int32_t>()[i];
    case DType::Int16:
      return t.data<int16_t>()[i];
    case DType::Int8:
      return t.data<int8_t>()[i];
    case DType::UInt8:
      return t.data<uint8_t>()[i];
    case DType::UInt16:
      return t.data<uint16_t>()[i];
    case DType::UInt32:
      return t.data<uint32_t>()[i];
    case DType::UInt64:
      return (double)t.data<uint64_t>()[i];
    case DType::Bool:
      return t.data<uint8_t>()[i] ? 1.0 : 0.0;
    default:
      throw Error(cat("cannot read elements of dtype ", dtype_name(t.dtype())));
  }
}

double Tensor::get_as_double(int64_t i) const {
  check_on_host(*this, "reading an element");
  return host_element(*this, i);
}

std::vector<double> Tensor::to_double_vector() const {
  check_on_host(*this, "to_double_vector");
  std::vector<double> out((size_t)numel());
  for (int64_t i = 0; i < numel(); i++) out[i] = host_element(*this, i);
  return out;
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  check_on_host(*this, "to_int64_vector");
  std::vector<int64_t> out((size_t)numel());
  if (dtype_ == DType::Int64) {
    if (numel()) std::memcpy(out.data(), data_, nbytes());
    return out;
  }
  ONYX_CHECK(is_integer(dtype_) || dtype_ == DType::Bool, "expected an integer tensor, got ",
             dtype_name(dtype_));
  for (int64_t i = 0; i < numel(); i++) out[i] = (int64_t)host_element(*this, i);
  return out;
}

}  // namespace onyx
