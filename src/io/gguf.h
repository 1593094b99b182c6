// io/gguf.h — GGUF files (version 3), as llama.cpp reads them: a header, typed metadata
// key/values, tensor infos (name, dimensions innermost first, ggml type, offset), then the tensor
// data, each tensor aligned to general.alignment (32). The writer holds the metadata and tensors in
// order and writes the file atomically, the tensors' bytes where they lie (float32) or from their
// encoding; tensor data are F32, F16, BF16, Q8_0 (blocks of 32 int8 values with a float16 scale)
// or Q4_0 (blocks of 32 4-bit values with a float16 scale), rounded as ggml's reference
// quantize_row_q8_0 / quantize_row_q4_0 round.
//
// Hand-written: GGUF is llama.cpp's format, read and written by its C library (ggml, not packaged
// by Debian) and its Python package; onyx writes files without either.
#pragma once
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::io {

enum class GgmlType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, BF16 = 30 };
// "f32", "f16", "bf16", "q8_0", "q4_0" (an error naming `what` otherwise).
GgmlType parse_ggml_type(const std::string& name, const std::string& what);
const char* ggml_type_name(GgmlType t);
// general.file_type for a file whose matrices are `t` (llama.cpp's LLAMA_FTYPE_ALL_F32, ...).
uint32_t gguf_file_type(GgmlType t);

class GgufWriter {
 public:
  using Value = std::variant<uint32_t, int32_t, float, bool, std::string, std::vector<std::string>,
                             std::vector<int32_t>, std::vector<float>>;
  void set(const std::string& key, Value v);
  // A float32 tensor of `shape` (as PyTorch lists it), stored as `type`. Q8_0 and Q4_0 need the
  // innermost dimension to be a multiple of 32.
  void add_tensor(const std::string& name, const Tensor& t, GgmlType type);
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string key;
    Value value;
  };
  struct TensorEntry {
    std::string name;
    Shape shape;
    GgmlType type;
    Tensor source;     // float32: written as it lies
    std::string data;  // other types: the encoded bytes
  };
  std::vector<Entry> meta_;
  std::vector<TensorEntry> tensors_;
};

// The encodings (exposed for tests): IEEE half with rounding to nearest even; Q8_0 and Q4_0
// blocks.
uint16_t float_to_half(float f);
std::string encode_q8_0(const float* x, int64_t n);
std::string encode_q4_0(const float* x, int64_t n);
// Whether `t` is one of the block types (Q8_0, Q4_0: 32 values a block).
bool is_block_type(GgmlType t);

}  // namespace onyx::io
