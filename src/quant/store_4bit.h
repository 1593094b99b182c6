// quant/store_4bit.h — a linear weight stored 4-bit in a graph, as Transformers stores it in a
// 4-bit Hugging Face folder: initializer W becomes the packed codes (uint8, (numel + 1) / 2 x 1)
// under the same name, with W.absmax (float32 per block, or uint8 codes under double
// quantization), W.nested_absmax and W.nested_quant_map (double quantization) and W.quant_map
// beside it, read through one onyx.Dequantize4Bit node (inserted first) whose float32 output
// `W/float32` replaces W in every consumer. passes/quant4_weight_fusion.cc then lets the linear
// layers' GEMMs read the 4-bit tensors themselves (onyx.MatMul4Bit), so no float32 copy of the
// weight is made.
//
//   onyx.Dequantize4Bit(W, W.absmax, [W.nested_absmax, W.nested_quant_map]) -> W/float32
//     attrs: quant_type ("nf4" | "fp4"), blocksize, shape (the quantized matrix's), under double
//            quantization nested_blocksize and offset; compute_dtype (BitsAndBytesConfig's
//            bnb_4bit_compute_dtype: "float32" | "bfloat16", for the GEMMs that read it);
//            transpose (default 0): 1 for a Conv1D weight (GPT-2's (in, out) layout), which
//            Transformers quantizes transposed, as nn.Linear's (out, in): the quantized matrix
//            has shape (out, in) and the output is its transpose, the model's (in, out) weight
#pragma once
#include <map>
#include <string>

#include "ir/graph.h"
#include "quant/bnb4.h"
#include "quant/bnb_config.h"

namespace onyx::quant {

// The float32 tensor `w` quantized as BitsAndBytesConfig `c` says (type, blocksize, double
// quantization); errors name `what`.
Quant4 quantize_4bit(const Tensor& w, const BnbConfig& c, const std::string& what);
// Float32 initializer `name` quantized as `c` says and stored 4-bit (store_initializer_4bit with
// c's compute dtype); `conv1d`: a Conv1D weight, quantized transposed as Transformers does.
// Errors name `what`.
void quantize_initializer_4bit(ir::Graph& g, const std::string& name, const BnbConfig& c,
                               const std::string& what, bool conv1d = false);

// Replaces float32 initializer `name` by the 4-bit state `q` (quantized from it, or from its
// transpose when `conv1d`) as above.
void store_initializer_4bit(ir::Graph& g, const std::string& name, const Quant4& q,
                            const std::string& compute_dtype = "float32", bool conv1d = false);

// The 2-D float32 tensor `w` transposed (a Conv1D weight as nn.Linear's layout and back).
Tensor transposed_2d(const Tensor& w);

// The tensors of `q` by their Hugging Face names (W, W.absmax, W.quant_map, W.nested_absmax,
// W.nested_quant_map, W.quant_state.bitsandbytes__<type>), for a 4-bit folder.
std::map<std::string, Tensor> hf_tensors_4bit(const std::string& name, const Quant4& q);

// The format the attributes of an onyx.Dequantize4Bit or onyx.MatMul4Bit node describe: a Quant4
// header (type, blocksize, shape, nested_blocksize, offset; no data, `nested` left false).
Quant4 quant_header(const ir::Node& n);
// A view of a weight in format `h` over its tensors: absmax float32 per block, or uint8 codes with
// nested_absmax and nested_map (double quantization).
Quant4View quant_view(const Quant4& h, const Tensor& packed, const Tensor& absmax,
                      const Tensor* nested_absmax, const Tensor* nested_map);

// Replaces the 4-bit state of `name`, already stored 4-bit in `g`, by `q` (the same format: type,
// shape, blocksize, nesting): its tensors and its Dequantize4Bit's offset.
void replace_4bit_state(ir::Graph& g, const std::string& name, const Quant4& q);

// The tensors a 4-bit folder holds beside the graph's own for each weight stored 4-bit in `g`
// (read off its Dequantize4Bit node): W.quant_map and W.quant_state.bitsandbytes__<type>.
std::map<std::string, Tensor> hf_state_tensors(const ir::Graph& g);

// Every weight of `g` stored 4-bit back in float32 (bitsandbytes' dequantization): its
// Dequantize4Bit and absmax tensors removed, its readers reading W again. For exports (merged
// adapters, ONNX, GGUF).
void restore_float_weights(ir::Graph& g);

// Reads the 4-bit state of weight `name` from a 4-bit folder's tensors (hf_tensors_4bit's
// names): shapes, dtypes, the quant_map against the type's table and the quant_state are
// checked, errors naming `what` and the tensor.
Quant4 read_hf_4bit(const std::map<std::string, Tensor>& tensors, const std::string& name,
                    const std::string& what);

// Whether `g` holds weights stored 4-bit (an onyx.Dequantize4Bit node reads them).
bool holds_4bit_weights(const ir::Graph& g);

// Whether a folder's tensors hold `name` 4-bit (its quant_state tensor is there).
bool is_hf_4bit(const std::map<std::string, Tensor>& tensors, const std::string& name);

}  // namespace onyx::quant
