// train/data_parallel.h — what the Trainer does differently with more than one rank: DDP and
// ZeRO stages 1 and 2 over the collective layer (dist/comm.h), on the flat buffers.
//
// One optimizer step with N ranks and gradient_accumulation_steps G covers K = N·G micro-batches
// of the epoch's one permutation (the same on every rank): global slot k = j·N + r is rank r's
// j-th micro-batch (accelerate's sharding), and its dropout seed and its place in the logged loss
// depend on k only. Each micro-batch's gradient is weighted by its share of the step's items over
// all ranks (Transformers' average_tokens_across_devices), so a rank with fewer micro-batches at
// the end of an epoch (uneven data) simply contributes less: nothing is padded, nothing repeated,
// and nothing hangs. Locally the weighted micro-batch gradients are summed left to right; across
// ranks they are summed by each element's owner in rank order — so two ranks with one micro-batch
// each give the same bits as one rank accumulating both.
//
//   zero_stage 0 (DDP): after the last micro-batch, one all-reduce of the gradient buffer per
//     optimizer step (in buckets of ddp_bucket_cap_mb, a fixed order), every rank steps the whole
//     buffer; optimizer state Ψ elements per rank.
//   zero_stage 1: one reduce-scatter per step instead; each rank clips and steps only its shard
//     (dist::Partition, 64-element aligned) and holds only its shard's AdamW moments, then an
//     all-gather of the parameters. State ⌈Ψ/N⌉ (+ alignment) per rank.
//   zero_stage 2: as 1, and gradient accumulation keeps only the local shard: each micro-batch's
//     gradient is reduce-scattered as soon as it is computed (one reduction per micro-batch, as
//     DeepSpeed) and added into a shard-sized accumulator, so no second full gradient buffer.
//
// The gradient norm is exact (train::SquareSum), so clipping sees the same norm for any world size
// and stage.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/comm.h"
#include "onyx/tensor.h"
#include "train/flat_buffer.h"

namespace onyx::train {

class TrainingSession;

class DataParallel {
 public:
  DataParallel(dist::Comm& comm, const FlatLayout& layout, int zero_stage, int64_t bucket_cap_mb);

  dist::Comm& comm() { return comm_; }
  int rank() const { return comm_.rank(); }
  int world() const { return comm_.size(); }
  int zero_stage() const { return zero_; }
  const dist::Partition& partition() const { return part_; }
  // The elements this rank clips, steps and holds optimizer state for.
  int64_t owned_begin() const { return zero_ ? part_.begin(rank()) : 0; }
  int64_t owned_end() const { return zero_ ? part_.end(rank()) : part_.numel; }

  // Rank 0's parameters and buffers (BatchNorm statistics) to every rank.
  void broadcast_weights(TrainingSession& ts);
  // Every rank must run the same setup; a difference is an error naming the ranks and the field.
  void check_same(const std::vector<std::pair<const char*, int64_t>>& fields);

  // After the local micro-batches: DDP all-reduce or ZeRO-1 reduce-scatter (one reduction).
  // ZeRO-2 reduces per micro-batch instead (accumulate_shard), then call finish_shard.
  void reduce_gradients(FlatBuffer& grads);
  // ZeRO-2: reduce-scatter this micro-batch's gradient and add this rank's part into the shard
  // accumulator (first: overwrite).
  void accumulate_shard(FlatBuffer& grads, bool first);
  // ZeRO-2: the accumulated shard back into grads' owned range.
  void finish_shard(FlatBuffer& grads);
  // The global gradient norm (exact; the same for any world size and stage).
  double grad_norm(const FlatBuffer& grads);
  // ZeRO: every rank's updated shard of the parameters to all ranks.
  void gather_params(FlatBuffer& params);

  // Reduction overlapped with backward (DDP and ZeRO-1 with more than one rank, unless
  // ONYX_DDP_OVERLAP=0): the buckets of the step's last local micro-batch are reduced by a
  // communication thread, each as soon as every gradient in it is final, in the fixed bucket
  // order (so every rank runs the same collectives in the same order). `src` is the buffer that
  // micro-batch writes: grads, or the second buffer whose weighted values are added into grads
  // bucket by bucket; `w` is its weight. src == nullptr: this rank has no micro-batch left and
  // grads is final. The arithmetic is the same as reduce_gradients', so are the bits.
  bool overlaps() const { return overlap_; }
  size_t buckets() const { return buckets_.size(); }
  void begin_overlap(FlatBuffer& grads, FlatBuffer* src, float w,
                     const std::vector<std::string>& early, const std::vector<std::string>& late);
  void grad_ready(const std::string& param);  // backward's hook (TrainingSession)
  void end_overlap();                         // waits for the last bucket

  int64_t gradient_reductions = 0;  // counted for the tests and the run summary
  double reduce_seconds = 0;        // wall time the step waited for gradient reductions
  double comm_seconds = 0;          // time the communication thread spent in them (overlap)
  ~DataParallel();

 private:
  void prepare_bucket(size_t b);  // weight / add the bucket's values into grads, then release it
  void comm_thread();
  // [begin, end) ranges of at most bucket_cap elements, 64-aligned, last tensor first (the order
  // backward produces them).
  std::vector<std::pair<int64_t, int64_t>> buckets_;
  dist::Comm& comm_;
  int zero_;
  dist::Partition part_;
  std::vector<float> shard_acc_;  // ZeRO-2 accumulator (owned range)
  FlatLayout layout_;
  // overlap state (guarded by mu_ where the communication thread reads it)
  bool overlap_ = false, patient_overlap_ = false;
  std::map<std::string, std::vector<size_t>> buckets_of_;  // parameter -> buckets it overlaps
  std::vector<int> pending_;                               // per bucket: gradients not final yet
  std::vector<char> released_;                             // per bucket: ready to reduce
  size_t next_ = 0;                                        // next bucket the thread reduces
  bool active_ = false, quit_ = false;
  FlatBuffer *grads_ = nullptr, *src_ = nullptr;
  float w_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

// The optimizer state (moments and "step") of elements [begin, end) of a flat buffer of `numel`
// elements, read from a checkpoint folder written at any world size and ZeRO stage: its
// optimizer.safetensors, or the parts of its optimizer-R-of-N shards that overlap the range.
// Throws naming the file when a shard is missing or was written for another model.
std::map<std::string, Tensor> load_optimizer_range(const std::string& dir, int64_t begin,
                                                   int64_t end, int64_t numel);

}  // namespace onyx::train
