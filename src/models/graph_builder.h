// models/graph_builder.h — emits an onyx graph layer by layer for the Hugging Face builders
// (bert.cc, gpt2.cc, vit.cc): nodes named after the Transformers module that owns them, weights as
// initializers under Transformers' parameter names, initialized from a deterministic RNG keyed on
// (seed, name), and the few layers every architecture shares (Linear, Conv1D, LayerNorm,
// Embedding, Dropout, activations, multi-head attention core).
//
// Shapes in comments: B batch, T sequence, C hidden, nh heads, hs head size, V vocabulary.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "quant/bnb_config.h"

namespace onyx::models {

// Attributes for GraphBuilder::op: Attr::of_int(-1), Attr::of_ints({0, 2, 1, 3}), ...
using Attr = ir::Attribute;

// How a parameter starts out (Transformers' _init_weights).
struct Init {
  enum Kind { Normal, TruncNormal, Zeros, Ones, Uniform };
  Kind kind = Zeros;
  double std = 0;
  int64_t zero_row = -1;  // Embedding padding_idx: this row is zero
  static Init normal(double std, int64_t zero_row = -1) { return {Normal, std, zero_row}; }
  static Init trunc_normal(double std) { return {TruncNormal, std, -1}; }  // cut at +-2 (absolute)
  static Init zeros() { return {Zeros, 0, -1}; }
  static Init ones() { return {Ones, 0, -1}; }
  static Init uniform(double bound) { return {Uniform, bound, -1}; }  // U(-bound, bound)
};

// Deterministic weights: the same (seed, name, shape, init) always gives the same values.
Tensor init_parameter(uint64_t seed, const std::string& name, const Shape& shape, const Init& init);

class GraphBuilder {
 public:
  GraphBuilder(std::string graph_name, uint64_t seed);

  ir::Graph& graph() { return g_; }
  // QLoRA: linear() stores the weights `q` quantizes in bitsandbytes' 4-bit format as it makes
  // them (quant/store_4bit.h), so no model is ever whole in float32.
  void set_quantization(std::optional<quant::BnbConfig> q) { quantize_ = std::move(q); }
  // LoRA's bf16 base (model_init_kwargs.dtype bfloat16): linear() stores each weight it does not
  // quantize as bf16 as it makes it, read through a Cast (ir/bf16_storage.h), as
  // models::store_frozen_weights_bf16 would after the build.
  void set_bf16_linears(bool on) { bf16_linears_ = on; }
  ir::Graph take() { return std::move(g_); }
  // Node names are "<scope>/<Op>_<n>": the Transformers module path that owns the node.
  void set_scope(const std::string& scope) { scope_ = scope; }

  // ---- graph interface ----
  std::string input(const std::string& name, DType dtype, const Shape& shape,
                    const std::vector<std::string>& dim_params);
  void output(const std::string& name, DType dtype, const Shape& shape);
  std::string param(const std::string& name, const Shape& shape, const Init& init);

  // ---- nodes ----
  // One node with one output; `out` names the output (else a fresh name).
  std::string op(const std::string& type, const std::vector<std::string>& inputs,
                 std::map<std::string, ir::Attribute> attrs = {}, const std::string& out = "");
  std::vector<std::string> op_n(const std::string& type, const std::vector<std::string>& inputs,
                                std::map<std::string, ir::Attribute> attrs, int num_outputs);
  // Constant nodes (deduplicated by value).
  std::string const_i64(const std::vector<int64_t>& v);  // 1-D int64
  std::string scalar_i64(int64_t v);                     // 0-D int64
  std::string scalar_f32(float v);                       // 0-D float32
  std::string scalar_bool(bool v);                       // 0-D bool
  std::string const_tensor(const Tensor& t);

  // ---- layers (Transformers modules) ----
  // nn.Linear: y = x W^T + b, W (out, in) named "<name>.weight", b "<name>.bias".
  std::string linear(const std::string& x, const std::string& name, int64_t in, int64_t out,
                     const Init& w_init, bool bias = true, const std::string& out_name = "");
  // GPT-2 Conv1D: y = x W + b, W (in, out).
  std::string conv1d(const std::string& x, const std::string& name, int64_t in, int64_t out,
                     const Init& w_init);
  // nn.LayerNorm over the last axis: "<name>.weight" (ones), "<name>.bias" (zeros).
  std::string layer_norm(const std::string& x, const std::string& name, int64_t dim, double eps);
  // LlamaRMSNorm / T5LayerNorm: x * rsqrt(mean(x^2, -1) + eps) * "<name>.weight" (ones).
  std::string rms_norm(const std::string& x, const std::string& name, int64_t dim, double eps);
  // nn.Embedding lookup: table (rows, dim) named "<name>.weight"; returns (ids..., dim).
  std::string embedding(const std::string& ids, const std::string& name, int64_t rows, int64_t dim,
                        double init_std, int64_t padding_idx = -1);
  // nn.Dropout: a Dropout node (training_mode on) when p > 0, else x itself.
  std::string dropout(const std::string& x, double p);
  // ACT2FN[act]: gelu (erf), gelu_new / gelu_pytorch_tanh / gelu_fast (tanh), relu, silu,
  // quick_gelu (x * sigmoid(1.702 x)).
  std::string activation(const std::string& x, const std::string& act);

  // ---- attention pieces ----
  // (B,T,C) -> (B,nh,T,hs)
  std::string split_heads(const std::string& x, int64_t nh, int64_t hs);
  // (B,T,C) -> (B,nh,hs,T): keys, already transposed for q @ k^T
  std::string split_heads_transposed(const std::string& x, int64_t nh, int64_t hs);
  // (B,nh,T,hs) -> (B,T,C)
  std::string merge_heads(const std::string& x, int64_t c);

  // table (rows, ...) gathered at ids (...) -> (ids..., ...)
  std::string gather_rows(const std::string& table, const std::string& ids);
  // gather_rows with nn.Embedding(padding_idx)'s gradient: positions holding `padding_idx` read
  // the row but send it no gradient (onyx.StopGradient there). ids (B,T) -> (B,T,C)
  std::string gather_rows_padded(const std::string& table, const std::string& ids,
                                 int64_t padding_idx);
  // The first n rows of table, n = like.shape[axis] (folds at plan time): positions 0..T-1.
  std::string leading_rows(const std::string& table, const std::string& like, int64_t axis);
  // [dim] of x's shape as a 1-D int64 (folds at plan time).
  std::string dim_of(const std::string& x, int64_t dim);

 private:
  std::string fresh(const std::string& base);
  ir::Graph g_;
  uint64_t seed_;
  std::optional<quant::BnbConfig> quantize_;
  bool bf16_linears_ = false;
  std::string scope_;
  std::map<std::string, int> counters_;
  std::map<std::string, std::string> constants_;  // value key -> output name
};

// Transformers' additive attention mask: torch.finfo(float32).min.
constexpr float kMaskValue = -3.4028234663852886e38f;

}  // namespace onyx::models
