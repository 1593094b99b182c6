// train/training_session.h — forward + backward of one model over flat parameter and gradient
// buffers. The training graph is built once per input signature and cached (DESIGN decision 2);
// each step binds every parameter gradient to its view of the flat gradient buffer, so gradients
// land there directly, overwritten or accumulated (gradient accumulation needs no extra buffer).
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "autodiff/gradient.h"
#include "passes/pass.h"
#include "runtime/session.h"
#include "train/flat_buffer.h"

namespace onyx::train {

class TrainingSession {
 public:
  TrainingSession(std::shared_ptr<const ir::Graph> forward, autodiff::GradientOptions opts);

  const std::vector<std::string>& parameters() const { return params_; }
  FlatBuffer& params() { return param_buf_; }
  FlatBuffer& grads() { return grad_buf_; }

  // One forward + backward on `batch` (graph inputs and labels by name). Gradients are written
  // into grads() (added to what is there when `accumulate`). Returns the loss.
  double forward_backward(const std::map<std::string, Tensor>& batch, bool accumulate,
                          uint64_t seed = 0, bool training = true);
  // Forward only (evaluation): the forward graph with the loss appended, no backward work.
  // Returns every forward output, plus the loss under the key "loss" when the batch has what the
  // loss needs (labels); without labels only the model's outputs are computed.
  std::map<std::string, Tensor> forward(const std::map<std::string, Tensor>& batch);
  const autodiff::GradientOptions& options() const { return opts_; }
  const std::shared_ptr<const ir::Graph>& forward_graph() const { return forward_; }

  size_t cached_graphs() const { return graphs_.size(); }
  double last_build_ms() const { return last_build_ms_; }
  const autodiff::TrainingGraph& training_graph_for(const std::map<std::string, Tensor>& batch);
  // What the optimization passes did to the graph of this batch's signature.
  const passes::PassReport& pass_report_for(const std::map<std::string, Tensor>& batch) {
    return compiled_for(batch).report;
  }
  // Graph optimization (passes) on or off; off also with ONYX_PASSES=0 in the environment.
  void set_optimize(bool on) {
    optimize_ = on;
    graphs_.clear();
    eval_graphs_.clear();
  }
  void set_pass_options(const passes::OptimizeOptions& o) {
    pass_opts_ = o;
    graphs_.clear();
    eval_graphs_.clear();
  }
  const passes::OptimizeOptions& pass_options() const { return pass_opts_; }
  // Frees the sessions' activation arenas (each comes back on its session's next run): the
  // evaluation ones after an evaluation pass, the training ones too when training ends.
  void release_activation_memory(bool training_too) {
    for (auto& [k, c] : eval_graphs_) c.session->release_arena();
    if (forward_session_) forward_session_->release_arena();
    if (training_too)
      for (auto& [k, c] : graphs_) c.session->release_arena();
  }
  // Planned bytes of one training step at this batch: activation peak + parameters + gradients
  // + `optimizer_buffers` moment buffers of the parameters' size.
  double planned_step_bytes(const std::map<std::string, Tensor>& batch, int optimizer_buffers);
  // Planned activation bytes alone (the arena's peak).
  double planned_activation_bytes(const std::map<std::string, Tensor>& batch);
  // The runtime plan of the training graph for this batch's signature (built, not run).
  const runtime::Plan& plan_for(const std::map<std::string, Tensor>& batch);

 private:
  struct Compiled {
    autodiff::TrainingGraph tg;
    std::unique_ptr<runtime::Session> session;
    passes::PassReport report;
  };
  Compiled& compiled_for(const std::map<std::string, Tensor>& batch);

  std::shared_ptr<const ir::Graph> forward_;
  autodiff::GradientOptions opts_;
  std::vector<std::string> params_;
  FlatBuffer param_buf_, grad_buf_;
  std::map<std::string, Compiled> graphs_;
  std::unique_ptr<runtime::Session> forward_session_;
  struct EvalCompiled {
    autodiff::LossGraph lg;
    std::unique_ptr<runtime::Session> session;
  };
  std::map<std::string, EvalCompiled> eval_graphs_;
  double last_build_ms_ = 0;
  bool optimize_ = true;
  passes::OptimizeOptions pass_opts_;
};

}  // namespace onyx::train
