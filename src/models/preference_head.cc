// models/preference_head.cc — see preference_head.h.
#include "models/preference_head.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "ir/graph.h"
#include "models/loss_graph.h"
#include "onyx/error.h"

namespace onyx::models {

namespace {

// The (chosen, rejected) log-ratios, their counts of completion tokens and log-probabilities a
// loss type reads.
struct Pairs {
  std::string cl, rl, delta;         // log-ratios (B) and Δ = cl − rl
  std::string n_chosen, n_rejected;  // completion tokens per row (B), unshifted, as TRL counts
  std::string chosen_token_sum, chosen_tokens;  // the chosen rows' summed logps, shifted tokens
};

std::string per_pair_loss(Emit& e, const std::string& type, const Pairs& p,
                          const PreferenceLoss& c) {
  const double b = c.beta, ls = c.label_smoothing;
  const std::string bd = e.scale(b, p.delta);
  if (type == "sigmoid") return e.neg(e.logsigmoid(bd));
  if (type == "hinge") return e.op("Relu", {e.sub(e.f32(1.0), bd)});
  if (type == "ipo" || type == "sigmoid_norm") {
    std::string d =
        e.sub(e.div(p.cl, e.at_least_one(p.n_chosen)), e.div(p.rl, e.at_least_one(p.n_rejected)));
    if (type == "sigmoid_norm") return e.neg(e.logsigmoid(e.scale(b, d)));
    return e.square(e.sub(d, e.f32(1.0 / (2.0 * b))));
  }
  if (type == "exo_pair") {
    std::string qw = e.mul(e.sigmoid(bd), e.sub(e.logsigmoid(bd), e.f32(std::log1p(-ls))));
    std::string nbd = e.neg(bd);
    std::string ql = e.mul(e.sigmoid(nbd), e.sub(e.logsigmoid(nbd), e.f32(std::log(ls))));
    return e.add(qw, ql);
  }
  const std::string cr = e.scale(b, p.cl), rr = e.scale(b, p.rl);
  if (type == "nca_pair")
    return e.sub(e.sub(e.neg(e.logsigmoid(cr)), e.scale(0.5, e.logsigmoid(e.neg(cr)))),
                 e.scale(0.5, e.logsigmoid(e.neg(rr))));
  if (type == "robust") {
    std::string clean = e.scale(-(1.0 - ls), e.logsigmoid(bd));
    std::string flipped = e.scale(-ls, e.logsigmoid(e.neg(bd)));
    return e.scale(1.0 / (1.0 - 2.0 * ls), e.sub(clean, flipped));
  }
  if (type == "bco_pair") return e.sub(e.neg(e.logsigmoid(cr)), e.logsigmoid(e.neg(rr)));
  if (type == "sppo_hard")
    return e.add(e.square(e.sub(p.cl, e.f32(0.5 / b))), e.square(e.add(p.rl, e.f32(0.5 / b))));
  if (type == "apo_zero") return e.add(e.sub(e.f32(1.0), e.sigmoid(cr)), e.sigmoid(rr));
  if (type == "apo_down")
    return e.add(e.sigmoid(cr), e.sub(e.f32(1.0), e.sigmoid(e.scale(b, e.sub(p.cl, p.rl)))));
  if (type == "discopop") {
    std::string mod = e.sigmoid(e.scale(1.0 / c.discopop_tau, bd));
    std::string logistic = e.neg(e.logsigmoid(bd));
    std::string expo = e.op("Exp", {e.neg(bd)});
    return e.add(e.mul(logistic, e.sub(e.f32(1.0), mod)), e.mul(expo, mod));
  }
  if (type == "sft")  // the chosen tokens' mean negative log-probability, the same for each pair
    return e.neg(e.div(p.chosen_token_sum, e.at_least_one(p.chosen_tokens)));
  throw Error(cat("loss_type '", type, "' is not built"));
}

}  // namespace

const std::vector<std::string>& preference_loss_types() {
  static const std::vector<std::string> t = {
      "sigmoid",   "hinge",    "ipo",      "exo_pair", "nca_pair", "robust",      "bco_pair",
      "sppo_hard", "apo_zero", "apo_down", "discopop", "sft",      "sigmoid_norm"};
  return t;
}

void check_preference_loss(const PreferenceLoss& c) {
  ONYX_CHECK(!c.loss_type.empty(), "loss_type: at least one loss type");
  for (auto& t : c.loss_type) {
    const auto& known = preference_loss_types();
    if (t == "aot" || t == "aot_unpaired")
      ONYX_UNSUPPORTED("loss_type '", t, "' (it sorts the batch) is not built in onyx");
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      std::string list;
      for (auto& k : known) list += (list.empty() ? "" : ", ") + k;
      throw Error(cat("loss_type '", t, "' is not a DPO loss (", list, ")"));
    }
  }
  ONYX_CHECK(c.loss_weights.empty() || c.loss_weights.size() == c.loss_type.size(),
             "loss_weights: ", c.loss_weights.size(), " weights for ", c.loss_type.size(),
             " loss types");
  ONYX_CHECK(c.beta > 0, "beta must be positive, got ", c.beta);
  ONYX_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 0.5,
             "label_smoothing must be in [0, 0.5), got ", c.label_smoothing);
  ONYX_CHECK(c.discopop_tau > 0, "discopop_tau must be positive, got ", c.discopop_tau);
}

void to_preference_model(Model& m, const PreferenceLoss& cfg) {
  check_preference_loss(cfg);
  ir::Graph& g = *m.graph;
  const LmHead head = take_lm_head(g, "DPO", cfg.disable_dropout);
  for (const char* ref : {"ref_chosen_logps", "ref_rejected_logps"}) add_float_input(g, ref, {-1});
  Emit e{g, "dpo/"};
  // per-token log-probabilities of the shifted rows (2B, T-1)
  const ShiftedScores scores = shifted_scores(e, head, 4);
  const std::string logps = scores.flat[0], entropy = scores.flat[1], mean_logits = scores.flat[2],
                    top1 = scores.flat[3], ls = scores.labels;
  auto rows = [&](const std::string& flat) { return scores.rows(e, flat); };
  std::string seq = e.row_sums(rows(logps));  // (2B)
  std::string half = e.div(e.op("Shape", {seq}), e.i64s({2}));
  auto [chosen, rejected] = e.halves(seq, half);
  e.op("Identity", {chosen}, {}, kChosenLogps);
  e.op("Identity", {rejected}, {}, kRejectedLogps);
  Pairs p;
  p.cl = e.sub(chosen, "ref_chosen_logps");
  p.rl = e.sub(rejected, "ref_rejected_logps");
  p.delta = e.sub(p.cl, p.rl);
  // completion tokens: unshifted per row (TRL's completion_mask.sum), shifted for the metrics
  std::tie(p.n_chosen, p.n_rejected) = e.halves(e.row_sums(e.not_ignored("labels")), half);
  std::string shifted_mask = e.not_ignored(ls);
  auto [chosen_tok, rejected_tok] = e.halves(e.row_sums(shifted_mask), half);
  p.chosen_tokens = e.total(chosen_tok);
  p.chosen_token_sum = e.total(chosen);
  std::string loss;
  for (size_t k = 0; k < cfg.loss_type.size(); k++) {
    const double w = cfg.loss_weights.empty() ? 1.0 : cfg.loss_weights[k];
    std::string term = e.scale(w, e.mean(per_pair_loss(e, cfg.loss_type[k], p, cfg)));
    loss = loss.empty() ? term : e.add(loss, term);
  }
  e.op("Identity", {loss}, {}, "loss");
  // TRL's metrics (no gradient flows from them: nothing differentiates them but the loss's path)
  const std::string rc = e.scale(cfg.beta, p.cl), rj = e.scale(cfg.beta, p.rl);
  std::vector<std::pair<std::string, std::string>> metrics = {
      {"rewards/chosen", e.mean(rc)},
      {"rewards/rejected", e.mean(rj)},
      {"rewards/accuracies", e.mean(e.to_f32(e.op("Greater", {rc, rj})))},
      {"rewards/margins", e.mean(e.sub(rc, rj))},
      {"logps/chosen", e.mean(chosen)},
      {"logps/rejected", e.mean(rejected)}};
  auto [ml_chosen, ml_rejected] = e.halves(e.row_sums(rows(mean_logits)), half);
  metrics.push_back({"logits/chosen", e.div(e.total(ml_chosen), e.at_least_one(p.chosen_tokens))});
  metrics.push_back(
      {"logits/rejected", e.div(e.total(ml_rejected), e.at_least_one(e.total(rejected_tok)))});
  auto top1_chosen = e.halves(e.row_sums(rows(e.to_f32(top1))), half).first;
  metrics.push_back(
      {"mean_token_accuracy", e.div(e.total(top1_chosen), e.at_least_one(p.chosen_tokens))});
  metrics.push_back({"entropy", e.div(e.total(entropy), e.at_least_one(e.total(shifted_mask)))});
  auto output = [&](const std::string& name, Shape shape) { add_float_output(g, name, shape); };
  output("loss", {});
  m.logged_outputs.clear();
  for (auto& [name, value] : metrics) {
    e.op("Identity", {value}, {}, name);
    output(name, {});
    m.logged_outputs.push_back(name);
  }
  output(kChosenLogps, {-1});
  output(kRejectedLogps, {-1});
  m.loss = autodiff::LossSpec{};
  m.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
  m.loss.output = "loss";
  m.logs_num_tokens = true;
  m.items_labels.clear();  // a mean over pairs: micro-batches weigh equally, as TRL's
  m.items_shifted = false;
  m.predictions = kChosenLogps;
  // The reference inputs are filled with zeros where a batch has none (the reference pass itself,
  // which reads only chosen_logps / rejected_logps); the trainer fills the dataset first.
  m.optional_inputs.insert("ref_chosen_logps");
  m.optional_inputs.insert("ref_rejected_logps");
  auto previous = m.fill_defaults;
  m.fill_defaults = [previous](std::map<std::string, Tensor>& batch) {
    if (previous) previous(batch);
    auto ids = batch.find("input_ids");
    if (ids == batch.end()) return;
    const int64_t B = ids->second.dim(0) / 2;
    for (const char* ref : {"ref_chosen_logps", "ref_rejected_logps"})
      if (!batch.count(ref)) batch[ref] = Tensor::zeros(DType::Float32, {B});
  };
}

}  // namespace onyx::models
