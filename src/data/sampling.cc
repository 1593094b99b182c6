// sampling.cc — the epoch order and the samplers on it (data/sampling.h).
// BatchRebalanceSampler is written here from Transformers 5.24's description and behaviour
// (trainer_pt_utils.py): its hill-climbing balance decides which sample lands in which
// micro-batch, so every tie-break (first max, stable sorts, the iteration order of a Python set)
// is reproduced; tests/python/test_package.py compares the two on random lengths and shapes.
#include "data/sampling.h"

#include <algorithm>
#include <limits>
#include <set>
#include <utility>

#include "onyx/error.h"

namespace onyx::data {

std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; i++) order[i] = i;
  if (!shuffle) return order;
  // SplitMix64-seeded Fisher-Yates: portable and a pure function of (seed, epoch).
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + (uint64_t)epoch * 0xD1B54A32D192ED03ull + 1;
  auto next = [&]() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(next() % (uint64_t)(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

std::vector<std::vector<int64_t>> make_batches(const std::vector<int64_t>& order,
                                               int64_t batch_size, bool drop_last) {
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i < order.size(); i += batch_size) {
    size_t e = std::min(order.size(), i + (size_t)batch_size);
    if (drop_last && (int64_t)(e - i) < batch_size) break;
    out.emplace_back(order.begin() + i, order.begin() + e);
  }
  return out;
}

std::vector<int64_t> length_grouped_order(const std::vector<int64_t>& lengths, int64_t batch_size,
                                          uint64_t seed, int64_t epoch) {
  const int64_t n = (int64_t)lengths.size();
  std::vector<int64_t> order = epoch_order(n, true, seed, epoch);
  if (n == 0) return order;
  const int64_t mult = std::max<int64_t>(1, std::min<int64_t>(n / (batch_size * 4), 50));
  const int64_t mega = mult * batch_size;
  auto longer = [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; };
  int64_t best_start = 0;
  for (int64_t s = 0; s < n; s += mega) {
    auto first = order.begin() + s, last = order.begin() + std::min(n, s + mega);
    std::stable_sort(first, last, longer);
    if (lengths[*first] > lengths[order[best_start]]) best_start = s;  // argmax: the first max
  }
  std::swap(order[0], order[best_start]);
  return order;
}

namespace {

// Transformers' cost of a micro-batch padded to its longest sample, evaluated in the same order
// (bs * max_len + ((0.001 * bs) * max_len) * max_len): ties between groups are exact comparisons.
double rebalance_cost(int64_t bs, int64_t max_len) {
  return (double)(bs * max_len) + 0.001 * (double)bs * (double)max_len * (double)max_len;
}

// The order CPython iterates set(values) for distinct non-negative ints (hash = value): the
// open-addressing table of Objects/setobject.c (8 slots, resized to 4 x used when 3/5 full;
// 10 linear probes where they fit, then perturbed jumps). BatchRebalanceSampler walks a slot's
// groups in this order when it freezes them.
std::vector<int64_t> python_set_order(const std::vector<int64_t>& values) {
  std::vector<int64_t> table(8, -1);
  auto place = [](std::vector<int64_t>& t, int64_t v) {
    const size_t mask = t.size() - 1;
    size_t perturb = (size_t)v, i = (size_t)v & mask;
    for (;;) {
      const size_t probes = i + 9 <= mask ? 9 : 0;
      for (size_t p = 0; p <= probes; p++)
        if (t[i + p] < 0) {
          t[i + p] = v;
          return;
        }
      perturb >>= 5;
      i = (i * 5 + 1 + perturb) & mask;
    }
  };
  size_t used = 0;
  for (int64_t v : values) {
    if (std::find(table.begin(), table.end(), v) != table.end()) continue;
    place(table, v);
    if (++used * 5 < (table.size() - 1) * 3) continue;
    size_t size = 8;
    while (size <= used * 4) size <<= 1;
    std::vector<int64_t> grown(size, -1);
    for (int64_t x : table)
      if (x >= 0) place(grown, x);
    table.swap(grown);
  }
  std::vector<int64_t> out;
  for (int64_t x : table)
    if (x >= 0) out.push_back(x);
  return out;
}

// Group indices by descending cost, equal costs in index order (Python's stable
// sorted(..., reverse=True)).
std::vector<int64_t> by_cost_descending(const std::vector<double>& costs) {
  std::vector<int64_t> rank(costs.size());
  for (size_t i = 0; i < rank.size(); i++) rank[i] = (int64_t)i;
  std::stable_sort(rank.begin(), rank.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  return rank;
}

// One step's samples sorted longest first and split into K = world * ga contiguous groups by
// counts; BatchRebalanceSampler's _balance_groups moves counts between groups.
class Balancer {
 public:
  Balancer(std::vector<int64_t> sorted_lengths, int64_t world, int64_t ga)
      : len_(std::move(sorted_lengths)), world_(world), k_(world * ga) {}

  // the per-group sample counts of the lowest cost spread found
  std::vector<int64_t> balance() {
    const int64_t n = (int64_t)len_.size();
    std::vector<int64_t> counts(k_);
    for (int64_t i = 0; i < k_; i++) counts[i] = n / k_ + (i < n % k_ ? 1 : 0);
    std::set<std::vector<int64_t>> seen;
    std::vector<bool> frozen(k_, false);
    double best_spread = std::numeric_limits<double>::infinity();
    std::vector<int64_t> best = counts;
    const int64_t budget = std::max<int64_t>(k_ * 30, n);
    for (int64_t it = 0; it < budget && seen.insert(counts).second; it++) {
      std::vector<double> costs = costs_of(counts);
      std::vector<int64_t> active;
      for (int64_t i = 0; i < k_; i++)
        if (!frozen[i]) active.push_back(i);
      if (active.size() <= 1) break;
      auto by_cost = [&](int64_t a, int64_t b) { return costs[a] < costs[b]; };
      // Python's max/min: the first of equals
      const int64_t hi = *std::max_element(active.begin(), active.end(), by_cost);
      const int64_t lo = *std::min_element(active.begin(), active.end(), by_cost);
      if (costs[hi] - costs[lo] < best_spread) {
        best_spread = costs[hi] - costs[lo];
        best = counts;
      }
      if (costs[hi] == costs[lo]) break;
      if (counts[hi] > 1) {  // to the cheapest group that costs less than `hi`
        std::stable_sort(active.begin(), active.end(), by_cost);
        for (int64_t to : active)
          if (to != hi && costs[to] != costs[hi]) {
            counts[hi]--;
            counts[to]++;
            break;
          }
        continue;
      }
      freeze_slot(counts, slot_of(costs, hi), hi, frozen, costs[hi]);
    }
    return best;
  }

  // each group's cost: its size times its longest (first) sample, as padded
  std::vector<double> costs_of(const std::vector<int64_t>& counts) const {
    std::vector<double> costs(k_);
    int64_t start = 0;
    for (int64_t i = 0; i < k_; i++) {
      costs[i] = counts[i] > 0 ? rebalance_cost(counts[i], len_[start]) : 0.0;
      start += counts[i];
    }
    return costs;
  }

 private:
  // the groups ranked with `pivot` in its accumulation slot (world groups by descending cost)
  std::vector<int64_t> slot_of(const std::vector<double>& costs, int64_t pivot) const {
    const std::vector<int64_t> rank = by_cost_descending(costs);
    const int64_t start =
        (std::find(rank.begin(), rank.end(), pivot) - rank.begin()) / world_ * world_;
    return python_set_order(
        std::vector<int64_t>(rank.begin() + start, rank.begin() + std::min(start + world_, k_)));
  }

  // _relieve_and_freeze: the slot's costliest group (`pivot`) is down to one sample; the slot's
  // other groups take samples from the cheapest groups outside it while they stay within
  // `cap`, then the whole slot stops taking part.
  void freeze_slot(std::vector<int64_t>& counts, const std::vector<int64_t>& slot, int64_t pivot,
                   std::vector<bool>& frozen, double cap) const {
    auto in_slot = [&](int64_t i) { return std::find(slot.begin(), slot.end(), i) != slot.end(); };
    for (int64_t g : slot) {
      if (frozen[g] || g == pivot) continue;
      for (;;) {
        std::vector<double> costs = costs_of(counts);
        int64_t start = 0;
        for (int64_t i = 0; i < g; i++) start += counts[i];
        const int64_t longest = counts[g] > 0 ? len_[start] : 0;
        if (rebalance_cost(counts[g] + 1, longest) > cap) break;
        int64_t donor = -1;
        for (int64_t i = 0; i < k_; i++)
          if (!frozen[i] && !in_slot(i) && counts[i] > 1 && (donor < 0 || costs[i] < costs[donor]))
            donor = i;
        if (donor < 0) break;
        counts[g]++;
        counts[donor]--;
      }
    }
    for (int64_t g : slot) frozen[g] = true;
  }

  std::vector<int64_t> len_;
  int64_t world_, k_;
};

// One step's micro-batches, out[j * world + r] (slot j, rank r): the balanced groups ranked by
// cost, descending (stable), dealt world at a time to slots 0, 1, ...
std::vector<std::vector<int64_t>> rebalance_step(std::vector<int64_t> samples,
                                                 const std::vector<int64_t>& lengths, int64_t world,
                                                 int64_t ga) {
  std::stable_sort(samples.begin(), samples.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> sorted_lengths;
  for (int64_t s : samples) sorted_lengths.push_back(lengths[s]);
  Balancer balancer(sorted_lengths, world, ga);
  const std::vector<int64_t> counts = balancer.balance();
  std::vector<std::vector<int64_t>> groups;
  int64_t start = 0;
  for (int64_t c : counts) {
    groups.emplace_back(samples.begin() + start, samples.begin() + start + c);
    start += c;
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t g : by_cost_descending(balancer.costs_of(counts)))
    out.push_back(std::move(groups[g]));
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> rebalanced_batches(const std::vector<int64_t>& order,
                                                     const std::vector<int64_t>& lengths,
                                                     int64_t per_step, int64_t world, int64_t ga,
                                                     bool drop_last) {
  const int64_t n = (int64_t)order.size(), k = world * ga;
  ONYX_CHECK(per_step >= k, "batch_rebalance: a step of ", per_step, " samples cannot fill ", k,
             " micro-batches");
  const int64_t steps = n / per_step + (!drop_last && n % per_step ? 1 : 0);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < steps; s++) {
    std::vector<int64_t> samples(order.begin() + s * per_step,
                                 order.begin() + std::min(n, (s + 1) * per_step));
    // the short last step, when it cannot give every micro-batch a sample: the epoch's first
    // samples again (as DistributedSampler pads)
    for (int64_t i = 0; (int64_t)samples.size() < k; i++) samples.push_back(order[i % n]);
    for (auto& b : rebalance_step(std::move(samples), lengths, world, ga)) out.push_back(b);
  }
  return out;
}

}  // namespace onyx::data
