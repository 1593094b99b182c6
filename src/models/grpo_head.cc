// models/grpo_head.cc — see grpo_head.h.
#include "models/grpo_head.h"

#include <algorithm>
#include <limits>

#include "models/loss_graph.h"

namespace onyx::models {

namespace {

// Each row's mean of a 0/1 value over its completion tokens, reduced over the rows with `op`
// (ReduceMin / ReduceMax), rows without tokens left out (TRL's nanmin / nanmax: NaN when no row
// has one); `none` is what a row without tokens counts as (+inf for a minimum, -inf for a maximum).
std::string row_extreme(Emit& e, const std::string& flags, const std::string& mask,
                        const std::string& op, double none) {
  std::string n = e.row_sums(mask);
  std::string mean = e.div(e.row_sums(e.mul(flags, mask)), e.at_least_one(n));
  std::string kept = e.op("Where", {e.op("Greater", {n, e.f32(0)}), mean, e.f32(none)});
  std::string r = e.op(op, {kept}, {{"keepdims", ir::Attribute::of_int(0)}});
  return e.op("Where", {e.op("Equal", {r, e.f32(none)}),
                        e.f32(std::numeric_limits<double>::quiet_NaN()), r});
}

// The per-token loss's aggregate by loss type.
std::string aggregate(Emit& e, const GrpoLoss& c, const std::string& masked,
                      const std::string& mask) {
  if (c.loss_type == "grpo")
    return e.mean(e.div(e.row_sums(masked), e.at_least_one(e.row_sums(mask))));
  if (c.loss_type == "dr_grpo")
    return e.scale(1.0 / (double)c.max_completion_length, e.mean(e.row_sums(masked)));
  return e.div(e.total(masked), e.at_least_one(e.total(mask)));  // bnpo, dapo
}

}  // namespace

const std::vector<std::string>& grpo_loss_types() {
  static const std::vector<std::string> t = {"dapo", "grpo", "bnpo", "dr_grpo"};
  return t;
}

void check_grpo_loss(const GrpoLoss& c) {
  const auto& known = grpo_loss_types();
  if (std::find(known.begin(), known.end(), c.loss_type) == known.end()) {
    for (const char* other : {"cispo", "sapo", "luspo", "vespo"})
      if (c.loss_type == other)
        ONYX_UNSUPPORTED("loss_type '", c.loss_type,
                         "' is not built in onyx (dapo, grpo, bnpo, "
                         "dr_grpo)");
    throw Error(
        cat("loss_type '", c.loss_type, "' is not a GRPO loss (dapo, grpo, bnpo, dr_grpo)"));
  }
  ONYX_CHECK(c.beta >= 0, "beta must be >= 0, got ", c.beta);
  ONYX_CHECK(c.epsilon >= 0 && c.epsilon < 1, "epsilon must be in [0, 1), got ", c.epsilon);
  ONYX_CHECK(c.epsilon_high >= 0, "epsilon_high must be >= 0, got ", c.epsilon_high);
  ONYX_CHECK(c.temperature > 0, "temperature must be positive, got ", c.temperature);
  ONYX_CHECK(c.max_completion_length > 0, "max_completion_length must be positive, got ",
             c.max_completion_length);
}

void to_grpo_model(Model& m, const GrpoLoss& cfg) {
  check_grpo_loss(cfg);
  ir::Graph& g = *m.graph;
  const LmHead head = take_lm_head(g, "GRPO", cfg.disable_dropout);
  add_float_input(g, "advantages", {-1});
  if (cfg.old_logps_input) add_float_input(g, "old_logps", {-1, -1});
  if (cfg.beta != 0) add_float_input(g, "ref_logps", {-1, -1});
  Emit e{g, "grpo/"};
  // per-token log-probabilities and entropies of the shifted rows (B, T-1)
  const ShiftedScores scores = shifted_scores(e, head, 2, cfg.temperature);
  const std::string flat_logps = scores.flat[0], flat_entropy = scores.flat[1], ls = scores.labels;
  auto rows = [&](const std::string& flat) { return scores.rows(e, flat); };
  const std::string logp = e.op("Identity", {rows(flat_logps)}, {}, kTokenLogps);
  const std::string mask = e.not_ignored(ls);
  const std::string old =
      cfg.old_logps_input ? "old_logps" : e.op("StopGradient", {logp}, {}, "", "onyx");
  const std::string ratio = e.op("Exp", {e.sub(logp, old)});
  const std::string clipped =
      e.op("Clip", {ratio, e.f32(1.0 - cfg.epsilon), e.f32(1.0 + cfg.epsilon_high)});
  const std::string adv = e.op("Unsqueeze", {"advantages", e.i64s({1})});
  std::string per_token = e.neg(e.op("Min", {e.mul(ratio, adv), e.mul(clipped, adv)}));
  std::string kl;
  if (cfg.beta != 0) {
    const std::string d = e.sub("ref_logps", logp);
    kl = e.sub(e.sub(e.op("Exp", {d}), d), e.f32(1.0));
    if (cfg.use_bias_correction_kl) kl = e.mul(kl, ratio);
    per_token = e.add(per_token, e.scale(cfg.beta, kl));
  }
  e.op("Identity", {aggregate(e, cfg, e.mul(per_token, mask), mask)}, {}, "loss");
  // TRL's metrics (no gradient flows from them: nothing differentiates them but the loss's path)
  const std::string tokens = e.at_least_one(e.total(mask));
  auto masked_mean = [&](const std::string& x) { return e.div(e.total(e.mul(x, mask)), tokens); };
  const std::string low =
      e.op("And", {e.op("Less", {ratio, e.f32(1.0 - cfg.epsilon)}), e.op("Less", {adv, e.f32(0)})});
  const std::string high = e.op("And", {e.op("Greater", {ratio, e.f32(1.0 + cfg.epsilon_high)}),
                                        e.op("Greater", {adv, e.f32(0)})});
  const std::string low_f = e.to_f32(low), high_f = e.to_f32(high);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<std::string, std::string>> metrics;
  if (cfg.beta != 0) metrics.push_back({"kl", masked_mean(kl)});
  metrics.push_back({"entropy", masked_mean(rows(flat_entropy))});
  metrics.push_back({"clip_ratio/low_mean", masked_mean(low_f)});
  metrics.push_back({"clip_ratio/low_min", row_extreme(e, low_f, mask, "ReduceMin", inf)});
  metrics.push_back({"clip_ratio/high_mean", masked_mean(high_f)});
  metrics.push_back({"clip_ratio/high_max", row_extreme(e, high_f, mask, "ReduceMax", -inf)});
  metrics.push_back({"clip_ratio/region_mean", masked_mean(e.to_f32(e.op("Or", {low, high})))});
  add_float_output(g, "loss", {});
  m.logged_outputs.clear();
  for (auto& [name, value] : metrics) {
    e.op("Identity", {value}, {}, name);
    add_float_output(g, name, {});
    m.logged_outputs.push_back(name);
  }
  add_float_output(g, kTokenLogps, {-1, -1});
  m.loss = autodiff::LossSpec{};
  m.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
  m.loss.output = "loss";
  // dapo: micro-batches weigh by their completion tokens; the others equally (TRL divides their
  // losses by the accumulation steps)
  m.items_labels = cfg.loss_type == "dapo" ? "labels" : "";
  m.zero_items_ok = true;  // every completion masked: a zero loss (the clamped count), as TRL's
  m.items_shifted = true;
  m.items_ignore_index = -100;
  m.predictions = kTokenLogps;
  // The rollout's own passes (old policy, reference) read only token_logps: what they lack is
  // filled with zeros.
  for (const char* in : {"advantages", "old_logps", "ref_logps"}) m.optional_inputs.insert(in);
  auto previous = m.fill_defaults;
  const bool old_in = cfg.old_logps_input, ref_in = cfg.beta != 0;
  m.fill_defaults = [previous, old_in, ref_in](std::map<std::string, Tensor>& batch) {
    if (previous) previous(batch);
    auto ids = batch.find("input_ids");
    if (ids == batch.end()) return;
    const int64_t B = ids->second.dim(0), T = ids->second.dim(1);
    if (!batch.count("advantages")) batch["advantages"] = Tensor::zeros(DType::Float32, {B});
    for (auto [name, wanted] : {std::pair{"old_logps", old_in}, std::pair{"ref_logps", ref_in}})
      if (wanted && !batch.count(name))
        batch[name] = Tensor::zeros(DType::Float32, {B, std::max<int64_t>(T - 1, 0)});
  };
}

}  // namespace onyx::models
