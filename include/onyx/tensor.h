// onyx/tensor.h — a dense, row-major tensor: dtype + shape + a pointer into shared storage.
// Tensors are cheap to copy (the storage is shared); views (reshape) share storage too.
// Storage is 64-byte aligned so vectorized kernels may use aligned loads on whole buffers.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "onyx/device.h"
#include "onyx/dtype.h"
#include "onyx/error.h"

namespace onyx {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

// dtype + shape, no data: what shape inference passes around.
struct TensorMeta {
  DType dtype = DType::Undefined;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
  int rank() const { return (int)shape.size(); }
  bool operator==(const TensorMeta& o) const { return dtype == o.dtype && shape == o.shape; }
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates uninitialized, 64-byte aligned storage.
  Tensor(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  // Wraps memory owned by `owner` (which keeps it alive); no copy. `device` says where it is.
  static Tensor wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner,
                     Device device = Device::Cpu);
  template <class T>
  static Tensor from_vector(DType dtype, Shape shape, const std::vector<T>& v) {
    Tensor t(dtype, std::move(shape));
    ONYX_CHECK(v.size() * sizeof(T) == t.nbytes(), "from_vector: size mismatch");
    if (t.nbytes()) std::memcpy(t.raw(), v.data(), t.nbytes());
    return t;
  }
  static Tensor scalar_f32(float v);
  static Tensor scalar_i64(int64_t v);

  bool defined() const { return dtype_ != DType::Undefined; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return (int)shape_.size(); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const;
  TensorMeta meta() const { return {dtype_, shape_}; }
  // Where the bytes are. Element access (clone, get_as_double, to_*_vector) needs Device::Cpu.
  Device device() const { return device_; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <class T>
  T* data() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }

  // A view with another shape of the same element count; shares storage.
  Tensor reshaped(Shape shape) const;
  // A view of the same bytes as another dtype of the same element size.
  Tensor reinterpreted(DType dtype) const;
  // A deep copy.
  Tensor clone() const;
  // Values as int64 (converting int32/uint8/bool/...), for shape-like inputs.
  std::vector<int64_t> to_int64_vector() const;
  // Values as double, for comparisons and printing.
  std::vector<double> to_double_vector() const;
  // Element i converted to double.
  double get_as_double(int64_t i) const;

 private:
  DType dtype_ = DType::Undefined;
  Shape shape_;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Device device_ = Device::Cpu;
};

}  // namespace onyx
