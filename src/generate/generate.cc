// generate.cc — Generator: prefill, then one token per step over a key/value cache (generate.h).
#include "generate/generate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "io/safetensors.h"
#include "models/hf_weights.h"
#include "models/lora.h"
#include "passes/pass.h"
#include "quant/store_4bit.h"
#include "runtime/session.h"
#include "tokenizers/tokenizer.h"

namespace fs = std::filesystem;

namespace onyx::generate {

struct Generator::Compiled {
  int64_t batch, new_tokens, past;
  int64_t encoder_length = 0;                   // an encoder–decoder's cross keys and values
  std::map<std::string, TensorMeta> signature;  // the encoder's
  std::shared_ptr<const ir::Graph> graph;
  std::unique_ptr<runtime::Session> session;
};

// Whether `cfg` sets any logits processor (process_logits has work to do).
static bool has_processors(const GenerationConfig& cfg) {
  return cfg.repetition_penalty != 1.0 || cfg.no_repeat_ngram_size > 0 || cfg.min_length > 0 ||
         cfg.min_new_tokens > 0 || cfg.forced_bos_token_id >= 0 ||
         !cfg.forced_eos_token_ids.empty() || !cfg.suppress_tokens.empty() ||
         !cfg.begin_suppress_tokens.empty() || cfg.whisper_timestamp_begin >= 0;
}

// Every logit -inf but those of `keep` (0 there): the forced-token processors.
static void force_tokens(float* s, int64_t V, const std::vector<int64_t>& keep) {
  std::fill(s, s + V, -std::numeric_limits<float>::infinity());
  for (int64_t k : keep)
    if (k >= 0 && k < V) s[k] = 0;
}

// Every logit of [from, to) -inf.
static void forbid(float* s, int64_t from, int64_t to) {
  std::fill(s + std::max<int64_t>(from, 0), s + std::max(from, to),
            -std::numeric_limits<float>::infinity());
}

// Transformers' WhisperTimeStampLogitsProcessor (generation_config.h) on row s (V) after `fresh`
// new tokens, the last of `seq`.
static void whisper_timestamp_rules(float* s, int64_t V, const GenerationConfig& cfg,
                                    const std::vector<int64_t>& seq, int64_t fresh) {
  const int64_t tb = cfg.whisper_timestamp_begin, n = (int64_t)seq.size();
  const int64_t eos = cfg.eos_token_ids.empty() ? tb : cfg.eos_token_ids[0];
  forbid(s, tb - 1, tb);  // <|notimestamps|>
  const bool last_was_timestamp = fresh >= 1 && seq[n - 1] >= tb;
  const bool penultimate_was_timestamp = fresh < 2 || seq[n - 2] >= tb;
  if (last_was_timestamp) {
    if (penultimate_was_timestamp)
      forbid(s, tb, V);  // a pair is closed: text
    else
      forbid(s, 0, eos);  // a lone timestamp: its pair, or the end
  }
  int64_t lowest = tb;  // timestamps never decrease; <|0.00|> only as the first
  for (int64_t i = n - 1; i >= n - fresh; i--)
    if (seq[i] >= tb) {
      lowest = last_was_timestamp && !penultimate_was_timestamp ? seq[i] : seq[i] + 1;
      break;
    }
  forbid(s, tb, std::min(lowest, V));
  if (fresh == 0) {  // the first new token: a timestamp, an early one
    forbid(s, 0, tb);
    if (cfg.max_initial_timestamp_index >= 0)
      forbid(s, std::min(V, tb + cfg.max_initial_timestamp_index + 1), V);
  }
  // the timestamps' total probability against the likeliest text token's (log-sum-exp over the
  // timestamps > the largest text logit, both relative to the same normalizer)
  float text_max = -std::numeric_limits<float>::infinity(), ts_max = text_max;
  for (int64_t v = 0; v < tb; v++) text_max = std::max(text_max, s[v]);
  for (int64_t v = tb; v < V; v++) ts_max = std::max(ts_max, s[v]);
  if (ts_max == -std::numeric_limits<float>::infinity()) return;
  double sum = 0;
  for (int64_t v = tb; v < V; v++) sum += std::exp((double)s[v] - ts_max);
  if (ts_max + std::log(sum) > (double)text_max) forbid(s, 0, tb);
}

// Transformers' logits processors of `cfg` on one row's next-token logits s (V), in its order.
// `seq`: the row as generate() holds it (left padding, prompt, new tokens so far); `pads`: how
// many of its first tokens are padding; `fresh`: new tokens so far; `max_len`: the length (padded
// prompt + new tokens) generation stops at.
static void process_logits(float* s, int64_t V, const GenerationConfig& cfg,
                           const std::vector<int64_t>& seq, int64_t pads, int64_t fresh,
                           const std::set<int64_t>& eos, int64_t max_len) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (cfg.repetition_penalty != 1.0) {
    const float p = (float)cfg.repetition_penalty;
    std::vector<bool> seen((size_t)V, false);
    for (size_t i = (size_t)pads; i < seq.size(); i++)
      if (seq[i] >= 0 && seq[i] < V) seen[(size_t)seq[i]] = true;
    for (int64_t v = 0; v < V; v++)
      if (seen[(size_t)v]) s[v] = s[v] < 0 ? s[v] * p : s[v] / p;
  }
  const int64_t n = cfg.no_repeat_ngram_size, len = (int64_t)seq.size();
  if (n > 0 && len + 1 >= n) {
    // every earlier n-gram whose first n-1 tokens are the row's last n-1 bans its last token
    for (int64_t i = 0; i + n <= len; i++) {
      bool same = true;
      for (int64_t k = 0; k < n - 1 && same; k++) same = seq[i + k] == seq[len - n + 1 + k];
      if (same && seq[i + n - 1] >= 0 && seq[i + n - 1] < V) s[seq[i + n - 1]] = ninf;
    }
  }
  if (len < cfg.min_length || fresh < cfg.min_new_tokens)
    for (int64_t e : eos)
      if (e >= 0 && e < V) s[e] = ninf;
  if (cfg.forced_bos_token_id >= 0 && len == 1) force_tokens(s, V, {cfg.forced_bos_token_id});
  if (!cfg.forced_eos_token_ids.empty() && len == max_len - 1)
    force_tokens(s, V, cfg.forced_eos_token_ids);
  for (int64_t t : cfg.suppress_tokens)
    if (t < V) s[t] = ninf;
  // the first new token (the second after a one-token prompt and a forced bos)
  const int64_t begin = len - fresh + (len - fresh == 1 && cfg.forced_bos_token_id >= 0 ? 1 : 0);
  if (len == begin)
    for (int64_t t : cfg.begin_suppress_tokens)
      if (t < V) s[t] = ninf;
  if (cfg.whisper_timestamp_begin >= 0) whisper_timestamp_rules(s, V, cfg, seq, fresh);
}

// Beam search as Transformers' _beam_search (5.x) runs it, for B0 prompts of num_beams rows each
// (flat row b * nb + j). seqs: the running rows as its running_sequences hold them (left padding,
// prompt, new tokens); logits: the prefill's (B0 * nb, V); pads: padding per row; the best
// finished hypothesis of each prompt goes to result[b] (its new tokens, eos included when it
// ended so) and its score to best_score[b] (sequences_scores). advance(from): reorders the cache
// so that row r is row from[r]'s, runs the rows' last tokens (seqs[r].back()) and returns the
// next logits. Scores are float32 as there.
template <class Advance>
static void beam_search(const GenerationConfig& cfg, int64_t B0, int64_t L, int64_t max_new,
                        const std::set<int64_t>& eos, const std::vector<int64_t>& pads,
                        std::vector<std::vector<int64_t>>& seqs, Tensor logits,
                        std::vector<std::vector<int64_t>>& result, std::vector<double>& best_score,
                        Advance advance) {
  const int64_t nb = cfg.num_beams, B = B0 * nb, V = logits.dim(1);
  const int64_t K = std::max<int64_t>(2, 1 + (int64_t)eos.size()) * nb;  // beams_to_keep
  const int64_t max_len = L + max_new;
  const float kMask = -1.0e9f;
  const bool stop_when_full = cfg.early_stopping == "true";
  std::vector<float> run_score(B, 0.0f);  // running_beam_scores: beam 0 alone at first
  for (int64_t r = 0; r < B; r++)
    if (r % nb) run_score[r] = kMask;
  std::vector<std::vector<int64_t>> fin_seq(B);  // the finished hypotheses (sequences)
  std::vector<float> fin_score(B, kMask);        // beam_scores
  std::vector<char> fin(B, 0);                   // is_sent_finished
  std::vector<char> unsat(B0, 1);                // is_early_stop_heuristic_unsatisfied
  std::vector<float> acc((size_t)(nb * V)), lp((size_t)V);
  std::vector<int64_t> idx((size_t)(nb * V));
  for (int64_t t = 0;; t++) {
    const int64_t cur = L + t;  // cur_len
    std::vector<std::vector<int64_t>> next_seqs(B);
    std::vector<float> next_score(B);
    std::vector<int64_t> from(B);
    bool all_hit = true;
    for (int64_t b = 0; b < B0; b++) {
      // accumulated log-probabilities of every continuation of the prompt's beams
      for (int64_t j = 0; j < nb; j++) {
        const int64_t r = b * nb + j;
        const float* x = logits.data<float>() + r * V;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t v = 0; v < V; v++) mx = std::max(mx, x[v]);
        double sum = 0;
        for (int64_t v = 0; v < V; v++) sum += std::exp((double)(x[v] - mx));
        const float lse = (float)std::log(sum);
        for (int64_t v = 0; v < V; v++) lp[v] = x[v] - mx - lse;  // log_softmax
        process_logits(lp.data(), V, cfg, seqs[r], pads[r], t, eos, max_len);
        for (int64_t v = 0; v < V; v++) acc[j * V + v] = lp[v] + run_score[r];
      }
      // the top K (descending; ties: the lower index first)
      for (int64_t i = 0; i < nb * V; i++) idx[i] = i;
      std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int64_t a, int64_t c) {
        return acc[a] > acc[c] || (acc[a] == acc[c] && a < c);
      });
      struct Cand {
        int64_t parent, token;
        float score;
        bool hit;
      };
      std::vector<Cand> cand((size_t)K);
      bool hits_all = true;
      for (int64_t k = 0; k < K; k++) {
        const int64_t i = idx[k], tok = i % V;
        cand[k] = {b * nb + i / V, tok, acc[i], cur + 1 >= max_len || eos.count(tok) > 0};
        hits_all &= cand[k].hit;
      }
      all_hit &= hits_all;
      auto with = [&](const Cand& c) {
        std::vector<int64_t> q = seqs[c.parent];
        q.push_back(c.token);
        return q;
      };
      // the running beams of the next step: the best candidates that did not stop
      std::vector<float> run_adj((size_t)K);
      std::vector<int64_t> order((size_t)K);
      for (int64_t k = 0; k < K; k++) {
        run_adj[k] = cand[k].score + (cand[k].hit ? kMask : 0.0f);
        order[k] = k;
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t c) { return run_adj[a] > run_adj[c]; });
      for (int64_t j = 0; j < nb; j++) {
        const Cand& c = cand[order[j]];
        next_seqs[b * nb + j] = with(c);
        next_score[b * nb + j] = run_adj[order[j]];
        from[b * nb + j] = c.parent;
      }
      // the finished hypotheses: the current ones and the top num_beams candidates that stopped
      const float denom = (float)std::pow((double)(cur + 1 - L), cfg.length_penalty);
      bool full = stop_when_full;
      for (int64_t j = 0; j < nb; j++) full &= fin[b * nb + j] != 0;
      std::vector<float> ms((size_t)(nb + K));
      std::vector<char> mf((size_t)(nb + K));
      for (int64_t j = 0; j < nb; j++) ms[j] = fin_score[b * nb + j], mf[j] = fin[b * nb + j];
      for (int64_t k = 0; k < K; k++) {
        const bool done = cand[k].hit && k < nb;
        float v = cand[k].score / denom;
        v += full ? kMask : 0.0f;
        v += unsat[b] ? 0.0f : kMask;
        v += done ? 0.0f : kMask;
        ms[nb + k] = v;
        mf[nb + k] = done;
      }
      std::vector<int64_t> mo((size_t)(nb + K));
      for (int64_t i = 0; i < nb + K; i++) mo[i] = i;
      std::stable_sort(mo.begin(), mo.end(), [&](int64_t a, int64_t c) { return ms[a] > ms[c]; });
      std::vector<std::vector<int64_t>> nfs(nb);
      std::vector<float> nfsc(nb);
      std::vector<char> nff(nb);
      for (int64_t j = 0; j < nb; j++) {
        const int64_t m = mo[j];
        nfs[j] = m < nb ? fin_seq[b * nb + m] : with(cand[m - nb]);
        nfsc[j] = ms[m];
        nff[j] = mf[m];
      }
      for (int64_t j = 0; j < nb; j++) {
        fin_seq[b * nb + j] = std::move(nfs[j]);
        fin_score[b * nb + j] = nfsc[j];
        fin[b * nb + j] = nff[j];
      }
    }
    run_score = next_score;
    // the early-stop heuristic, at the new length
    const int64_t len = cur + 1;
    bool improvement = false, all_fin = true;
    for (int64_t b = 0; b < B0; b++) {
      if (unsat[b]) {
        const int64_t hyp =
            cfg.early_stopping == "never" && cfg.length_penalty > 0 ? max_len - L : len - L;
        const float best = run_score[b * nb] / (float)std::pow((double)hyp, cfg.length_penalty);
        float worst = fin_score[b * nb];
        for (int64_t j = 1; j < nb; j++) worst = std::min(worst, fin_score[b * nb + j]);
        bool any = false;
        for (int64_t j = 0; j < nb; j++) any |= best > (fin[b * nb + j] ? worst : kMask);
        unsat[b] = any;
      }
      improvement |= unsat[b] != 0;
      for (int64_t j = 0; j < nb; j++) all_fin &= fin[b * nb + j] != 0;
    }
    if (!improvement || (all_fin && stop_when_full) || all_hit) break;
    seqs = std::move(next_seqs);
    logits = advance(from);
  }
  for (int64_t b = 0; b < B0; b++) {
    const auto& q = fin_seq[b * nb];
    result[b].assign(q.begin() + std::min<int64_t>(L, (int64_t)q.size()), q.end());
    best_score[b] = fin_score[b * nb];
  }
}

double log_softmax_at(const float* x, int64_t V, int64_t k, double scale) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < V; i++)
    if (std::isfinite(x[i])) mx = std::max(mx, (double)x[i] * scale);
  double sum = 0;
  for (int64_t i = 0; i < V; i++)
    if (std::isfinite(x[i])) sum += std::exp((double)x[i] * scale - mx);
  return (double)x[k] * scale - mx - std::log(sum);
}

// The sampling warpers on logits (V), in Transformers' order: / temperature, then top-k, then
// top-p; what they remove is -inf.
static std::vector<float> warped_for_sampling(const float* logits, int64_t V,
                                              const GenerationConfig& cfg) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> s(V);
  for (int64_t i = 0; i < V; i++) s[i] = (float)(logits[i] / cfg.temperature);
  if (cfg.top_k > 0 && cfg.top_k < V) {
    // TopKLogitsWarper: remove what is below the k-th largest (ties with it stay)
    std::vector<float> t(s);
    std::nth_element(t.begin(), t.begin() + (cfg.top_k - 1), t.end(), std::greater<float>());
    const float kth = t[cfg.top_k - 1];
    for (auto& x : s)
      if (x < kth) x = ninf;
  }
  if (cfg.top_p < 1.0) {
    // TopPLogitsWarper: in ascending order, remove tokens while the cumulative probability is
    // <= 1 - top_p; the most likely token always stays
    std::vector<int64_t> order(V);
    for (int64_t i = 0; i < V; i++) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] < s[b]; });
    const float mx = s[order[V - 1]];
    double total = 0;
    for (float x : s) total += x == ninf ? 0.0 : std::exp((double)x - mx);
    double cum = 0;
    for (int64_t r = 0; r < V - 1; r++) {
      float& x = s[order[r]];
      cum += x == ninf ? 0.0 : std::exp((double)x - mx) / total;
      if (cum <= 1.0 - cfg.top_p) x = ninf;
    }
  }
  return s;
}

int64_t pick_token(const float* logits, int64_t V, const GenerationConfig& cfg, double u,
                   double* logprob) {
  if (!cfg.do_sample || cfg.temperature <= 0) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
      if (logits[i] > logits[best]) best = i;
    if (logprob) *logprob = log_softmax_at(logits, V, best);
    return best;
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> s = warped_for_sampling(logits, V, cfg);
  float mx = ninf;
  for (float x : s) mx = std::max(mx, x);
  std::vector<double> p(V);
  double total = 0;
  for (int64_t i = 0; i < V; i++) total += p[i] = s[i] == ninf ? 0.0 : std::exp((double)s[i] - mx);
  double target = u * total, cum = 0;
  int64_t last = 0, picked = -1;
  for (int64_t i = 0; i < V && picked < 0; i++) {
    if (p[i] == 0) continue;
    last = i;
    cum += p[i];
    if (cum > target) picked = i;
  }
  if (picked < 0) picked = last;
  // Transformers' Whisper rescales the warped scores by the temperature before its log_softmax
  if (logprob) *logprob = log_softmax_at(s.data(), V, picked, cfg.temperature);
  return picked;
}

Generator::Generator(models::BuiltModel decoder, std::optional<models::BuiltModel> encoder)
    : model_(std::move(decoder)) {
  graph_ = model_.model.graph;
  uses_positions_ = graph_->find_input("position_ids") != nullptr;
  if (encoder) {
    encoder_graph_ = encoder->model.graph;
    for (auto& [name, t] : encoder_graph_->initializers) encoder_weights_.insert(name);
  }
  for (auto& [name, t] : graph_->initializers) weights_.insert(name);
  for (auto& in : graph_->inputs) {
    if (in.name.rfind("past_values.", 0) != 0) continue;
    layers_++;
    kv_heads_ = in.shape.at(1);
    head_dim_ = in.shape.at(3);
  }
  ONYX_CHECK(layers_ > 0,
             "Generator: the graph has no past_values.N inputs (not a decoder with past)");
}

Generator::~Generator() = default;

void Generator::set_weights(std::map<std::string, Tensor> weights) {
  std::map<std::string, Tensor> decoder, encoder;
  // puts t in `feeds` when it is a weight of g (of the same shape)
  auto place = [](const ir::Graph* g, std::map<std::string, Tensor>& feeds, const std::string& name,
                  const Tensor& t) {
    if (!g) return false;
    auto it = g->initializers.find(name);
    if (it == g->initializers.end()) return false;
    ONYX_CHECK(it->second.meta() == t.meta(), "Generator::set_weights: '", name, "' has shape ",
               shape_str(t.shape()), ", the model's is ", shape_str(it->second.shape()));
    feeds[name] = t;
    return true;
  };
  for (auto& [name, t] : weights) {
    const bool in_decoder = place(graph_.get(), decoder, name, t);
    const bool in_encoder = place(encoder_graph_.get(), encoder, name, t);
    ONYX_CHECK(in_decoder || in_encoder, "Generator::set_weights: '", name,
               "' is not a weight of the model");
  }
  weight_feeds_ = std::move(decoder);
  encoder_weight_feeds_ = std::move(encoder);
}

// The initializers of `part` (an encoder–decoder's encoder or decoder-with-past graph) taken from
// `full`, the loaded training model: the same tensors, not copies.
static void share_weights(const models::BuiltModel& full, models::BuiltModel& part) {
  auto g = std::make_shared<ir::Graph>(*part.model.graph);
  for (auto& [name, t] : g->initializers) {
    auto it = full.model.graph->initializers.find(name);
    ONYX_CHECK(it != full.model.graph->initializers.end(), "generate: the model has no weight '",
               name, "'");
    t = it->second;
  }
  part.model.graph = g;
}

// An encoder–decoder folder: loaded once as the training model (LoRA adapters merged), its
// weights shared by the encoder and the decoder-with-past graphs.
static Generator encoder_decoder_from_folder(const std::string& dir, const models::HfConfig& c) {
  models::BuiltModel full = models::load_hf_folder(dir, models::Task::Seq2SeqLM);
  if (fs::exists(fs::path(dir) / "adapter_config.json")) {
    ONYX_CHECK(!quant::holds_4bit_weights(*full.model.graph), dir,
               ": generating from a 4-bit encoder–decoder with LoRA adapters is not supported");
    auto g = std::make_shared<ir::Graph>(*full.model.graph);
    auto adapter =
        io::load_safetensors((fs::path(dir) / "adapter_model.safetensors").string()).tensors;
    models::merge_lora(*g, models::read_adapter_config(dir), adapter);
    full.model.graph = g;
  }
  models::BuiltModel decoder = models::build_hf_decoder_with_past(c, 0);
  models::BuiltModel encoder = models::build_hf_encoder(c, 0);
  share_weights(full, decoder);
  share_weights(full, encoder);
  decoder.model.source = dir;
  return Generator(std::move(decoder), std::move(encoder));
}

Generator Generator::from_folder(const std::string& dir) {
  fs::path d(dir);
  ONYX_CHECK(fs::is_directory(d), dir, ": not a folder");
  fs::path cfg = d / "config.json";
  ONYX_CHECK(
      fs::exists(cfg), dir,
      ": no config.json (generate reads a Hugging Face model folder or a checkpoint of one)");
  models::HfConfig c =
      models::parse_hf_config(tokenizers::read_text_file(cfg.string()), cfg.string());
  if (models::is_encoder_decoder(c.model_type)) return encoder_decoder_from_folder(dir, c);
  models::BuiltModel m = models::build_hf_decoder_with_past(c, 0);
  m.model.source = dir;
  models::apply_hf_checkpoint(m, models::read_hf_checkpoint(dir), dir);
  if (fs::exists(d / "adapter_config.json")) {
    models::LoraSpec spec = models::read_adapter_config(dir);
    auto adapter = io::load_safetensors((d / "adapter_model.safetensors").string()).tensors;
    auto g = std::make_shared<ir::Graph>(*m.model.graph);
    if (quant::holds_4bit_weights(*g))  // a 4-bit base: the adapters beside it, as PEFT runs them
      models::apply_lora(*g, spec, 0, adapter);
    else
      models::merge_lora(*g, spec, adapter);
    m.model.graph = g;
  }
  return Generator(std::move(m));
}

Generator::Compiled& Generator::compiled_for(int64_t batch, int64_t new_tokens, int64_t past,
                                             const std::map<std::string, Tensor>& cross) {
  const int64_t enc_len = cross.empty() ? 0 : cross.at("cross_values.0").dim(2);
  for (auto& c : compiled_)
    if (c->batch == batch && c->new_tokens == new_tokens && c->past == past &&
        c->encoder_length == enc_len)
      return *c;
  std::map<std::string, TensorMeta> sig;
  for (auto& [name, t] : cross) sig[name] = t.meta();
  sig["input_ids"] = {DType::Int64, {batch, new_tokens}};
  if (uses_positions_)  // (T5's positions are relative: its decoder has none)
    sig["position_ids"] = {DType::Int64, {batch, new_tokens}};
  sig["attention_mask"] = {DType::Int64, {batch, past + new_tokens}};
  sig["cache_position"] = {DType::Int64, {new_tokens}};
  for (int64_t l = 0; l < layers_; l++) {
    sig[cat("past_keys.", l)] = {DType::Float32, {batch, kv_heads_, head_dim_, past}};
    sig[cat("past_values.", l)] = {DType::Float32, {batch, kv_heads_, past, head_dim_}};
  }
  auto c = std::make_unique<Compiled>();
  c->batch = batch;
  c->new_tokens = new_tokens;
  c->past = past;
  c->encoder_length = enc_len;
  c->graph = std::make_shared<ir::Graph>(
      passes::optimize_forward(*graph_, sig, weights_, passes::OptimizeOptions{}, nullptr));
  c->session = std::make_unique<runtime::Session>(c->graph, weights_);
  compiled_count_++;
  // Kept: the prefill's and the last few blocks' (a long generation does not accumulate plans).
  if (compiled_.size() >= 3) compiled_.erase(compiled_.begin());
  compiled_.push_back(std::move(c));
  return *compiled_.back();
}

// `slot`'s compiled form of graph `g` for the input signature `sig`, compiled again when the
// signature changed (an encoder's, cross_attentions' graph: one form kept).
Generator::Compiled& Generator::compiled_once(std::unique_ptr<Compiled>& slot, const ir::Graph& g,
                                              const std::map<std::string, TensorMeta>& sig,
                                              const std::set<std::string>& weights) {
  if (!slot || slot->signature != sig) {
    auto c = std::make_unique<Compiled>();
    c->signature = sig;
    c->graph = std::make_shared<ir::Graph>(
        passes::optimize_forward(g, sig, weights, passes::OptimizeOptions{}, nullptr));
    c->session = std::make_unique<runtime::Session>(c->graph, weights);
    slot = std::move(c);
  }
  return *slot;
}

std::map<std::string, Tensor> Generator::encode(const std::map<std::string, Tensor>& inputs,
                                                int64_t rows, int64_t repeat) {
  std::map<std::string, TensorMeta> sig;
  std::map<std::string, Tensor> feeds = encoder_weight_feeds_;
  for (auto& in : encoder_graph_->inputs) {
    auto it = inputs.find(in.name);
    ONYX_CHECK(it != inputs.end(), "generate: the encoder needs the input '", in.name, "'");
    ONYX_CHECK(it->second.rank() >= 1 && it->second.dim(0) == rows, "generate: encoder input '",
               in.name, "' has shape ", shape_str(it->second.shape()), "; expected one row per ",
               "prompt (", rows, ")");
    sig[in.name] = it->second.meta();
    feeds[in.name] = it->second;
  }
  auto out =
      compiled_once(encoder_compiled_, *encoder_graph_, sig, encoder_weights_).session->run(feeds);
  if (graph_->find_input("encoder_attention_mask"))  // BART's cross-attention mask
    out["encoder_attention_mask"] = inputs.at("attention_mask");
  if (repeat > 1)  // beams: row r of a prompt's beams is the prompt's row (repeat_interleave)
    for (auto& [name, t] : out) {
      Shape s = t.shape();
      const size_t row = t.nbytes() / (size_t)s[0];
      s[0] *= repeat;
      Tensor r(t.dtype(), s);
      for (int64_t i = 0; i < s[0]; i++)
        std::memcpy((char*)r.raw() + i * row, (const char*)t.raw() + (i / repeat) * row, row);
      t = r;
    }
  return out;
}

// The key/value cache of `rows` rows of `tokens` tokens, and the logits of a step, must fit in
// the machine's memory: a generation length or a beam count from a file cannot exhaust it.
void Generator::check_cache_fits(int64_t rows, int64_t tokens, int64_t vocab) const {
  const double cache = 2.0 * 4 * (double)rows * tokens * layers_ * kv_heads_ * head_dim_;
  const double logits = 4.0 * rows * vocab * 2;
  const double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
  ONYX_CHECK(cache + logits <= ram, "generate: ", rows, " rows (prompts x num_beams) of up to ",
             tokens, " tokens need ", (int64_t)((cache + logits) / (1 << 20)),
             " MiB of key/value cache and logits, more than this machine's ",
             (int64_t)(ram / (1 << 20)), " MiB; lower max_new_tokens, num_beams or the batch");
}

namespace {

// The key/value cache of one generate() call: per layer keys (rows, kv, hd, cap) (transposed:
// the graph multiplies queries by them as they are) and values (rows, kv, cap, hd), slots
// [0, filled) written; slot_mask (rows, cap) says which written slots are real tokens (left
// padding is not). It grows in blocks of `block` slots, so the optimized graph (compiled per
// capacity) is rebuilt once per block, not per token.
struct KvCache {
  int64_t rows, kv, hd, block;
  int64_t cap = 0, filled = 0;
  std::vector<Tensor> keys, values;
  std::vector<int64_t> slot_mask;  // (rows, cap)

  KvCache(int64_t layers, int64_t rows_, int64_t kv_heads, int64_t head_dim, int64_t block_)
      : rows(rows_), kv(kv_heads), hd(head_dim), block(block_), keys(layers), values(layers) {
    for (int64_t l = 0; l < layers; l++) {
      keys[l] = Tensor::zeros(DType::Float32, {rows, kv, hd, 0});
      values[l] = Tensor::zeros(DType::Float32, {rows, kv, 0, hd});
    }
  }

  void grow(int64_t need) {
    if (need <= cap) return;
    const int64_t ncap = (need + block - 1) / block * block;
    for (auto& t : keys) {  // rows of cap slots, one per (b, head, d)
      Tensor n = Tensor::zeros(DType::Float32, {rows, kv, hd, ncap});
      if (filled > 0)
        for (int64_t i = 0; i < rows * kv * hd; i++)
          std::memcpy(n.data<float>() + i * ncap, t.data<float>() + i * cap,
                      (size_t)filled * sizeof(float));
      t = n;
    }
    for (auto& t : values) {
      Tensor n = Tensor::zeros(DType::Float32, {rows, kv, ncap, hd});
      if (filled > 0)
        for (int64_t i = 0; i < rows * kv; i++)
          std::memcpy(n.data<float>() + i * ncap * hd, t.data<float>() + i * cap * hd,
                      (size_t)(filled * hd) * sizeof(float));
      t = n;
    }
    std::vector<int64_t> m((size_t)(rows * ncap), 0);
    for (int64_t r = 0; r < rows; r++)
      std::copy(slot_mask.begin() + r * cap, slot_mask.begin() + r * cap + filled,
                m.begin() + r * ncap);
    slot_mask = std::move(m);
    cap = ncap;
  }

  // The attention mask (rows, cap + S) of a run over S new tokens: the cache's slots, then them.
  std::vector<int64_t> attention_mask(const std::vector<int64_t>& new_mask, int64_t S) const {
    std::vector<int64_t> am((size_t)(rows * (cap + S)), 0);
    for (int64_t r = 0; r < rows; r++) {
      std::copy(slot_mask.begin() + r * cap, slot_mask.begin() + r * cap + filled,
                am.begin() + r * (cap + S));
      std::copy(new_mask.begin() + r * S, new_mask.begin() + (r + 1) * S,
                am.begin() + r * (cap + S) + cap);
    }
    return am;
  }

  // A run's new keys and values (new_keys.l (rows, kv, S, hd), new_values.l) into slots
  // [filled, filled + S), growing the cache first when they do not fit.
  void append(const std::map<std::string, Tensor>& out, const std::vector<int64_t>& new_mask,
              int64_t S) {
    grow(filled + S);
    for (size_t l = 0; l < keys.size(); l++) {
      const Tensor& nk = out.at(cat("new_keys.", l));
      const Tensor& nv = out.at(cat("new_values.", l));
      for (int64_t i = 0; i < rows * kv; i++) {
        float* kd = keys[l].data<float>() + i * hd * cap + filled;
        const float* ks = nk.data<float>() + i * S * hd;
        for (int64_t t = 0; t < S; t++)
          for (int64_t d = 0; d < hd; d++) kd[d * cap + t] = ks[t * hd + d];
        std::memcpy(values[l].data<float>() + (i * cap + filled) * hd,
                    nv.data<float>() + i * S * hd, (size_t)(S * hd) * sizeof(float));
      }
    }
    for (int64_t r = 0; r < rows; r++)
      std::copy(new_mask.begin() + r * S, new_mask.begin() + (r + 1) * S,
                slot_mask.begin() + r * cap + filled);
    filled += S;
  }

  // Beam search: row r becomes row from[r]'s.
  void reorder(const std::vector<int64_t>& from) {
    auto gather = [&](Tensor& t, int64_t row) {
      Tensor n(DType::Float32, t.shape());
      for (int64_t r = 0; r < rows; r++)
        std::memcpy(n.data<float>() + r * row, t.data<float>() + from[r] * row,
                    (size_t)row * sizeof(float));
      t = n;
    };
    for (size_t l = 0; l < keys.size(); l++) {
      gather(keys[l], kv * hd * cap);
      gather(values[l], kv * cap * hd);
    }
    std::vector<int64_t> m(slot_mask.size());
    for (int64_t r = 0; r < rows; r++)
      std::copy(slot_mask.begin() + from[r] * cap, slot_mask.begin() + (from[r] + 1) * cap,
                m.begin() + r * cap);
    slot_mask = std::move(m);
  }
};

// The length prompts are left-padded to (the longest); each prompt checked (not empty, ids in
// the vocabulary; row r is prompt r / nb).
int64_t padded_length(const std::vector<std::vector<int64_t>>& prompts, int64_t nb, int64_t V) {
  int64_t L = 0;
  for (size_t r = 0; r < prompts.size(); r++) {
    ONYX_CHECK(!prompts[r].empty(), "generate: prompt ", r / nb,
               " is empty (needs at least one token)");
    for (int64_t id : prompts[r])
      ONYX_CHECK(id >= 0 && id < V, "generate: prompt ", r / nb, " has token id ", id,
                 " outside the vocabulary (0..", V - 1, ")");
    L = std::max(L, (int64_t)prompts[r].size());
  }
  return L;
}

}  // namespace

// The new tokens per row (max_new_tokens, or max_length less the L-token padded prompts) for B
// rows, checked against the model's positions, the machine's memory and the encoder inputs.
int64_t Generator::checked_new_tokens(const GenerationConfig& cfg, int64_t L, int64_t B,
                                      bool has_encoder_inputs) const {
  // (Transformers refuses a prompt already max_length long)
  ONYX_CHECK(cfg.max_new_tokens >= 0 || L < cfg.max_length, "generate: the prompts are ", L,
             " tokens long (left-padded), but max_length is ", cfg.max_length,
             "; raise max_length or set max_new_tokens");
  int64_t max_new = cfg.max_new_tokens >= 0 ? cfg.max_new_tokens : cfg.max_length - L;
  const int64_t max_pos = model_.config.max_position_embeddings;
  if (model_.config.model_type == "whisper" && cfg.max_new_tokens < 0)
    // Whisper's generate: max_length counts from the decoder prompt (up to max_target_positions
    // / 2 - 1 of its tokens), within max_target_positions
    max_new = std::min(cfg.max_length + std::min(max_pos / 2 - 1, L), max_pos) - L;
  check_cache_fits(B, L + max_new, model_.config.vocab_size);
  if (model_.config.model_type == "gpt2" || encoder_graph_)  // learned positions: a table's rows
    ONYX_CHECK(L + max_new <= max_pos, "generate: prompt length ", L, " + ", max_new,
               " new tokens exceeds the model's ", max_pos, " positions (",
               model_.config.model_type == "whisper" ? "max_target_positions"
               : model_.config.model_type == "gpt2"  ? "n_positions"
                                                     : "max_position_embeddings",
               ")");
  ONYX_CHECK(encoder_graph_ || !has_encoder_inputs,
             "generate: encoder inputs given to a decoder-only model");
  ONYX_CHECK(!encoder_graph_ || has_encoder_inputs,
             "generate: an encoder–decoder needs the encoder's inputs (",
             model_.config.model_type == "whisper" ? "input_features" : "input_ids, attention_mask",
             ")");
  return max_new;
}

namespace {

// The prefill's inputs, (B, L) each: the prompts left-padded with `pad`, their mask, and
// positions that count real tokens (pads at 0), as Transformers'
// _prepare_position_ids_for_generation; and each row's next position.
struct Prefill {
  std::vector<int64_t> ids, mask, pos, next_pos;
};
Prefill left_padded(const std::vector<std::vector<int64_t>>& prompts, int64_t L, int64_t pad) {
  const int64_t B = (int64_t)prompts.size();
  Prefill p{std::vector<int64_t>((size_t)(B * L), pad), std::vector<int64_t>((size_t)(B * L), 0),
            std::vector<int64_t>((size_t)(B * L), 0), std::vector<int64_t>((size_t)B)};
  for (int64_t r = 0; r < B; r++) {
    const int64_t n = (int64_t)prompts[r].size(), off = L - n;
    for (int64_t i = 0; i < n; i++) {
      p.ids[r * L + off + i] = prompts[r][i];
      p.mask[r * L + off + i] = 1;
      p.pos[r * L + off + i] = i;
    }
    p.next_pos[r] = n;
  }
  return p;
}

// Rows 0, n, 2n, ... of `t` (rows, V): each prompt's first beam.
Tensor every_nth_row(const Tensor& t, int64_t n) {
  const int64_t rows = t.dim(0) / n, V = t.dim(1);
  Tensor out(DType::Float32, {rows, V});
  for (int64_t p = 0; p < rows; p++)
    std::memcpy(out.data<float>() + p * V, t.data<float>() + p * n * V, (size_t)V * sizeof(float));
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> Generator::generate(
    const std::vector<std::vector<int64_t>>& given, const GenerationConfig& cfg,
    GenerationStats* stats, const std::map<std::string, Tensor>& encoder_inputs,
    GenerationScores* scores) {
  using clock = std::chrono::steady_clock;
  ONYX_CHECK(!given.empty(), "generate: no prompts");
  validate_generation_config(cfg, "generate");
  check_generation_token_ids(cfg, model_.config.vocab_size, "generate");
  ONYX_CHECK(cfg.early_stopping == "false" || cfg.early_stopping == "true" ||
                 cfg.early_stopping == "never",
             "generate: early_stopping must be false, true or never, got ", cfg.early_stopping);
  // Beam search runs num_beams rows per prompt (prompt p's beams are rows p*num_beams + j, as
  // Transformers' repeat_interleave expands them).
  const int64_t nb = cfg.num_beams;
  std::vector<std::vector<int64_t>> expanded;
  if (nb > 1)
    for (auto& p : given)
      for (int64_t j = 0; j < nb; j++) expanded.push_back(p);
  const std::vector<std::vector<int64_t>>& prompts = nb > 1 ? expanded : given;
  const int64_t B = (int64_t)prompts.size();
  ONYX_CHECK(cfg.max_new_tokens >= 0 || cfg.max_length >= 0,
             "generate: max_new_tokens must be >= 0, got ", cfg.max_new_tokens);
  ONYX_CHECK(cfg.cache_block >= 1, "generate: cache_block must be >= 1");
  const int64_t V = model_.config.vocab_size;
  const int64_t L = padded_length(prompts, nb, V);
  const int64_t max_new = checked_new_tokens(cfg, L, B, !encoder_inputs.empty());
  const std::map<std::string, Tensor> cross =
      encoder_graph_ ? encode(encoder_inputs, (int64_t)given.size(), nb)
                     : std::map<std::string, Tensor>{};
  const int64_t pad = padding_token(cfg);
  std::set<int64_t> eos(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end());
  std::mt19937_64 rng(cfg.seed);
  std::uniform_real_distribution<double> unif(0.0, 1.0);

  // The cache (KvCache), and one run over S new tokens per row (ids (B,S), new_mask (B,S),
  // positions (B,S)) that reads it and appends the new keys and values.
  KvCache cache(layers_, B, kv_heads_, head_dim_, cfg.cache_block);
  auto step = [&](const std::vector<int64_t>& ids, const std::vector<int64_t>& new_mask,
                  const std::vector<int64_t>& positions, int64_t S) {
    Compiled& c = compiled_for(B, S, cache.cap, cross);
    std::map<std::string, Tensor> feeds = weight_feeds_;
    for (auto& [name, t] : cross) feeds[name] = t;
    feeds["input_ids"] = Tensor::from_vector<int64_t>(DType::Int64, {B, S}, ids);
    if (uses_positions_)
      feeds["position_ids"] = Tensor::from_vector<int64_t>(DType::Int64, {B, S}, positions);
    feeds["attention_mask"] = Tensor::from_vector<int64_t>(DType::Int64, {B, cache.cap + S},
                                                           cache.attention_mask(new_mask, S));
    std::vector<int64_t> cp(S);
    for (int64_t i = 0; i < S; i++) cp[i] = cache.filled + i;
    feeds["cache_position"] = Tensor::from_vector<int64_t>(DType::Int64, {S}, cp);
    for (int64_t l = 0; l < layers_; l++) {
      feeds[cat("past_keys.", l)] = cache.keys[l];
      feeds[cat("past_values.", l)] = cache.values[l];
    }
    auto out = c.session->run(feeds);
    cache.append(out, new_mask, S);
    return out.at("logits");  // (B,V)
  };
  // Beam search: row r of the cache (and its position) becomes row from[r]'s.
  auto reorder = [&](const std::vector<int64_t>& from, std::vector<int64_t>& next_pos) {
    cache.reorder(from);
    std::vector<int64_t> p(B);
    for (int64_t r = 0; r < B; r++) p[r] = next_pos[from[r]];
    next_pos = std::move(p);
  };

  std::vector<std::vector<int64_t>> result(B / nb);
  if (scores) {
    scores->sum_logprobs.assign((size_t)(B / nb), 0.0);
    scores->counted.assign((size_t)(B / nb), 0);
    scores->first_logits = Tensor();
  }
  if (max_new == 0) return result;
  auto [ids, mask, pos, next_pos] = left_padded(prompts, L, pad);
  auto t0 = clock::now();
  Tensor logits = step(ids, mask, pos, L);
  if (stats) stats->prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (scores) scores->first_logits = every_nth_row(logits, nb);
  std::vector<bool> done(B, false);
  const bool processors = has_processors(cfg);
  // with processors: each row as Transformers' input_ids holds it (padding, prompt, new tokens)
  std::vector<std::vector<int64_t>> seqs;
  std::vector<float> processed;
  if (processors || nb > 1)
    for (int64_t r = 0; r < B; r++)
      seqs.emplace_back(ids.begin() + r * L, ids.begin() + (r + 1) * L);
  if (nb > 1) {
    std::vector<int64_t> pads(B);
    for (int64_t r = 0; r < B; r++) pads[r] = L - (int64_t)prompts[r].size();
    std::vector<double> best((size_t)(B / nb), 0.0);
    beam_search(
        cfg, B / nb, L, max_new, eos, pads, seqs, logits, result, best, [&](const auto& from) {
          reorder(from, next_pos);
          std::vector<int64_t> tok(B), one(B, 1), p(B);
          for (int64_t r = 0; r < B; r++) tok[r] = seqs[r].back(), p[r] = next_pos[r]++;
          auto t1 = clock::now();
          Tensor out = step(tok, one, p, 1);
          if (stats)
            stats->step_seconds.push_back(std::chrono::duration<double>(clock::now() - t1).count());
          return out;
        });
    if (stats) stats->compiled_signatures = compiled_count_;
    if (scores) scores->sum_logprobs = best;
    return result;
  }
  for (int64_t t = 0;; t++) {
    std::vector<int64_t> tok(B), one(B, 1);
    for (int64_t r = 0; r < B; r++) {
      if (done[r]) {
        tok[r] = pad;
        if (processors) seqs[r].push_back(pad);
        continue;
      }
      double u = cfg.do_sample ? unif(rng) : 0.0;
      const float* row = logits.data<float>() + r * V;
      if (processors) {
        processed.assign(row, row + V);
        process_logits(processed.data(), V, cfg, seqs[r], L - (int64_t)prompts[r].size(), t, eos,
                       L + max_new);
        row = processed.data();
      }
      double logprob = 0;
      tok[r] = pick_token(row, V, cfg, u, scores ? &logprob : nullptr);
      if (scores) {
        scores->sum_logprobs[(size_t)r] += logprob;
        scores->counted[(size_t)r]++;
      }
      result[r].push_back(tok[r]);
      if (processors) seqs[r].push_back(tok[r]);
      if (eos.count(tok[r])) done[r] = true;
    }
    if (t + 1 >= max_new || std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    std::vector<int64_t> p(B);
    for (int64_t r = 0; r < B; r++) p[r] = next_pos[r]++;
    auto t1 = clock::now();
    logits = step(tok, one, p, 1);
    if (stats)
      stats->step_seconds.push_back(std::chrono::duration<double>(clock::now() - t1).count());
  }
  if (stats) stats->compiled_signatures = compiled_count_;
  return result;
}

int64_t padding_token(const GenerationConfig& cfg) {
  return cfg.pad_token_id >= 0        ? cfg.pad_token_id
         : !cfg.eos_token_ids.empty() ? cfg.eos_token_ids[0]
                                      : 0;
}

Tensor Generator::cross_attentions(const std::vector<std::vector<int64_t>>& prompts,
                                   const std::vector<std::vector<int64_t>>& tokens, int64_t pad,
                                   const std::vector<std::pair<int64_t, int64_t>>& heads,
                                   const std::map<std::string, Tensor>& encoder_inputs) {
  ONYX_CHECK(encoder_graph_, "cross_attentions: the model is not an encoder–decoder");
  const int64_t B = (int64_t)prompts.size();
  ONYX_CHECK(B >= 1 && (int64_t)tokens.size() == B, "cross_attentions: ", B, " prompts and ",
             tokens.size(), " token rows");
  const int64_t L = padded_length(prompts, 1, model_.config.vocab_size);
  int64_t N = 0;
  for (const auto& t : tokens) N = std::max(N, (int64_t)t.size());
  ONYX_CHECK(N >= 1, "cross_attentions: no generated tokens");
  if (!cross_graph_ || cross_heads_ != heads) {  // the graph, on the decoder's weights
    models::BuiltModel m = models::build_hf_cross_attentions(model_.config, heads);
    auto g = std::make_shared<ir::Graph>(*m.model.graph);
    for (auto& [name, t] : g->initializers) t = graph_->initializers.at(name);
    cross_graph_ = g;
    cross_heads_ = heads;
    cross_compiled_.reset();
  }
  // the teacher-forced run: prompts (left-padded), then the tokens but the last
  const int64_t T = L + N - 1;
  Prefill p = left_padded(prompts, L, pad);
  std::vector<int64_t> ids((size_t)(B * T), pad), mask((size_t)(B * T), 1), pos((size_t)(B * T));
  for (int64_t r = 0; r < B; r++) {
    for (int64_t i = 0; i < T; i++) {
      const int64_t j = i - L;  // the token's index among the row's new tokens
      ids[r * T + i] = j < 0                           ? p.ids[r * L + i]
                       : j < (int64_t)tokens[r].size() ? tokens[r][j]
                                                       : pad;
      mask[r * T + i] = j < 0 ? p.mask[r * L + i] : 1;
      pos[r * T + i] = j < 0 ? p.pos[r * L + i] : p.next_pos[r] + j;
    }
  }
  std::map<std::string, Tensor> given = encode(encoder_inputs, B, 1);
  given["input_ids"] = Tensor::from_vector<int64_t>(DType::Int64, {B, T}, ids);
  given["position_ids"] = Tensor::from_vector<int64_t>(DType::Int64, {B, T}, pos);
  given["attention_mask"] = Tensor::from_vector<int64_t>(DType::Int64, {B, T}, mask);
  std::vector<int64_t> cp((size_t)T);
  for (int64_t i = 0; i < T; i++) cp[i] = i;
  given["cache_position"] = Tensor::from_vector<int64_t>(DType::Int64, {T}, cp);
  for (int64_t l = 0; l < layers_; l++) {  // an empty cache
    given[cat("past_keys.", l)] = Tensor::zeros(DType::Float32, {B, kv_heads_, head_dim_, 0});
    given[cat("past_values.", l)] = Tensor::zeros(DType::Float32, {B, kv_heads_, 0, head_dim_});
  }
  std::map<std::string, Tensor> feeds;
  std::map<std::string, TensorMeta> sig;
  std::set<std::string> weights;
  for (auto& in : cross_graph_->inputs) {
    feeds[in.name] = given.at(in.name);
    sig[in.name] = feeds[in.name].meta();
  }
  for (auto& [name, t] : cross_graph_->initializers) {
    weights.insert(name);
    auto w = weight_feeds_.find(name);
    if (w != weight_feeds_.end()) feeds[name] = w->second;
  }
  const Compiled& c = compiled_once(cross_compiled_, *cross_graph_, sig, weights);
  for (auto& in : cross_graph_->inputs)  // (the optimized graph drops those it does not read)
    if (!c.graph->find_input(in.name)) feeds.erase(in.name);
  return c.session->run(feeds).at("cross_attentions");
}

}  // namespace onyx::generate
