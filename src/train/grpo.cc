// train/grpo.cc — see grpo.h. The regex reward is regex_reward.cc's (ICU).
#include "train/grpo.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "data/sampling.h"
#include "onyx/error.h"

namespace onyx::train {

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

class ExactMatch : public RewardFunction {
 public:
  ExactMatch(std::string name, std::string column) : name_(std::move(name)), column_(column) {}
  std::string name() const override { return name_; }
  std::vector<double> score(const RewardBatch& b) override {
    std::vector<double> out;
    for (size_t c = 0; c < b.completions.size(); c++) {
      const nlohmann::json& row = b.prompts->row(b.prompt_rows[c]);
      auto it = row.find(column_);
      ONYX_CHECK(it != row.end() && !it->is_null(), "reward exact_match: dataset '",
                 b.prompts->path(), "' line ", b.prompts->line(b.prompt_rows[c]),
                 " has no column '", column_, "'");
      const std::string want = it->is_string() ? it->get<std::string>() : it->dump();
      out.push_back(strip(b.completions[c]) == strip(want) ? 1.0 : 0.0);
    }
    return out;
  }

 private:
  std::string name_, column_;
};

class LengthTarget : public RewardFunction {
 public:
  LengthTarget(std::string name, int64_t target) : name_(std::move(name)), target_(target) {}
  std::string name() const override { return name_; }
  std::vector<double> score(const RewardBatch& b) override {
    std::vector<double> out;
    for (auto& ids : b.completion_ids)
      out.push_back(-std::fabs((double)ids.size() - (double)target_) / (double)target_);
    return out;
  }

 private:
  std::string name_;
  int64_t target_;
};

// mean and Bessel-corrected standard deviation of the non-NaN values (TRL's nanmean, nanstd:
// NaN for fewer than two)
std::pair<double, double> nan_mean_std(const std::vector<double>& v) {
  double sum = 0;
  int64_t n = 0;
  for (double x : v)
    if (!std::isnan(x)) sum += x, n++;
  if (n == 0) return {kNaN, kNaN};
  const double mean = sum / (double)n;
  if (n < 2) return {mean, kNaN};
  double sq = 0;
  for (double x : v)
    if (!std::isnan(x)) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / (double)n * (double)n / (double)(n - 1))};
}

bool all_nan(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
}

}  // namespace

std::shared_ptr<RewardFunction> builtin_reward(const nlohmann::json& spec, const std::string& what,
                                               const std::string& dir) {
  ONYX_CHECK(spec.is_object() && spec.contains("type") && spec["type"].is_string(), what,
             ": a reward function is {type: exact_match | regex | length | python, ...}, got ",
             spec.dump());
  const std::string type = spec["type"];
  const std::string name = spec.value("name", type);
  auto text = [&](const char* key) {
    ONYX_CHECK(spec.contains(key) && spec[key].is_string(), what, ": reward ", type, " needs '",
               key, "' (a string)");
    return spec[key].get<std::string>();
  };
  auto check_keys = [&](std::vector<std::string> allowed) {
    allowed.push_back("type");
    allowed.push_back("name");
    for (auto& [k, v] : spec.items())
      ONYX_CHECK(std::find(allowed.begin(), allowed.end(), k) != allowed.end(), what, ": reward ",
                 type, " has no key '", k, "'");
  };
  if (type == "exact_match") {
    check_keys({"column"});
    return std::make_shared<ExactMatch>(name, text("column"));
  }
  if (type == "regex") {
    check_keys({"pattern", "dotall"});
    const bool dotall =
        spec.contains("dotall") && spec["dotall"].is_boolean() && spec["dotall"].get<bool>();
    return regex_reward(name, text("pattern"), dotall, cat(what, ": reward regex"));
  }
  if (type == "python") {
    check_keys({"function", "python", "timeout"});
    return python_reward(spec, dir, what);
  }
  if (type == "length") {
    check_keys({"target"});
    ONYX_CHECK(spec.contains("target") && spec["target"].is_number_integer() &&
                   spec["target"].get<int64_t>() > 0,
               what, ": reward length needs 'target' (a positive integer)");
    return std::make_shared<LengthTarget>(name, spec["target"].get<int64_t>());
  }
  throw Error(cat(what, ": unknown reward type '", type, "' (exact_match, regex, length, python)"));
}

void check_grpo_options(const GrpoOptions& o) {
  models::check_grpo_loss(o.loss);
  ONYX_CHECK(o.num_generations >= 2, "num_generations must be at least 2 (a group), got ",
             o.num_generations);
  ONYX_CHECK(o.num_iterations >= 1, "num_iterations must be at least 1, got ", o.num_iterations);
  ONYX_CHECK(o.max_completion_length > 0 && o.max_completion_length <= 1 << 20,
             "max_completion_length must be in [1, 1048576], got ", o.max_completion_length);
  ONYX_CHECK(o.scale_rewards == "group" || o.scale_rewards == "batch" || o.scale_rewards == "none",
             "scale_rewards must be group, batch or none, got '", o.scale_rewards, "'");
  ONYX_CHECK(o.multi_objective_aggregation == "sum_then_normalize" ||
                 o.multi_objective_aggregation == "normalize_then_sum",
             "multi_objective_aggregation must be sum_then_normalize or normalize_then_sum, got '",
             o.multi_objective_aggregation, "'");
  ONYX_CHECK(o.temperature > 0, "temperature must be positive, got ", o.temperature);
  ONYX_CHECK(o.top_p > 0 && o.top_p <= 1, "top_p must be in (0, 1], got ", o.top_p);
  ONYX_CHECK(o.top_k >= 0, "top_k must be >= 0, got ", o.top_k);
  ONYX_CHECK(o.repetition_penalty > 0, "repetition_penalty must be positive, got ",
             o.repetition_penalty);
}

Advantages group_advantages(const std::vector<std::vector<double>>& rewards,
                            const std::vector<std::string>& names, const GrpoOptions& o) {
  const int64_t N = (int64_t)rewards.size(), F = (int64_t)names.size(), G = o.num_generations;
  ONYX_CHECK(N % G == 0, "GRPO: ", N, " completions are not whole groups of ", G);
  std::vector<double> w = o.reward_weights.empty() ? std::vector<double>(F, 1.0) : o.reward_weights;
  ONYX_CHECK((int64_t)w.size() == F, "reward_weights: ", w.size(), " weights for ", F,
             " reward functions");
  auto weighted_sum = [&](const std::vector<std::vector<double>>& r) {
    std::vector<double> out(N);
    for (int64_t i = 0; i < N; i++) {
      double s = 0;
      for (int64_t f = 0; f < F; f++)
        if (!std::isnan(r[i][f])) s += r[i][f] * w[f];
      out[i] = all_nan(r[i]) ? kNaN : s;
    }
    return out;
  };
  auto column = [&](int64_t f, int64_t from, int64_t to) {
    std::vector<double> v;
    for (int64_t i = from; i < to; i++) v.push_back(rewards[i][f]);
    return v;
  };
  Advantages a;
  std::vector<double> total = weighted_sum(rewards), std_of(N, 0.0), centered(N);
  if (o.multi_objective_aggregation == "sum_then_normalize") {
    const auto [batch_mean, batch_std] = nan_mean_std(total);
    for (int64_t g = 0; g < N; g += G) {
      std::vector<double> group(total.begin() + g, total.begin() + g + G);
      const auto [mean, sd] = nan_mean_std(group);
      for (int64_t i = g; i < g + G; i++) {
        centered[i] = total[i] - mean;
        std_of[i] = o.scale_rewards == "batch" ? batch_std : sd;
      }
    }
  } else {  // normalize_then_sum: each function normalized within its group, then the batch
    std::vector<std::vector<double>> normalized(N, std::vector<double>(F));
    for (int64_t f = 0; f < F; f++)
      for (int64_t g = 0; g < N; g += G) {
        const auto [mean, sd] = nan_mean_std(column(f, g, g + G));
        for (int64_t i = g; i < g + G; i++) normalized[i][f] = (rewards[i][f] - mean) / (sd + 1e-4);
      }
    std::vector<double> summed = weighted_sum(normalized);
    for (int64_t i = 0; i < N; i++)
      if (all_nan(rewards[i])) summed[i] = kNaN;
    const auto [mean, sd] = nan_mean_std(summed);
    for (int64_t i = 0; i < N; i++) {
      centered[i] = summed[i] - mean;
      std_of[i] = sd;
    }
  }
  const bool scale =
      o.scale_rewards != "none" || o.multi_objective_aggregation != "sum_then_normalize";
  int64_t zero_std = 0;
  for (int64_t i = 0; i < N; i++) {
    double adv = scale ? centered[i] / (std_of[i] + 1e-4) : centered[i];
    a.advantage.push_back(std::isnan(adv) ? 0.0 : adv);
    zero_std += std::fabs(std_of[i]) <= 1e-8;  // torch.isclose(std, 0); NaN is not close
  }
  for (int64_t f = 0; f < F; f++) {
    const auto [mean, sd] = nan_mean_std(column(f, 0, N));
    a.metrics[cat("rewards/", names[f], "/mean")] = mean;
    a.metrics[cat("rewards/", names[f], "/std")] = sd;
  }
  const auto [mean, sd] = nan_mean_std(total);
  a.metrics["reward"] = mean;
  a.metrics["reward_std"] = sd;
  a.metrics["frac_reward_zero_std"] = (double)zero_std / (double)N;
  return a;
}

// ---- GrpoRollouts
// ---------------------------------------------------------------------------------

GrpoRollouts::GrpoRollouts(std::shared_ptr<const data::PromptDataset> prompts, GrpoOptions opts)
    : prompts_(std::move(prompts)), opts_(std::move(opts)) {
  ONYX_CHECK(prompts_, "GRPO: no prompt dataset");
  check_grpo_options(opts_);
  for (size_t k = 0; k < opts_.reward_specs.size(); k++)
    rewards_.push_back(
        builtin_reward(opts_.reward_specs[k], cat("reward_funcs[", k, "]"), opts_.reward_dir));
}

void GrpoRollouts::plan(int64_t batch_size, int64_t accumulation, int64_t world, int64_t rank) {
  bs_ = batch_size, ga_ = accumulation, world_ = world, rank_ = rank;
  const int64_t rows = generation_rows(), G = opts_.num_generations;
  ONYX_CHECK(opts_.steps_per_generation == 0 || opts_.steps_per_generation == ga_,
             "GRPO: steps_per_generation ", opts_.steps_per_generation,
             ": onyx samples one generation batch per optimizer step (steps_per_generation = "
             "gradient_accumulation_steps = ",
             ga_, ")");
  ONYX_CHECK(opts_.generation_batch_size == 0 || opts_.generation_batch_size == rows,
             "GRPO: generation_batch_size ", opts_.generation_batch_size,
             ": onyx's is the completions of one optimizer step (per_device_train_batch_size × "
             "gradient_accumulation_steps × processes = ",
             rows, ")");
  ONYX_CHECK(rows % G == 0, "GRPO: the generation batch (per_device_train_batch_size ", bs_,
             " × gradient_accumulation_steps ", ga_, " × ", world_, " processes = ", rows,
             " completions) must be a multiple of num_generations ", G);
  ONYX_CHECK(prompts_->size() >= rows / G, "GRPO: dataset '", prompts_->path(), "' has ",
             prompts_->size(), " prompts; a generation batch of ", rows, " completions needs ",
             rows / G, " (", G, " completions each)");
  ONYX_CHECK(!rewards_.empty() || rollout_fn_,
             "GRPO: no reward function (reward_funcs: in the config, or Python callables)");
  clear_buffer();
}

int64_t GrpoRollouts::size() const {
  const int64_t rows = generation_rows(), per_chunk = rows / opts_.num_generations;
  return per_chunk > 0 ? prompts_->size() / per_chunk * opts_.num_iterations * rows : 0;
}

std::vector<int64_t> GrpoRollouts::chunk_prompts(int64_t epoch, int64_t chunk,
                                                 uint64_t seed) const {
  const int64_t per_chunk = generation_rows() / opts_.num_generations;
  auto order = data::epoch_order(prompts_->size(), opts_.shuffle_dataset, seed, epoch);
  std::vector<int64_t> out;
  for (int64_t p = chunk * per_chunk; p < (chunk + 1) * per_chunk; p++)
    for (int64_t g = 0; g < opts_.num_generations; g++) out.push_back(order.at(p));
  return out;
}

std::vector<int64_t> GrpoRollouts::my_rows() const {
  std::vector<int64_t> rows;
  for (int64_t j = 0; j < ga_; j++)
    for (int64_t r = 0; r < bs_; r++) rows.push_back((j * world_ + rank_) * bs_ + r);
  return rows;
}

void GrpoRollouts::set_buffer(const std::vector<Completion>& rows,
                              const std::vector<double>& advantages, int64_t pad_id, int64_t tag) {
  const int64_t B = (int64_t)rows.size();
  ONYX_CHECK((int64_t)advantages.size() == B, "GRPO: ", advantages.size(), " advantages for ", B,
             " completions");
  int64_t P = 0, C = 0;
  for (auto& r : rows) {
    P = std::max<int64_t>(P, (int64_t)r.prompt_ids.size());
    C = std::max<int64_t>(C, (int64_t)r.ids.size());
  }
  const int64_t T = P + C;
  Tensor ids(DType::Int64, {B, T}), mask(DType::Int64, {B, T}), labels(DType::Int64, {B, T});
  Tensor adv(DType::Float32, {B});
  int64_t *pi = ids.data<int64_t>(), *pm = mask.data<int64_t>(), *pl = labels.data<int64_t>();
  for (int64_t b = 0; b < B; b++) {
    const auto& prompt = rows[b].prompt_ids;
    const auto& comp = rows[b].ids;
    const bool masked = opts_.mask_truncated_completions && rows[b].truncated;
    const int64_t start = P - (int64_t)prompt.size();
    for (int64_t t = 0; t < T; t++) {
      int64_t* id = pi + b * T + t;
      int64_t* m = pm + b * T + t;
      int64_t* l = pl + b * T + t;
      *id = pad_id, *m = 0, *l = -100;
      if (t >= start && t < P) {
        *id = prompt[t - start], *m = 1;
      } else if (t >= P && t - P < (int64_t)comp.size()) {
        *id = comp[t - P];
        *m = masked ? 0 : 1;
        *l = masked ? -100 : comp[t - P];
      }
    }
    adv.data<float>()[b] = (float)advantages[b];
  }
  buffer_ = {{"input_ids", ids}, {"attention_mask", mask}, {"labels", labels}, {"advantages", adv}};
  tag_ = tag;
}

void GrpoRollouts::set_logps(const char* name, Tensor logps) {
  ONYX_CHECK(logps.rank() == 2 && logps.dim(0) == buffer_size(), "GRPO: ", name, " of shape ",
             shape_str(logps.shape()), " for ", buffer_size(), " rows");
  buffer_[name] = std::move(logps);
}

std::map<std::string, Tensor> GrpoRollouts::buffer_rows(int64_t begin, int64_t end) const {
  std::vector<int64_t> idx;
  for (int64_t r = begin; r < end; r++) idx.push_back(r);
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : buffer_) {
    Shape s = t.shape();
    s[0] = (int64_t)idx.size();
    Tensor part(t.dtype(), s);
    const int64_t row_bytes = t.nbytes() / std::max<int64_t>(t.dim(0), 1);
    for (size_t i = 0; i < idx.size(); i++)
      std::memcpy((char*)part.raw() + i * row_bytes, (const char*)t.raw() + idx[i] * row_bytes,
                  row_bytes);
    out[name] = std::move(part);
  }
  return out;
}

std::map<std::string, Tensor> GrpoRollouts::batch(const std::vector<int64_t>& indices) const {
  ONYX_CHECK(tag_ >= 0, "GRPO: a batch was asked before its completions were sampled");
  ONYX_CHECK(!indices.empty(), "GRPO: an empty batch");
  // virtual row i is generation-batch row i % rows; this rank holds its slots' rows in order
  const int64_t rows = generation_rows();
  const int64_t first = indices.front() % rows, slot = first / bs_;
  ONYX_CHECK(slot % world_ == rank_ && (int64_t)indices.size() <= bs_,
             "GRPO: rows of another process's micro-batch were asked (", first, ")");
  const int64_t local = (slot / world_) * bs_ + first % bs_;
  for (size_t k = 0; k < indices.size(); k++)
    ONYX_CHECK(indices[k] % rows == first + (int64_t)k, "GRPO: batches are read in order");
  return buffer_rows(local, local + (int64_t)indices.size());
}

std::vector<std::string> GrpoRollouts::keys() const {
  std::vector<std::string> k = {"input_ids", "attention_mask", "labels", "advantages"};
  if (opts_.loss.old_logps_input) k.push_back("old_logps");
  if (opts_.loss.beta != 0) k.push_back("ref_logps");
  return k;
}

}  // namespace onyx::train
