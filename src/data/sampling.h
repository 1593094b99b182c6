// data/sampling.h — which samples form each batch of an epoch, as Transformers' samplers choose
// them. The order is a pure function of (data_seed, epoch), so a resumed run regenerates it and
// skips what was consumed (DESIGN decision 10); onyx draws its own permutation (portable, not
// torch.randperm's), and the samplers built on it group as Transformers' do.
#pragma once
#include <cstdint>
#include <vector>

namespace onyx::data {

// Sample order of one epoch: a permutation drawn from (seed, epoch) when shuffling, else 0..n-1.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

// Transformers' get_length_grouped_indices with onyx's permutation: the epoch's shuffled order
// cut into megabatches of min(n / (4 * batch_size), 50) batches (at least 1), each sorted by
// length, longest first (stable), and the longest sample of all moved to the very front.
std::vector<int64_t> length_grouped_order(const std::vector<int64_t>& lengths, int64_t batch_size,
                                          uint64_t seed, int64_t epoch);

// Splits an order into batches of `batch_size` (the last one short unless drop_last).
std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& order,
                                               int64_t batch_size, bool drop_last);

// Transformers' BatchRebalanceSampler (train_sampling_strategy="batch_rebalance") over `order`:
// each optimizer step takes the next `per_step` samples (per-device batch x GA x world), sorts
// them longest first and cuts them into world x GA contiguous micro-batches of balanced cost
// (bs * max_len + 0.001 * bs * max_len^2: short samples go in bigger batches), the costliest
// world groups in accumulation slot 0 and so on. Returned in onyx's slot order: step s's
// micro-batch for rank r and slot j at s * world * ga + j * world + r. Without drop_last the
// short last step is kept (padded from the start of `order` when it has fewer samples than
// micro-batches). An error when a step has fewer samples than micro-batches.
std::vector<std::vector<int64_t>> rebalanced_batches(const std::vector<int64_t>& order,
                                                     const std::vector<int64_t>& lengths,
                                                     int64_t per_step, int64_t world, int64_t ga,
                                                     bool drop_last);

}  // namespace onyx::data
