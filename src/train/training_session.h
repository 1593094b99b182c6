// train/training_session.h — forward + backward of one model over flat parameter and gradient
// buffers. The training graph is built once per input signature and cached (DESIGN decision 2);
// each step binds every parameter gradient to its view of the flat gradient buffer, so gradients
// land there directly, overwritten or accumulated (gradient accumulation needs no extra buffer).
//
// BatchNormalization running statistics (autodiff::batch_norm_buffers: initializers read only as
// a BatchNormalization's input_mean / input_var) are buffers, as in PyTorch: not trained, held in
// buffers() and fed to every run like the parameters. A training-mode BatchNormalization
// (training_mode=1) reading one has its updated statistics (outputs 1, 2: input * momentum +
// batch statistic * (1 - momentum)) as outputs of the training graph, copied back into the
// buffer after each forward_backward — once per micro-batch, the next one reading the updated
// values, as PyTorch's model.train() forward does. Evaluation (forward()) runs the graph with
// every BatchNormalization in inference mode (passes::batch_norm_to_inference), normalizing with
// the buffers, as PyTorch's model.eval().
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "autodiff/gradient.h"
#include "kernels/cpu/gemm.h"
#include "passes/pass.h"
#include "runtime/session.h"
#include "train/flat_buffer.h"

namespace onyx::train {

class TrainingSession {
 public:
  TrainingSession(std::shared_ptr<const ir::Graph> forward, autodiff::GradientOptions opts);
  ~TrainingSession();  // (forgets its weights' packs: kernels::forget_stable_weights)
  TrainingSession(const TrainingSession&) = delete;
  TrainingSession& operator=(const TrainingSession&) = delete;

  const std::vector<std::string>& parameters() const { return params_; }
  // The parameters. Writing them through this reference is allowed: each call marks the bf16
  // shadow (below) for a refresh before the next run.
  FlatBuffer& params() {
    weights_may_change();
    return param_buf_;
  }
  const FlatBuffer& params() const { return param_buf_; }
  // Mixed precision's bf16 copy of the parameters, in params()' layout, that the training
  // graphs' GEMMs read (OptimizeOptions::bf16_weights), or nullptr while no graph reads one.
  // Before each run it is rounded again from params() if params() may have changed since (a
  // non-const params() call, load_weights); an optimizer step that writes it over the whole
  // buffer (Optimizer::step's bf16_shadow) then calls bf16_shadow_written(), which makes that
  // second pass over the weights unnecessary.
  FlatBuffer* bf16_shadow() {
    if (!shadow_.flat().defined()) return nullptr;
    shadow_may_change();
    return &shadow_;
  }
  void bf16_shadow_written() { shadow_fresh_ = shadow_.flat().defined(); }
  // The weights were (or may have been) written through a view kept from earlier: the shadow is
  // rounded again before the next run.
  void weights_changed() { weights_may_change(); }
  // TrainingArguments.bf16_full_eval (evaluation and prediction outside training, as Transformers
  // casts the model with model.to(torch.bfloat16) there): forward() reads the trained parameters,
  // the frozen weights and the float BatchNorm running statistics rounded to bf16 (round to
  // nearest even; float32 copies of the rounded values, made on the first such run and freed by
  // release_activation_memory) and gives the GEMMs bf16 inputs. The tensors themselves are not
  // changed.
  void set_bf16_full_eval(bool on) {
    set_full_eval(on ? kernels::LowPrecision::Bf16 : kernels::LowPrecision::None);
  }
  bool bf16_full_eval() const { return full_eval_ == kernels::LowPrecision::Bf16; }
  // TrainingArguments.fp16_full_eval (model.half() in Transformers' evaluation_loop): the same with
  // float16 (emulated).
  void set_fp16_full_eval(bool on) {
    set_full_eval(on ? kernels::LowPrecision::Fp16 : kernels::LowPrecision::None);
  }
  bool fp16_full_eval() const { return full_eval_ == kernels::LowPrecision::Fp16; }
  kernels::LowPrecision full_eval() const { return full_eval_; }
  void set_full_eval(kernels::LowPrecision f) {
    if (f != full_eval_) rounded_fresh_ = false, rounded_frozen_.clear();
    full_eval_ = f;
  }
  FlatBuffer& grads() { return grad_buf_; }
  // BatchNormalization running statistics (see the header comment), by initializer name; each
  // tensor owns its storage and is updated in place.
  const std::map<std::string, Tensor>& buffers() const { return buffers_; }
  Tensor& buffer(const std::string& name) { return buffers_.at(name); }
  // Copies every parameter and buffer from `weights` (a model.safetensors), which must have each
  // with the same dtype and shape; `what` names the source in errors.
  void load_weights(const std::map<std::string, Tensor>& weights, const std::string& what);
  // running_var updated with the unbiased batch variance (N - 1), as PyTorch's BatchNorm does,
  // instead of ONNX's population variance (the default). Config: batch_norm_running_var.
  void set_unbiased_running_var(bool on) {
    unbiased_var_ = on;
    graphs_.clear();
  }
  bool unbiased_running_var() const { return unbiased_var_; }

  // One forward + backward on `batch` (graph inputs and labels by name). Gradients are written
  // into grads() (added to what is there when `accumulate`); the running statistics of
  // training-mode BatchNormalizations are written into buffers(). Returns the loss. `into`
  // (a buffer of grads()' layout) receives the gradients instead of grads().
  // `on_grad_ready(param)` is called during backward as soon as a parameter's gradient is
  // final, for the parameters early_gradients() lists. `kept` receives the scalar values of the
  // options' keep_outputs (Model::logged_outputs: TRL's DPO metrics).
  double forward_backward(const std::map<std::string, Tensor>& batch, bool accumulate,
                          uint64_t seed = 0, bool training = true, FlatBuffer* into = nullptr,
                          const std::function<void(const std::string&)>& on_grad_ready = {},
                          std::map<std::string, double>* kept = nullptr);
  // Parameters whose gradient this batch's backward writes once and no later node reads (so it
  // is final when written: forward_backward reports them), and those with a gradient that is
  // final only when forward_backward returns.
  struct GradientTiming {
    std::vector<std::string> early, late;
  };
  const GradientTiming& gradient_timing(const std::map<std::string, Tensor>& batch);
  // Forward only (evaluation): the forward graph with the loss appended, no backward work.
  // Returns every forward output, plus the loss under the key "loss" when the batch has what the
  // loss needs (labels); without labels only the model's outputs are computed. Both are
  // optimized as the training graphs are (fusions; under bf16 the mixed_precision pass) and
  // compiled once per batch signature.
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
    const bool bf16 = pass_opts_.bf16;  // set by set_bf16_gemm
    pass_opts_ = o;
    pass_opts_.bf16 = bf16;
    graphs_.clear();
    eval_graphs_.clear();
  }
  const passes::OptimizeOptions& pass_options() const { return pass_opts_; }
  // Mixed precision (TrainingArguments.bf16): every run of this session's graphs, training and
  // evaluation, gives the GEMM kernels bf16 inputs (runtime::RunOptions::bf16_gemm), and the
  // training graphs and the evaluation graphs with a loss store their GEMM operands in bf16
  // (OptimizeOptions::bf16, the mixed_precision pass; with optimization on). `store_bf16` false
  // leaves the graphs float32 (the per-call rounding alone: what the pass must reproduce bit for
  // bit).
  void set_bf16_gemm(bool on, bool store_bf16 = true) {
    bf16_gemm_ = on;
    if (pass_opts_.bf16 != (on && store_bf16)) {
      pass_opts_.bf16 = on && store_bf16;
      graphs_.clear();
      eval_graphs_.clear();
    }
  }
  bool bf16_gemm() const { return bf16_gemm_; }
  // TrainingArguments.fp16: every run of this session's graphs gives the GEMM-class kernels
  // float16-rounded inputs (RunOptions::fp16_gemm; emulated, float32 GEMMs). No graph rewrite:
  // the rounding happens per call. Not together with set_bf16_gemm(true).
  void set_fp16_gemm(bool on) { fp16_gemm_ = on; }
  bool fp16_gemm() const { return fp16_gemm_; }
  // Frees the sessions' activation arenas (each comes back on its session's next run): the
  // evaluation ones after an evaluation pass, the training ones too when training ends.
  void release_activation_memory(bool training_too) {
    rounded_ = FlatBuffer();  // bf16_full_eval's / fp16_full_eval's rounded weights
    rounded_other_.clear();
    rounded_frozen_.clear();
    rounded_fresh_ = false;
    for (auto& [k, c] : eval_graphs_) c.session->release_arena();
    if (training_too)
      for (auto& [k, c] : graphs_) c.session->release_arena();
  }
  // Planned bytes of one training step at this batch: activation peak + parameters + gradients
  // + `optimizer_buffers` moment buffers of the parameters' size + the weights that are not
  // trained and the constants, as stored (float32, bf16 or 4-bit).
  double planned_step_bytes(const std::map<std::string, Tensor>& batch, int optimizer_buffers);
  // Planned activation bytes alone (the arena's peak).
  double planned_activation_bytes(const std::map<std::string, Tensor>& batch);
  // The runtime plan of the training graph for this batch's signature (built, not run).
  const runtime::Plan& plan_for(const std::map<std::string, Tensor>& batch);

 private:
  // Every id of an input that indexes an embedding table lies inside it (else an error naming
  // the input, row and position).
  void check_embedding_inputs(const std::map<std::string, Tensor>& batch) const;
  std::map<std::string, std::pair<std::string, int64_t>> embedding_inputs_;  // input -> table, rows
  // NaN anywhere, or an infinity when `no_infinity`, in a float32 tensor is an error naming it.
  static void check_finite(const Tensor& t, const std::string& name, const char* what,
                           bool no_infinity);
  struct Compiled {
    autodiff::TrainingGraph tg;
    std::unique_ptr<runtime::Session> session;
    passes::PassReport report;
    std::vector<std::pair<std::string, std::string>> stat_outputs;  // (graph output, buffer)
    GradientTiming timing;
    std::map<std::string, std::string> param_of_grad;  // gradient output -> parameter (early)
    std::vector<std::string> shadowed;                 // parameters read through their bf16 shadow
    // tied weights whose second gradient contribution adds through passes::tied_gradient_output
    std::vector<std::pair<std::string, std::string>> tied;  // (parameter, gradient value)
  };
  // Feeds of one run: the batch's graph inputs, parameters, buffers and bf16 shadow views.
  std::map<std::string, Tensor> feeds_for(const Compiled& c,
                                          const std::map<std::string, Tensor>& batch);
  // Names and outputs the updated statistics of g's training-mode BatchNormalizations that read a
  // buffer (graph outputs appended); returns (output, buffer) pairs.
  std::vector<std::pair<std::string, std::string>> expose_running_stats(ir::Graph& g) const;
  std::set<std::string> variables() const;  // parameters and buffers: fed, never folded
  Compiled& compiled_for(const std::map<std::string, Tensor>& batch);

  std::shared_ptr<const ir::Graph> forward_;
  autodiff::GradientOptions opts_;
  std::vector<std::string> params_;
  FlatBuffer param_buf_, grad_buf_;
  FlatBuffer shadow_;          // bf16 (see bf16_shadow()); allocated when a graph reads it
  bool shadow_fresh_ = false;  // shadow_ holds params() rounded
  // Prepacked weights (kernels::declare_stable_weights): each run declares params() and the
  // shadow stable under these versions, new ones (kernels::new_weights_version) after anything
  // that may have written them; 0 = to be numbered at the next run. A writable reference handed
  // out makes the range unstable at once (kernels::unstable_weights), so no GEMM reads a pack of
  // older values.
  uint64_t params_version_ = 0, shadow_version_ = 0;
  void weights_may_change();  // params(), load_weights, weights_changed
  void shadow_may_change();   // bf16_shadow()
  void declare_stable_params();
  // bf16_full_eval / fp16_full_eval: params() rounded to that format and widened back
  // (allocated while evaluating)
  kernels::LowPrecision full_eval_ = kernels::LowPrecision::None;
  bool fp16_gemm_ = false;
  FlatBuffer rounded_;
  std::map<std::string, Tensor> rounded_other_;   // the float buffers_, rounded with rounded_
  std::map<std::string, Tensor> rounded_frozen_;  // opts_.frozen's float weights, rounded
  bool rounded_fresh_ = false;
  // forward()'s parameter feeds: views of params(), or of rounded_ under bf16_full_eval, and
  // the bf16 shadow's views for the `shadowed` parameters
  void feed_eval_params(std::map<std::string, Tensor>& feeds, runtime::RunOptions& ro,
                        const std::vector<std::string>& shadowed = {});
  // The graph inputs bf16_weight_input(p) of the `shadowed` parameters: views of the bf16 shadow
  // (allocated on first use), rounded again from params() first when it may be stale.
  void feed_shadow(const std::vector<std::string>& shadowed, std::map<std::string, Tensor>& feeds);
  void allocate_shadow();
  std::map<std::string, Tensor> buffers_;
  bool unbiased_var_ = false;
  std::map<std::string, Compiled> graphs_;
  struct EvalCompiled {
    autodiff::LossGraph lg;
    std::unique_ptr<runtime::Session> session;
    std::vector<std::string> shadowed;  // parameters read through the bf16 shadow (bf16)
  };
  std::map<std::string, EvalCompiled> eval_graphs_;
  double last_build_ms_ = 0;
  bool optimize_ = true;
  passes::OptimizeOptions pass_opts_;
  bool bf16_gemm_ = false;
};

// model.to(torch.bfloat16) (model.half()), which bf16_full_eval (fp16_full_eval) runs, casts every
// floating buffer, rotary embeddings' inv_freq too: a copy of `g` whose inv_freq holds those
// values widened (an initializer "*inv_freq", or a Constant output so named, as models/llama.cc
// names it). The evaluation graphs and predict_with_generate's decoder both use it.
std::shared_ptr<ir::Graph> with_rounded_rotary_frequencies(const ir::Graph& g,
                                                           kernels::LowPrecision f);

}  // namespace onyx::train
