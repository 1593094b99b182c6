// quant/bnb4.h — bitsandbytes' 4-bit weight formats (NF4 and FP4, blockwise absmax, optionally
// with the absmax values quantized again: "double quantization"), bit for bit as bitsandbytes
// 0.50's reference implementation writes them, and the same state Transformers saves in a
// 4-bit Hugging Face folder (weight, weight.absmax, weight.quant_map, weight.nested_absmax,
// weight.nested_quant_map, weight.quant_state.bitsandbytes__<type>).
//
// Quantization (bitsandbytes' quantize_4bit): the flattened weight in blocks of `blocksize` (64);
// per block absmax = max |x|; each value scaled by the absmax's reciprocal (a last partial block:
// divided by its absmax) and clamped to [-1, 1] becomes the index of the nearest code value
// (the midpoints between sorted code values as bucket bounds; a value on a bound takes the lower
// code); two indices per byte, the first in the high nibble. Double quantization
// (bnb_4bit_use_double_quant): offset = mean of the absmax values, and absmax - offset quantized
// blockwise to 8 bits (blocks of 256) over bitsandbytes' signed dynamic map. Dequantization:
// code[index] * absmax, with absmax = dynamic_map[code8] * nested_absmax + offset under double
// quantization (float32 arithmetic, no fused multiply-add: this file is built for baseline
// x86-64).
//
// Hand-written: the format is bitsandbytes' (a PyTorch extension; no C++ library implements it),
// and onyx needs it without Python. The code tables are bitsandbytes' published NF4 and FP4
// values; the dynamic map is computed by its published construction (create_dynamic_map), its
// float32 linspace rounded once (as PyTorch's CPU linspace computes it, with a fused
// multiply-add). tests/quant/test_bnb_reference.py checks every table and every code against
// bitsandbytes itself.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::quant {

enum class Code4 { Nf4, Fp4 };

// "nf4" / "fp4" (bnb_4bit_quant_type); anything else is an error naming `what`.
Code4 parse_code4(const std::string& name, const std::string& what);
const char* code4_name(Code4 type);
// The 16 code values in index order (bitsandbytes' get_4bit_type: NF4's normal quantiles; FP4's
// 1-sign, 2-exponent, 1-mantissa values divided by their largest, 12).
const std::array<float, 16>& code4_table(Code4 type);
// bitsandbytes' create_dynamic_map(signed=True): the 256 sorted values of its 8-bit dynamic type.
const std::array<float, 256>& dynamic_map();

// One quantized weight as bitsandbytes' QuantState holds it.
struct Quant4 {
  Code4 type = Code4::Nf4;
  Shape shape;  // the float weight's shape
  int64_t blocksize = 64;
  std::vector<uint8_t> packed;  // (numel + 1) / 2 bytes, the first index in the high nibble
  // Without double quantization: absmax per block. With it: absmax_codes (8-bit codes of absmax
  // - offset over dynamic_map()), nested_absmax per nested block, offset.
  std::vector<float> absmax;
  bool nested = false;
  std::vector<uint8_t> absmax_codes;
  std::vector<float> nested_absmax;
  float offset = 0;
  int64_t nested_blocksize = 256;

  int64_t numel() const { return shape_numel(shape); }
  int64_t blocks() const { return (numel() + blocksize - 1) / blocksize; }
};

// Quantizes `w` (shape elements, all finite: a NaN or infinity is an error naming `what`).
Quant4 quantize_4bit(const float* w, const Shape& shape, Code4 type, int64_t blocksize,
                     bool double_quant, const std::string& what);

// bitsandbytes' quantize_blockwise over the dynamic map (the double quantization's 8 bits).
struct Blockwise8 {
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
};
Blockwise8 quantize_blockwise8(const float* x, int64_t n, int64_t blocksize);

// What a kernel reads of a quantized weight: pointers into its tensors.
struct Quant4View {
  const uint8_t* packed = nullptr;
  const float* code = nullptr;  // 16 values
  int64_t blocksize = 64;
  const float* absmax = nullptr;          // per block, without double quantization
  const uint8_t* absmax_codes = nullptr;  // with it: the 8-bit codes, and
  const float* nested_absmax = nullptr;   //   their blocks' absmax,
  const float* nested_code = nullptr;     //   the 256-value map,
  float offset = 0;                       //   the mean added back
  int64_t nested_blocksize = 256;

  // The dequantized absmax of block b (as bitsandbytes' dequantize_4bit computes it).
  float scale(int64_t b) const {
    if (!absmax_codes) return absmax[b];
    const float a = nested_code[absmax_codes[b]] * nested_absmax[b / nested_blocksize];
    return a + offset;
  }
  // Elements [begin, begin + count) of the flattened weight, dequantized into out.
  void dequantize(int64_t begin, int64_t count, float* out) const;
};

Quant4View view_of(const Quant4& q);

// The quant_state JSON Transformers stores as weight.quant_state.bitsandbytes__<type> (its UTF-8
// bytes as a uint8 tensor), and its reading back (errors name `what`).
std::string quant_state_json(const Quant4& q);
void read_quant_state_json(const std::string& json, Quant4& q, const std::string& what);

}  // namespace onyx::quant
