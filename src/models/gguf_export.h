// models/gguf_export.h — a Llama-family model (llama, mistral: llama.cpp's "llama" architecture;
// qwen2) as a GGUF file for llama.cpp, with what llama.cpp's convert_hf_to_gguf.py writes: the
// tensors under llama.cpp's names (token_embd, blk.N.attn_q, ..., output), the query and key
// projections of "llama" permuted to its rotary layout, norms and other 1-D tensors float32 and the
// matrices in the chosen type (a Q8_0 or Q4_0 matrix whose rows are not whole blocks falls back to
// F16, as the converter does; under Q4_0 the output head is Q8_0, where llama-quantize would write
// the k-quant Q6_K), Llama 3's rope_freqs; the hyperparameters (general.architecture, context
// length, embedding length, block count, head counts, rope base and scaling, RMS epsilon) and
// the tokenizer of tokenizer.json (tokenizer.ggml.model "gpt2" for byte-level BPE with its merges
// and pre-tokenizer name, "llama" for SentencePiece-style BPE with byte fallback; tokens, types,
// special ids, add_bos, chat template).
#pragma once
#include <map>
#include <string>

#include "io/gguf.h"
#include "models/hf_model.h"

namespace onyx::models {

struct GgufExportOptions {
  io::GgmlType type = io::GgmlType::F16;  // the matrices' type
  std::string name;                       // general.name (default: the folder's name)
};

// `weights`: float32 by Transformers name (merged adapters, dequantized base); `tokenizer_dir`:
// the folder with tokenizer.json (and tokenizer_config.json, config.json's special ids).
// Unsupported architectures, rope scalings and tokenizers are errors naming them; the file is
// written atomically. Returns the number of tensors written.
int write_gguf(const HfConfig& config, const std::map<std::string, Tensor>& weights,
               const std::string& tokenizer_dir, const std::string& path,
               const GgufExportOptions& opts);

}  // namespace onyx::models
