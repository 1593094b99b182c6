// train/grpo_rollout.cc — Trainer::prepare_rollout: GRPO's generation batch sampled from the
// current weights (onyx's generator, the Trainer's parameters as its weights: no copy of an
// unadapted model), scored by the reward functions, its advantages computed over the whole batch
// (rewards gathered from every process), and its old-policy and reference log-probabilities
// computed before the step that first trains it (train/grpo.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "dist/comm.h"
#include "generate/generate.h"
#include "kernels/cpu/gemm.h"
#include "models/grpo_head.h"
#include "onyx/trainer.h"
#include "train/grpo.h"
#include "train/trainer_internal.h"

namespace onyx {

namespace {

// The ids a rollout stops at: the tokenizer's eos first, then the model's (TRL's eos_token_ids).
std::vector<int64_t> stop_ids(const tokenizers::Tokenizer& tok,
                              const generate::GenerationConfig& model_defaults) {
  std::vector<int64_t> ids = model_defaults.eos_token_ids;
  if (auto eos = tok.eos_id(); eos && std::find(ids.begin(), ids.end(), *eos) == ids.end())
    ids.insert(ids.begin(), *eos);
  return ids;
}

int64_t pad_id_of(const tokenizers::Tokenizer& tok, const std::vector<int64_t>& stops) {
  if (tok.pad_id() >= 0) return tok.pad_id();
  return stops.empty() ? 0 : stops.front();
}

// The completion's text as batch_decode(skip_special_tokens=True) gives it.
std::string decode_completion(const tokenizers::Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<int64_t> kept;
  for (int64_t id : ids) {
    const tokenizers::AddedToken* t = tok.added_token(id);
    if (!(t && t->special)) kept.push_back(id);
  }
  return tok.decode(kept);
}

// Each row's [rewards..., completion tokens, truncated, prompt tokens] for the gather.
constexpr int kRowExtras = 3;

}  // namespace

void Trainer::keep_grpo_reference() {
  auto* R = dynamic_cast<train::GrpoRollouts*>(train_ds_.get());
  if (!R || R->options().loss.beta == 0 || !impl_->grpo_reference.empty()) return;
  const Tensor& p = std::as_const(*impl_->ts).params().flat();
  impl_->grpo_reference.assign(p.data<float>(), p.data<float>() + p.numel());
}

void Trainer::prepare_rollout() {
  auto* R = dynamic_cast<train::GrpoRollouts*>(train_ds_.get());
  if (!R) return;
  auto& I = *impl_;
  const auto& o = R->options();
  dist::Comm& comm = *I.comm;
  const int64_t slots = args_.gradient_accumulation_steps * comm.size();
  const int64_t chunk = I.batches_done / slots / o.num_iterations;
  const int64_t tag = I.epoch * (R->size() + 1) + chunk;
  if (R->buffer_tag() == tag) return;  // the batch sampled for an earlier step trains again
  const data::PromptDataset& P = R->prompts();
  const tokenizers::Tokenizer& tok = P.tokenizer();
  const std::vector<int64_t> all_prompts = R->chunk_prompts(I.epoch, chunk, I.data_seed);
  const std::vector<int64_t> mine = R->my_rows();
  std::vector<int64_t> rows;
  std::vector<std::vector<int64_t>> prompt_ids;
  for (int64_t r : mine) {
    rows.push_back(all_prompts.at(r));
    prompt_ids.push_back(P.prompt_ids(rows.back()));
  }
  // sample (or take the rollout function's completions)
  // the Trainer's weights themselves (views; LoRA unmerged): no copy of the model per rollout
  generate::Generator& gen = current_generator(kernels::LowPrecision::None, true);
  const std::vector<int64_t> stops = stop_ids(tok, I.generation_defaults);
  std::vector<std::vector<int64_t>> completions;
  if (R->rollout_function()) {
    std::vector<train::Rollout> given = R->rollout_function()(rows);
    ONYX_CHECK(given.size() == rows.size(), "GRPO: the rollout function returned ", given.size(),
               " completions for ", rows.size(), " prompts");
    for (size_t i = 0; i < given.size(); i++) {
      ONYX_CHECK(!given[i].prompt_ids.empty(), "GRPO: the rollout function's prompt_ids[", i,
                 "] is empty");
      const int64_t V = gen.config().vocab_size;
      for (auto* seq : {&given[i].prompt_ids, &given[i].completion_ids})
        for (int64_t id : *seq)
          ONYX_CHECK(id >= 0 && id < V, "GRPO: the rollout function's row ", i, " has token id ",
                     id, ", outside the vocabulary [0, ", V, ")");
      prompt_ids[i] = std::move(given[i].prompt_ids);
      completions.push_back(std::move(given[i].completion_ids));
    }
  } else {
    generate::GenerationConfig cfg;
    cfg.max_new_tokens = o.max_completion_length;
    cfg.do_sample = true;
    cfg.temperature = o.temperature;
    cfg.top_k = o.top_k;
    cfg.top_p = o.top_p;
    cfg.repetition_penalty = o.repetition_penalty;
    cfg.eos_token_ids = stops;
    cfg.pad_token_id = pad_id_of(tok, stops);
    cfg.seed = (uint64_t)args_.seed * 1000003ull + (uint64_t)tag * 7919ull + (uint64_t)comm.rank();
    completions = gen.generate(prompt_ids, cfg);
  }
  std::vector<train::Completion> done;
  train::RewardBatch rb;
  rb.prompts = &P;
  rb.prompt_rows = rows;
  rb.global_step = state_.global_step;
  const int64_t pad = pad_id_of(tok, stops);
  for (size_t i = 0; i < rows.size(); i++) {
    auto& ids = completions[i];
    ONYX_CHECK(!ids.empty(), "GRPO: the completion of prompt row ", rows[i], " is empty");
    const bool ended =
        std::find(stops.begin(), stops.end(), ids.back()) != stops.end() || ids.back() == pad;
    done.push_back({rows[i], prompt_ids[i], ids, !ended});
    rb.completions.push_back(decode_completion(tok, ids));
  }
  rb.completion_ids = completions;
  std::map<std::string, std::vector<double>> reward_logs;
  rb.logged = &reward_logs;
  // score: each function over this rank's rows, then every rank's rows gathered
  const auto& funcs = R->rewards();
  const int64_t F = (int64_t)funcs.size(), W = F + kRowExtras;
  std::vector<double> local(mine.size() * W);
  for (int64_t f = 0; f < F; f++) {
    std::vector<double> s = funcs[f]->score(rb);
    ONYX_CHECK(s.size() == rows.size(), "The reward function '", funcs[f]->name(), "' returned ",
               s.size(), " rewards, but ", rows.size(),
               " were expected (one per prompt-completion pair)");
    for (size_t i = 0; i < rows.size(); i++) local[i * W + f] = s[i];
  }
  for (size_t i = 0; i < rows.size(); i++) {
    local[i * W + F] = (double)done[i].ids.size();
    local[i * W + F + 1] = done[i].truncated ? 1.0 : 0.0;
    local[i * W + F + 2] = (double)prompt_ids[i].size();
  }
  std::vector<double> gathered = comm.all_gather_values(local);
  // gathered row (q, i) is rank q's i-th row: global row my_rows of rank q
  const int64_t N = R->generation_rows(), per_rank = (int64_t)mine.size();
  const int64_t bs = args_.per_device_train_batch_size, world = comm.size();
  std::vector<std::vector<double>> rewards(N, std::vector<double>(F));
  std::vector<double> lengths(N), truncated(N), prompt_lengths(N);
  for (int64_t q = 0; q < world; q++)
    for (int64_t i = 0; i < per_rank; i++) {
      const int64_t global = ((i / bs) * world + q) * bs + i % bs;
      const double* v = &gathered[(q * per_rank + i) * W];
      for (int64_t f = 0; f < F; f++) rewards[global][f] = v[f];
      lengths[global] = v[F], truncated[global] = v[F + 1], prompt_lengths[global] = v[F + 2];
    }
  std::vector<std::string> names;
  for (auto& f : funcs) names.push_back(f->name());
  train::Advantages adv = train::group_advantages(rewards, names, o);
  std::vector<double> my_adv;
  for (int64_t r : mine) my_adv.push_back(adv.advantage[r]);
  R->set_buffer(done, my_adv, pad, tag);
  // the old policy's (num_iterations > 1) and the reference's (beta != 0) log-probabilities
  auto logps_of_buffer = [&]() {
    const int64_t B = R->buffer_size();
    std::vector<Tensor> parts;
    for (int64_t b = 0; b < B; b += bs) {
      auto batch = R->buffer_rows(b, std::min(B, b + bs));
      if (model_.fill_defaults) model_.fill_defaults(batch);
      parts.push_back(I.ts->forward(batch).at(models::kTokenLogps));
    }
    const int64_t T1 = parts.front().dim(1);
    Tensor all(DType::Float32, {B, T1});
    int64_t at = 0;
    for (auto& t : parts) {
      std::memcpy(all.data<float>() + at, t.data<float>(), t.nbytes());
      at += t.numel();
    }
    return all;
  };
  if (o.loss.old_logps_input) R->set_logps("old_logps", logps_of_buffer());
  if (o.loss.beta != 0) {
    ONYX_CHECK(!I.grpo_reference.empty(), "GRPO: the reference weights were not kept");
    Tensor& p = I.ts->params().flat();
    std::vector<float> current(p.data<float>(), p.data<float>() + p.numel());
    std::memcpy(p.data<float>(), I.grpo_reference.data(), p.nbytes());
    Tensor ref = logps_of_buffer();
    std::memcpy(I.ts->params().flat().data<float>(), current.data(), p.nbytes());
    R->set_logps("ref_logps", ref);
  }
  // TRL's rollout metrics, one value per generation batch
  auto put = [&](const std::string& name, double v) {
    I.logged_sums[name] += v;
    I.logged_counts[name]++;
  };
  for (auto& [name, v] : adv.metrics) put(name, v);
  for (auto& [name, values] : reward_logs)  // this process's (TRL averages over all)
    if (!values.empty())
      put(name, std::accumulate(values.begin(), values.end(), 0.0) / (double)values.size());
  double total_len = 0, min_len = INFINITY, max_len = 0, term_sum = 0, term_min = INFINITY,
         term_max = 0, clipped = 0, prompt_total = 0;
  int64_t terminated = 0;
  for (int64_t i = 0; i < N; i++) {
    total_len += lengths[i], prompt_total += prompt_lengths[i];
    min_len = std::min(min_len, lengths[i]), max_len = std::max(max_len, lengths[i]);
    if (truncated[i] != 0) {
      clipped++;
      continue;
    }
    terminated++;
    term_sum += lengths[i];
    term_min = std::min(term_min, lengths[i]), term_max = std::max(term_max, lengths[i]);
  }
  if (terminated == 0) term_min = term_max = 0;
  put("completions/mean_length", total_len / (double)N);
  put("completions/min_length", min_len);
  put("completions/max_length", max_len);
  put("completions/clipped_ratio", clipped / (double)N);
  put("completions/mean_terminated_length", terminated ? term_sum / (double)terminated : 0.0);
  put("completions/min_terminated_length", term_min);
  put("completions/max_terminated_length", term_max);
  state_.num_input_tokens_seen += (int64_t)(prompt_total + total_len);
  I.logged_sums["num_tokens"] = (double)state_.num_input_tokens_seen;
  I.logged_counts["num_tokens"] = 1;
}

}  // namespace onyx
