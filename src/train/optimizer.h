// train/optimizer.h — optimizers that step over flat buffers (DESIGN decision 3).
//
// Parameters, gradients and optimizer moments share one FlatLayout, so an optimizer step is one
// pass over a few contiguous buffers ("adamw_fused", "sgd"). "adamw" is the same math written per
// tensor in plain scalar code: the reference the fused step is tested against and benchmarked
// against (bench/bench_adamw.cc).
//
// Numerics follow PyTorch 1.13's float32 CPU kernels operation by operation (torch.optim.AdamW
// and torch.optim.SGD), including where torch fuses a multiply-add and where it does not: on this
// machine a 30-step run gives the same float32 bits as Debian's torch 1.13. Optimizer state is a
// map of named tensors ("exp_avg", "exp_avg_sq", "momentum_buffer", "step"), so checkpoints are
// safetensors, not pickles.
//
// Determinism (DESIGN decision 10): every element update is independent of the partition, and the
// only reduction here (global_grad_norm) sums fixed chunks in a fixed order, so results are bit
// for bit the same for any thread count.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "onyx/tensor.h"
#include "train/flat_buffer.h"

namespace onyx::train {

struct OptimizerConfig {
  std::string name = "adamw_fused";  // see optimizer_names()
  double lr = 1e-3;  // base learning rate (a schedule scales it; step() takes the current value)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;  // AdamW
  double momentum = 0;                                              // SGD
  bool nesterov = false;                                            // SGD; needs momentum > 0
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const std::string& name() const = 0;

  // One update of `params` from `grads` at learning rate `lr`; both buffers must have the layout
  // the optimizer was made for. Increments step_count.
  virtual void step(FlatBuffer& params, const FlatBuffer& grads, double lr) = 0;

  // Named state tensors: flat [numel] float32 moment buffers plus "step", an int64 scalar.
  // The moment tensors are live views of the optimizer's buffers (no copy, so writing a
  // checkpoint of a large model costs no extra memory): write them out before the next step(),
  // or clone() them to keep a snapshot.
  virtual std::map<std::string, Tensor> state() const = 0;

  // Restores state() output (copies the data). Checks every key before changing anything:
  // a missing, unexpected, wrongly typed or wrongly shaped entry throws onyx::Error naming the key.
  virtual void load_state(const std::map<std::string, Tensor>& state) = 0;

  int64_t step_count = 0;  // steps taken; torch's state["step"]
};

// Valid OptimizerConfig::name values: "adamw_fused", "adamw", "sgd".
const std::vector<std::string>& optimizer_names();

// decay_mask has one entry per layout entry (true: apply weight decay to that tensor); an empty
// mask means "decay everything". Throws onyx::Error for an unknown name (listing the valid ones)
// or an invalid hyperparameter, onyx::Unsupported for a non-float32 layout.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const FlatLayout& layout,
                                          const std::vector<bool>& decay_mask);

// Hugging Face's weight-decay rule, by name: no decay for tensors whose name contains "bias" or
// names a normalization layer ("LayerNorm", "layer_norm", "layernorm", "ln_", "norm"; any case).
// generic_onnx (a model whose names need not follow HF conventions): also no decay for any tensor
// of rank <= 1 (biases, norm scales, scalars). Returns one flag per layout entry, true = decay.
std::vector<bool> hf_decay_mask(const FlatLayout& layout, bool generic_onnx);

// sqrt(sum of squares) over the whole buffer, accumulated in double over fixed 64K-element
// chunks summed in order: threaded, and the same bits for any thread count.
double global_grad_norm(const FlatBuffer& grads);
// buffer *= factor (e.g. gradient clipping, loss-scale removal).
void scale(FlatBuffer& buffer, float factor);
// False if any element is NaN or infinite.
bool all_finite(const FlatBuffer& buffer);

}  // namespace onyx::train
