// train/trainer_steps.cc — the Trainer driven one step at a time by its caller (the C API,
// include/onyx/onyx_c.h; ONNX Runtime's on-device TrainStep / OptimizerStep / LazyResetGrad):
// train_step's gradients are summed until optimizer_step applies them with the run's optimizer,
// clipping and schedule (or a learning rate the caller set). No dataset, output folder or
// callback takes part.
#include "train/trainer_internal.h"

namespace onyx {
namespace {

// The caller's batch with the inputs the model fills by default (Model::fill_defaults), each
// graph input checked against the graph's dtype, rank and fixed dimensions first: a wrong
// input is named here rather than by the kernel that first reads it.
std::map<std::string, Tensor> checked_batch(const Model& model,
                                            const std::map<std::string, Tensor>& inputs) {
  for (const ir::ValueInfo& v : model.graph->inputs) {
    auto it = inputs.find(v.name);
    if (it == inputs.end()) continue;
    const Tensor& t = it->second;
    ONYX_CHECK(v.dtype == DType::Undefined || t.dtype() == v.dtype, "input '", v.name, "' is ",
               dtype_name(t.dtype()), "; the model's input is ", dtype_name(v.dtype));
    if (!v.has_shape) continue;
    bool fits = (size_t)t.rank() == v.shape.size();
    for (size_t d = 0; fits && d < v.shape.size(); d++)
      fits = v.shape[d] < 0 || v.shape[d] == t.dim((int)d);
    ONYX_CHECK(fits, "input '", v.name, "' has shape ", shape_str(t.shape()),
               "; the model's input has shape ", shape_str(v.shape), " (-1: any)");
  }
  std::map<std::string, Tensor> batch = inputs;
  if (model.fill_defaults) model.fill_defaults(batch);
  return batch;
}

}  // namespace

void Trainer::begin_steps() {
  auto& I = *impl_;
  if (I.steps_begun) return;
  // the schedule as train() sets it up, over max_steps (none given: a constant learning rate)
  I.sched = train::ScheduleConfig();
  I.sched.type = args_.max_steps > 0 ? args_.lr_scheduler_type : "constant";
  I.sched.warmup_steps = args_.warmup_steps;
  I.sched.warmup_ratio = args_.warmup_ratio;
  I.sched.total_steps = std::max<int64_t>(args_.max_steps, 1);
  I.sched.base_lr = args_.learning_rate;
  train::apply_scheduler_kwargs(I.sched, args_.lr_scheduler_kwargs);
  I.metric_lr = train::MetricLrState();
  I.steps_begun = true;
}

double Trainer::train_step(const std::map<std::string, Tensor>& inputs) {
  auto& I = *impl_;
  begin_steps();
  const std::map<std::string, Tensor> batch = checked_batch(model_, inputs);
  // a dropout seed per (step, micro-batch), as the training loop derives it
  const uint64_t seed = (uint64_t)args_.seed * 1000003ull + (uint64_t)state_.global_step * 131ull +
                        (uint64_t)I.step_micro_batches;
  const double loss = I.ts->forward_backward(batch, /*accumulate=*/I.step_micro_batches > 0, seed);
  I.step_micro_batches++;
  return loss;
}

void Trainer::optimizer_step() {
  auto& I = *impl_;
  begin_steps();
  ONYX_CHECK(I.step_micro_batches > 0,
             "optimizer_step: no train_step since the last optimizer step or gradient reset");
  apply_gradients();
  state_.global_step++;
  I.step_micro_batches = 0;
}

void Trainer::reset_gradients() { impl_->step_micro_batches = 0; }

double Trainer::learning_rate() {
  auto& I = *impl_;
  begin_steps();
  return I.lr_override ? *I.lr_override : train::lr_at(I.sched, state_.global_step, &I.metric_lr);
}

void Trainer::set_learning_rate(double lr) {
  ONYX_CHECK(std::isfinite(lr) && lr >= 0, "set_learning_rate: ", lr,
             " is not a learning rate (finite, >= 0)");
  impl_->lr_override = lr;
}

void Trainer::set_generation_kwargs(std::optional<int64_t> max_length,
                                    std::optional<int64_t> max_new_tokens,
                                    std::optional<int64_t> num_beams) {
  for (auto [v, key] : {std::pair{max_length, "max_length"},
                        {max_new_tokens, "max_new_tokens"},
                        {num_beams, "num_beams"}})
    ONYX_CHECK(!v || *v >= 1, "generation kwargs: ", key, " must be >= 1, got ", *v);
  args_.generation_max_length = max_length;
  args_.generation_max_new_tokens = max_new_tokens;
  args_.generation_num_beams = num_beams;
}

double Trainer::eval_step(const std::map<std::string, Tensor>& inputs) {
  auto out = impl_->ts->forward(checked_batch(model_, inputs));
  auto it = out.find("loss");
  ONYX_CHECK(
      it != out.end(), "eval_step: the batch has no labels for the loss (inputs: ",
      [&] {
        std::string s;
        for (auto& [k, v] : inputs) s += (s.empty() ? "" : ", ") + k;
        return s;
      }(),
      ")");
  return it->second.get_as_double(0);
}

}  // namespace onyx
