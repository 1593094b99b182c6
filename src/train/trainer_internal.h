// train/trainer_internal.h — what the Trainer's source files share (trainer.cc: the loop;
// checkpoint.cc: state serialization and checkpoint I/O; evaluate.cc: evaluation and prediction):
// the definition of Trainer::Impl, the run's session, optimizer, schedule, progress display and
// the data position and loss accumulators that checkpoints save for exact resume. Not installed.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "data/dataset.h"
#include "dist/comm.h"
#include "generate/generate.h"
#include "onyx/trainer.h"
#include "train/data_parallel.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/training_session.h"

namespace onyx {

struct Trainer::Impl {
  std::unique_ptr<train::TrainingSession> ts;
  std::unique_ptr<train::Optimizer> opt;
  train::ScheduleConfig sched;
  train::MetricLrState metric_lr;  // reduce_lr_on_plateau / greedy state (scheduler.json)
  std::unique_ptr<train::Progress> progress;
  // Data position and accumulators (saved in checkpoints for exact resume).
  int64_t epoch = 0;          // current epoch index
  int64_t batches_done = 0;   // micro-batches consumed in the current epoch
  double loss_since_log = 0;  // sum of step losses since the last "loss" log
  int64_t steps_since_log = 0;
  double loss_total = 0;  // sum of all step losses (train_loss)
  // Model::logged_outputs: each micro-batch's value summed, and the count, since the last log
  // (TRL keeps its _metrics in memory only: not saved in checkpoints, as there)
  std::map<std::string, double> logged_sums;
  std::map<std::string, int64_t> logged_counts;
  double last_grad_norm = 0;
  int64_t skipped_steps = 0;
  uint64_t data_seed = 0;
  // This train() call's clock and counts (train_runtime, train_samples_per_second).
  std::chrono::steady_clock::time_point t_start;
  int64_t samples_seen = 0, steps_run = 0;
  std::vector<int64_t> train_lengths;  // group_by_length / batch_rebalance: each sample's length
  std::vector<bool> decay_mask;
  // Data parallelism (train/data_parallel.h); world size 1 without mpirun.
  dist::Comm* comm = nullptr;
  std::unique_ptr<train::DataParallel> dp;
  bool zero2 = false;
  // The second gradient buffer of gradient accumulation (micro-batches after a step's first),
  // made on first use.
  std::unique_ptr<train::FlatBuffer> scratch_buf;
  // predict_with_generate: the causal LM as a decoder with a KV cache (made on first use), fed
  // the Trainer's current weights; under bf16_full_eval / fp16_full_eval its rotary frequencies
  // are rounded as the evaluation graphs' are (`generator_rounding`: how it was made).
  std::unique_ptr<generate::Generator> generator;
  kernels::LowPrecision generator_rounding = kernels::LowPrecision::None;
  bool generator_shared = false;  // laid out as the training graph (Trainer::current_generator)
  // The model folder's generation_config.json (with config.json's eos), read with the generator:
  // Seq2SeqTrainer's model.generation_config, which the generation_* arguments override.
  generate::GenerationConfig generation_defaults;
  // Inside train(): evaluations then run as training left the model (bf16_full_eval applies to
  // evaluate() / predict() outside it, as Transformers' evaluation_loop has it).
  bool in_train = false;
  // GRPO with beta != 0: the starting trainable weights (the reference policy), kept once
  std::vector<float> grpo_reference;
  // The step-level API (trainer_steps.cc): its schedule set up, the train steps since the last
  // optimizer step, a learning rate the caller fixed.
  bool steps_begun = false;
  int64_t step_micro_batches = 0;
  std::optional<double> lr_override;
  // diffusers' EMAModel (Trainer::set_ema): its settings and shadow weights (params' layout).
  EmaConfig ema_config;
  std::unique_ptr<train::FlatBuffer> ema;
  train::FlatBuffer& scratch() {
    if (!scratch_buf) scratch_buf = std::make_unique<train::FlatBuffer>(ts->grads().layout());
    return *scratch_buf;
  }
};

namespace train {
// The sample lengths group_by_length sorts by; an error naming `which` when the dataset has none.
std::vector<int64_t> sample_lengths(const data::Dataset& ds, const TrainingArguments& args,
                                    const char* which);
// The epoch's micro-batches in slot order (a step's K = GA x world micro-batches, slot
// k = j * world + rank) as train_sampling_strategy picks them: random / sequential batches of
// per_device_train_batch_size, group_by_length's megabatches, batch_rebalance's balanced
// micro-batches of varying size. `lengths`: sample_lengths for the last two.
std::vector<std::vector<int64_t>> epoch_batches(const TrainingArguments& args,
                                                const std::vector<int64_t>& lengths, int64_t n,
                                                int64_t world, uint64_t seed, int64_t epoch);
// Evaluation's (and prediction's) sample order: 0..n-1, or under group_by_length Transformers'
// eval LengthGroupedSampler: eval batch size, seeded by data_seed (else seed), the same each time.
std::vector<int64_t> eval_order(const data::Dataset& ds, const TrainingArguments& args);
// predict_with_generate's scores of generated ids against labelled ones: exact match (the
// generation starts with the whole reference) and token accuracy (position by position).
struct GenerationScore {
  int64_t n = 0, exact = 0, ref_tokens = 0, matched = 0;
  void add(const std::vector<int64_t>& ref, const std::vector<int64_t>& out);
  void write(Metrics& m) const;  // gen_exact_match, gen_token_accuracy
};
// Rows of ids as one (rows, longest) int64 tensor padded with -100, as the evaluation loop pads.
Tensor padded_rows(const std::vector<std::vector<int64_t>>& rows);
}  // namespace train

}  // namespace onyx
