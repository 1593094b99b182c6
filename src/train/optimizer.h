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
// only reduction here (global_grad_norm) is exact (SquareSum), so results are bit for bit the
// same for any thread count, and for a buffer sharded across ranks (ZeRO).
#pragma once
#include <array>
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
  // the optimizer was made for. Increments step_count. `bf16_shadow` (mixed precision), a
  // bfloat16 buffer of the same entries, receives every updated element rounded as the GEMMs
  // round their operands (kernels::f32_to_bf16), [range_begin, range_end) only: the fused AdamW
  // writes it in its update pass, while each block is in cache; the others after their update.
  // `grad_scale` (only where scales_gradients()): the update reads grads * grad_scale, rounded
  // as scale(grads, grad_scale) would store it — gradient clipping without a pass of its own
  // over the gradients (grads itself is left as it is); the others throw unless it is 1.
  virtual void step(FlatBuffer& params, const FlatBuffer& grads, double lr,
                    FlatBuffer* bf16_shadow = nullptr, float grad_scale = 1.0f) = 0;
  virtual bool scales_gradients() const { return false; }

  // Named state tensors: flat [numel] float32 moment buffers plus "step", an int64 scalar.
  // The moment tensors are live views of the optimizer's buffers (no copy, so writing a
  // checkpoint of a large model costs no extra memory): write them out before the next step(),
  // or clone() them to keep a snapshot.
  virtual std::map<std::string, Tensor> state() const = 0;

  // Restores state() output (copies the data). Checks every key before changing anything:
  // a missing, unexpected, wrongly typed or wrongly shaped entry throws onyx::Error naming the key.
  virtual void load_state(const std::map<std::string, Tensor>& state) = 0;

  int64_t step_count = 0;  // steps taken; torch's state["step"]
  // The elements of the flat buffers this optimizer updates and holds state for: the whole
  // buffer, or one rank's shard under ZeRO (dist::Partition). State tensors have end - begin
  // elements; element i of a state tensor is element begin + i of the buffers.
  int64_t range_begin = 0, range_end = 0;
};

// Valid OptimizerConfig::name values: "adamw_fused", "adamw", "sgd".
const std::vector<std::string>& optimizer_names();

// decay_mask has one entry per layout entry (true: apply weight decay to that tensor); an empty
// mask means "decay everything". Throws onyx::Error for an unknown name (listing the valid ones)
// or an invalid hyperparameter, onyx::Unsupported for a non-float32 layout.
// [begin, end) restricts the optimizer to those elements (end < 0: the whole buffer).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const FlatLayout& layout,
                                          const std::vector<bool>& decay_mask, int64_t begin = 0,
                                          int64_t end = -1);

// Hugging Face's weight-decay rule, by name: no decay for tensors whose name contains "bias" or
// names a normalization layer ("LayerNorm", "layer_norm", "layernorm", "ln_", "norm"; any case).
// generic_onnx (a model whose names need not follow HF conventions): also no decay for any tensor
// of rank <= 1 (biases, norm scales, scalars). Returns one flag per layout entry, true = decay.
std::vector<bool> hf_decay_mask(const FlatLayout& layout, bool generic_onnx);

// The exact sum of non-negative doubles (a fixed-point accumulator over the whole double range,
// rounded once by value()), so partial sums can be merged in any order, across threads or
// ranks, with the same result: the gradient norm of a sharded buffer (ZeRO) has the same bits as
// the whole buffer's, for any world size and thread count. Trivially copyable (all-gathered as
// bytes). Non-finite terms make the value inf / nan.
struct SquareSum {
  static constexpr int kLimbs = 70;  // 32-bit digits in 64-bit cells: 2^-1074 .. 2^1166
  std::array<uint64_t, kLimbs> limb{};
  double special = 0;   // the sum of the non-finite terms (0 when none)
  int64_t pending = 0;  // additions since the last carry normalization
  void add(double x);   // x >= 0
  void merge(const SquareSum& other);
  double value() const;

 private:
  void normalize();
};
// Sum of squares of grads[begin, end): each aligned 64-element block summed in double in a fixed
// order, the block sums added exactly. `begin` must be a multiple of 64.
SquareSum square_sum(const FlatBuffer& grads, int64_t begin = 0, int64_t end = -1);
// sqrt(square_sum(grads).value()): threaded, the same bits for any thread count and sharding.
double global_grad_norm(const FlatBuffer& grads);
// buffer[begin, end) *= factor (e.g. gradient clipping, loss-scale removal); end < 0: to the end.
void scale(FlatBuffer& buffer, float factor, int64_t begin = 0, int64_t end = -1);
// dst[begin, end) += src[begin, end) (buffers of one layout).
void add_into(FlatBuffer& dst, const FlatBuffer& src, int64_t begin = 0, int64_t end = -1);

}  // namespace onyx::train
