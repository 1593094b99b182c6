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

// The completions of `rows`: the rollout function's (which also sets their prompt ids), else
// sampled by `gen` as GRPOConfig says.
std::vector<std::vector<int64_t>> sample_completions(const train::GrpoRollouts& R,
                                                     generate::Generator& gen,
                                                     const std::vector<int64_t>& rows,
                                                     std::vector<std::vector<int64_t>>& prompt_ids,
                                                     const std::vector<int64_t>& stops, int64_t pad,
                                                     uint64_t seed) {
  const train::GrpoOptions& o = R.options();
  std::vector<std::vector<int64_t>> completions;
  if (!R.rollout_function()) {
    generate::GenerationConfig cfg;
    cfg.max_new_tokens = o.max_completion_length;
    cfg.do_sample = true;
    cfg.temperature = o.temperature;
    cfg.top_k = o.top_k;
    cfg.top_p = o.top_p;
    cfg.repetition_penalty = o.repetition_penalty;
    cfg.eos_token_ids = stops;
    cfg.pad_token_id = pad;
    cfg.seed = seed;
    return gen.generate(prompt_ids, cfg);
  }
  std::vector<train::Rollout> given = R.rollout_function()(rows);
  ONYX_CHECK(given.size() == rows.size(), "GRPO: the rollout function returned ", given.size(),
             " completions for ", rows.size(), " prompts");
  const int64_t V = gen.config().vocab_size;
  for (size_t i = 0; i < given.size(); i++) {
    ONYX_CHECK(!given[i].prompt_ids.empty(), "GRPO: the rollout function's prompt_ids[", i,
               "] is empty");
    for (auto* seq : {&given[i].prompt_ids, &given[i].completion_ids})
      for (int64_t id : *seq)
        ONYX_CHECK(id >= 0 && id < V, "GRPO: the rollout function's row ", i, " has token id ", id,
                   ", outside the vocabulary [0, ", V, ")");
    prompt_ids[i] = std::move(given[i].prompt_ids);
    completions.push_back(std::move(given[i].completion_ids));
  }
  return completions;
}

// Every row of the generation batch, from all processes: each reward function's value, the
// completion's and the prompt's lengths and whether it was cut.
struct BatchScores {
  std::vector<std::vector<double>> rewards;  // rows × functions (NaN: unscored)
  std::vector<double> lengths, truncated, prompt_lengths;
};

// Scores this process's rows (batch.prompt_rows: its micro-batch slots) and gathers every
// process's; bs: per_device_train_batch_size (a slot's rows).
BatchScores score_and_gather(const train::GrpoRollouts& R, const train::RewardBatch& batch,
                             const std::vector<train::Completion>& done, dist::Comm& comm,
                             int64_t bs) {
  const auto& funcs = R.rewards();
  const int64_t F = (int64_t)funcs.size(), W = F + 3, mine = (int64_t)done.size();
  std::vector<double> local(mine * W);
  for (int64_t f = 0; f < F; f++) {
    std::vector<double> s = funcs[f]->score(batch);
    ONYX_CHECK((int64_t)s.size() == mine, "The reward function '", funcs[f]->name(), "' returned ",
               s.size(), " rewards, but ", mine, " were expected (one per prompt-completion pair)");
    for (int64_t i = 0; i < mine; i++) local[i * W + f] = s[i];
  }
  for (int64_t i = 0; i < mine; i++) {
    local[i * W + F] = (double)done[i].ids.size();
    local[i * W + F + 1] = done[i].truncated ? 1.0 : 0.0;
    local[i * W + F + 2] = (double)done[i].prompt_ids.size();
  }
  std::vector<double> gathered = comm.all_gather_values(local);
  // gathered row (q, i) is process q's i-th row: generation-batch row ((i / bs) world + q) bs + i %
  // bs
  const int64_t N = R.generation_rows(), world = comm.size();
  BatchScores out{std::vector<std::vector<double>>(N, std::vector<double>(F)),
                  std::vector<double>(N), std::vector<double>(N), std::vector<double>(N)};
  for (int64_t q = 0; q < world; q++)
    for (int64_t i = 0; i < mine; i++) {
      const int64_t row = ((i / bs) * world + q) * bs + i % bs;
      const double* v = &gathered[(q * mine + i) * W];
      for (int64_t f = 0; f < F; f++) out.rewards[row][f] = v[f];
      out.lengths[row] = v[F], out.truncated[row] = v[F + 1], out.prompt_lengths[row] = v[F + 2];
    }
  return out;
}

// token_logps of every buffered row under the session's current weights, bs rows per forward.
Tensor buffer_logps(const train::GrpoRollouts& R, train::TrainingSession& ts, const Model& m,
                    int64_t bs) {
  const int64_t B = R.buffer_size();
  std::vector<Tensor> parts;
  for (int64_t b = 0; b < B; b += bs) {
    auto batch = R.buffer_rows(b, std::min(B, b + bs));
    if (m.fill_defaults) m.fill_defaults(batch);
    parts.push_back(ts.forward(batch).at(models::kTokenLogps));
  }
  Tensor all(DType::Float32, {B, parts.front().dim(1)});
  int64_t at = 0;
  for (auto& t : parts) {
    std::memcpy(all.data<float>() + at, t.data<float>(), t.nbytes());
    at += t.numel();
  }
  return all;
}

// TRL's completion-length metrics of a generation batch (one value each per batch).
std::map<std::string, double> length_metrics(const BatchScores& s) {
  const int64_t N = (int64_t)s.lengths.size();
  double total = 0, lo = INFINITY, hi = 0, term_sum = 0, term_lo = INFINITY, term_hi = 0, cut = 0;
  int64_t ended = 0;
  for (int64_t i = 0; i < N; i++) {
    const double n = s.lengths[i];
    total += n, lo = std::min(lo, n), hi = std::max(hi, n);
    if (s.truncated[i] != 0) {
      cut++;
      continue;
    }
    ended++, term_sum += n, term_lo = std::min(term_lo, n), term_hi = std::max(term_hi, n);
  }
  if (ended == 0) term_lo = term_hi = 0;
  return {{"completions/mean_length", total / (double)N},
          {"completions/min_length", lo},
          {"completions/max_length", hi},
          {"completions/clipped_ratio", cut / (double)N},
          {"completions/mean_terminated_length", ended ? term_sum / (double)ended : 0.0},
          {"completions/min_terminated_length", term_lo},
          {"completions/max_terminated_length", term_hi}};
}

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
  const int64_t bs = args_.per_device_train_batch_size;
  const int64_t slots = args_.gradient_accumulation_steps * comm.size();
  const int64_t chunk = I.batches_done / slots / o.num_iterations;
  const int64_t tag = I.epoch * (R->size() + 1) + chunk;
  if (R->buffer_tag() == tag) return;  // the batch sampled for an earlier step trains again
  const data::PromptDataset& P = R->prompts();
  const tokenizers::Tokenizer& tok = P.tokenizer();
  const std::vector<int64_t> all_prompts = R->chunk_prompts(I.epoch, chunk, I.data_seed);
  std::vector<int64_t> rows;
  std::vector<std::vector<int64_t>> prompt_ids;
  for (int64_t r : R->my_rows()) {
    rows.push_back(all_prompts.at(r));
    prompt_ids.push_back(P.prompt_ids(rows.back()));
  }
  // the Trainer's weights themselves (views; LoRA unmerged): no copy of the model per rollout
  generate::Generator& gen = current_generator(kernels::LowPrecision::None, true);
  const std::vector<int64_t> stops = stop_ids(tok, I.generation_defaults);
  const int64_t pad = pad_id_of(tok, stops);
  const uint64_t seed =
      (uint64_t)args_.seed * 1000003ull + (uint64_t)tag * 7919ull + (uint64_t)comm.rank();
  std::vector<std::vector<int64_t>> completions =
      sample_completions(*R, gen, rows, prompt_ids, stops, pad, seed);
  std::vector<train::Completion> done;
  train::RewardBatch batch;
  batch.prompts = &P;
  batch.prompt_rows = rows;
  batch.global_step = state_.global_step;
  for (size_t i = 0; i < rows.size(); i++) {
    const auto& ids = completions[i];
    ONYX_CHECK(!ids.empty(), "GRPO: the completion of prompt row ", rows[i], " is empty");
    const bool ended =
        std::find(stops.begin(), stops.end(), ids.back()) != stops.end() || ids.back() == pad;
    done.push_back({rows[i], prompt_ids[i], ids, !ended});
    batch.completions.push_back(decode_completion(tok, ids));
  }
  batch.completion_ids = completions;
  std::map<std::string, std::vector<double>> reward_logs;
  batch.logged = &reward_logs;
  const BatchScores scores = score_and_gather(*R, batch, done, comm, bs);
  std::vector<std::string> names;
  for (auto& f : R->rewards()) names.push_back(f->name());
  const train::Advantages adv = train::group_advantages(scores.rewards, names, o);
  std::vector<double> my_adv;
  for (int64_t r : R->my_rows()) my_adv.push_back(adv.advantage[r]);
  R->set_buffer(done, my_adv, pad, tag);
  // the old policy's (num_iterations > 1) and the reference's (beta != 0) log-probabilities
  if (o.loss.old_logps_input) R->set_logps("old_logps", buffer_logps(*R, *I.ts, model_, bs));
  if (o.loss.beta != 0) {
    ONYX_CHECK(!I.grpo_reference.empty(), "GRPO: the reference weights were not kept");
    Tensor& p = I.ts->params().flat();
    std::vector<float> current(p.data<float>(), p.data<float>() + p.numel());
    std::memcpy(p.data<float>(), I.grpo_reference.data(), p.nbytes());
    Tensor ref = buffer_logps(*R, *I.ts, model_, bs);
    std::memcpy(I.ts->params().flat().data<float>(), current.data(), p.nbytes());
    R->set_logps("ref_logps", ref);
  }
  // TRL's rollout metrics, one value per generation batch
  auto put = [&](const std::string& name, double v) {
    I.logged_sums[name] += v;
    I.logged_counts[name]++;
  };
  for (auto& [name, v] : adv.metrics) put(name, v);
  for (auto& [name, v] : length_metrics(scores)) put(name, v);
  for (auto& [name, values] : reward_logs)  // this process's (TRL averages over all)
    if (!values.empty())
      put(name, std::accumulate(values.begin(), values.end(), 0.0) / (double)values.size());
  for (size_t i = 0; i < scores.lengths.size(); i++)
    state_.num_input_tokens_seen += (int64_t)(scores.lengths[i] + scores.prompt_lengths[i]);
  I.logged_sums["num_tokens"] = (double)state_.num_input_tokens_seen;
  I.logged_counts["num_tokens"] = 1;
}

}  // namespace onyx
