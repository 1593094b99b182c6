// trainer.cc — the training loop with Transformers' semantics: gradient accumulation, clipping,
// schedules, logging/eval/save strategies, checkpoint rotation that keeps the best, load best at
// end, and exact resume (parameters, optimizer moments, schedule, data order, RNG, partial loss
// accumulators and the log all come back bit for bit). Here: the constructor, train() — the loop
// (train_loop) and its parts: start_training, accumulate_gradients (one step's micro-batches),
// apply_gradients (the update), maybe_log_save_evaluate, finish_training — log() and
// fit_batch_to_memory(). metrics.cc holds the built-in metrics, checkpoint.cc the state and
// checkpoint files, evaluate.cc evaluate() / predict().
#include "onyx/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "autodiff/coverage.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "io/safetensors.h"
#include "kernels/cpu/gemm.h"
#include "train/grpo.h"
#include "train/tensorboard.h"
#include "train/trainer_internal.h"

namespace fs = std::filesystem;

namespace onyx {

Trainer::Trainer(Model model, TrainingArguments args, std::shared_ptr<data::Dataset> train_dataset,
                 std::shared_ptr<data::Dataset> eval_dataset, ComputeMetrics compute_metrics,
                 std::vector<std::shared_ptr<TrainerCallback>> callbacks)
    : model_(std::move(model)),
      args_(std::move(args)),
      train_ds_(std::move(train_dataset)),
      eval_ds_(std::move(eval_dataset)),
      compute_metrics_(std::move(compute_metrics)),
      callbacks_(std::move(callbacks)),
      impl_(std::make_unique<Impl>()) {
  args_.validate();
  // report_to tensorboard / all: Transformers' TensorBoardCallback, attached as Transformers
  // attaches it from report_to (for the CLI and the Python package alike), unless one is given
  if (train::reports_to_tensorboard(args_) &&
      std::none_of(callbacks_.begin(), callbacks_.end(), [](auto& c) {
        return dynamic_cast<train::TensorBoardCallback*>(c.get()) != nullptr;
      }))
    callbacks_.push_back(std::make_shared<train::TensorBoardCallback>(model_.config_json));
  ONYX_CHECK(model_.graph, "Trainer: the model has no graph");
  if (args_.predict_with_generate)
    ONYX_CHECK(
        !model_.config_json.empty() && (model_.items_shifted || model_.sums_micro_batch_means),
        "predict_with_generate needs a Hugging Face causal LM (GPT-2, Llama, Mistral, "
        "Qwen2) or encoder–decoder (Whisper, BART, T5) folder or config as the model");
  if (args_.eval_strategy != "no")
    ONYX_CHECK(eval_ds_, "eval_strategy is '", args_.eval_strategy,
               "' but no eval dataset was given");
  // Every graph input must come from the dataset (labels too, when the loss is appended).
  auto check_ds = [&](const data::Dataset& ds, const char* which) {
    auto keys = ds.keys();
    auto has = [&](const std::string& k) {
      return std::find(keys.begin(), keys.end(), k) != keys.end();
    };
    for (auto& in : model_.graph->inputs)
      ONYX_CHECK(
          has(in.name) || model_.optional_inputs.count(in.name), which,
          " dataset has no tensor for model input '", in.name, "' (it has: ",
          [&] {
            std::string s;
            for (auto& k : keys) s += (s.empty() ? "" : ", ") + k;
            return s;
          }(),
          ")");
    if (model_.loss.kind != autodiff::LossSpec::Kind::GraphOutput)
      ONYX_CHECK(has(model_.loss.labels), which, " dataset has no labels '", model_.loss.labels,
                 "'");
  };
  if (train_ds_) check_ds(*train_ds_, "train");
  if (eval_ds_) check_ds(*eval_ds_, "eval");
  if (model_.items_labels.empty() && model_.loss.kind == autodiff::LossSpec::Kind::CrossEntropy) {
    model_.items_labels = model_.loss.labels;  // a mean over the labels that are not ignored
    model_.items_ignore_index = model_.loss.ignore_index;
  }
  autodiff::GradientOptions go;
  go.loss = model_.loss;
  if (args_.label_smoothing_factor > 0)
    go.loss.label_smoothing = (float)args_.label_smoothing_factor;
  go.frozen = model_.frozen;
  go.keep_outputs = model_.logged_outputs;
  // Every op has a kernel and, on the path from the parameters to the loss, a gradient rule: all
  // missing ones named at once, before any data is read or graph planned (autodiff/coverage.h).
  autodiff::require_coverage(*model_.graph, go, /*gradients=*/train_ds_ != nullptr);
  const bool sole_owner = model_.graph.use_count() == 1;
  impl_->ts = std::make_unique<train::TrainingSession>(model_.graph, go);
  // The flat parameter buffer now holds a copy of every trainable initializer. When no one else
  // holds this graph, its initializers become views of that buffer, so the file's copy is freed
  // (one parameter set less in peak RSS). A shared graph is left alone: another trainer built
  // from the same Model must still see the initial weights.
  if (sole_owner) {
    for (auto& p : impl_->ts->parameters())
      model_.graph->initializers[p] = impl_->ts->params().view(p);
    // BatchNorm running statistics: the session's buffers, updated in place by training.
    for (auto& [b, t] : impl_->ts->buffers()) model_.graph->initializers[b] = t;
  }
  impl_->ts->set_unbiased_running_var(model_.batch_norm_unbiased_var);
  impl_->ts->set_bf16_gemm(args_.bf16);
  impl_->ts->set_fp16_gemm(args_.fp16);
  if (args_.fp16 || args_.fp16_full_eval)
    std::cerr << "Warning: " << (args_.fp16 ? "fp16" : "fp16_full_eval")
              << ": these CPUs have no float16 arithmetic; the float16-rounded GEMM inputs are "
                 "multiplied by float32 GEMMs (slower than float32; bf16 is the CPU's format).\n";
  if (args_.bf16 && !kernels::bf16_gemm_native())
    std::cerr << "Warning: bf16: "
              << (kernels::cpu_has_avx512_bf16() ? "ONYX_CPU chose a path without AVX512_BF16"
                                                 : "this CPU has no AVX512_BF16")
              << "; the bf16-rounded GEMM inputs are multiplied by float32 GEMMs (the same "
                 "numerics, slower than float32).\n";
  passes::OptimizeOptions po;
  po.recompute = args_.gradient_checkpointing;
  impl_->ts->set_pass_options(po);
  impl_->decay_mask = model_.decay_all
                          ? std::vector<bool>(impl_->ts->params().layout().entries.size(), true)
                          : train::hf_decay_mask(impl_->ts->params().layout(), model_.generic_onnx);
  train::OptimizerConfig oc;
  oc.name = args_.optimizer_name();
  oc.lr = args_.learning_rate;
  oc.beta1 = args_.adam_beta1;
  oc.beta2 = args_.adam_beta2;
  oc.eps = args_.adam_epsilon;
  oc.weight_decay = args_.weight_decay;
  oc.momentum = args_.sgd_momentum;
  oc.nesterov = args_.sgd_nesterov;
  // Data parallelism: the world is MPI's under mpirun, else this process alone.
  impl_->comm = &dist::world();
  impl_->comm->set_timeout((double)args_.ddp_timeout);
  // known before train(): save_model and the Python package's files are written by rank 0 only
  state_.is_world_process_zero = impl_->comm->rank() == 0;
  state_.is_local_process_zero = impl_->comm->local_rank() == 0;
  impl_->dp = std::make_unique<train::DataParallel>(*impl_->comm, impl_->ts->params().layout(),
                                                    (int)args_.zero_stage,
                                                    args_.ddp_bucket_cap_mb.value_or(25));
  impl_->zero2 = args_.zero_stage == 2;
  impl_->opt = train::make_optimizer(oc, impl_->ts->params().layout(), impl_->decay_mask,
                                     impl_->dp->owned_begin(), impl_->dp->owned_end());
  impl_->data_seed = (uint64_t)args_.data_seed.value_or(args_.seed);
  for (auto& cb : callbacks_) cb->on_init_end(args_, state_, control_);
}

Trainer::~Trainer() = default;

train::TrainingSession& Trainer::session() { return *impl_->ts; }

std::map<std::string, Tensor> Trainer::load_batch(const data::Dataset& ds,
                                                  const std::vector<int64_t>& idx) const {
  auto batch = ds.batch(idx);
  if (model_.fill_defaults) model_.fill_defaults(batch);
  if (model_.items_shifted && !model_.items_labels.empty()) {
    // A causal LM predicts token t+1 from tokens <= t: one token per row leaves no target (the
    // shifted logits would have length 0 deep inside the graph).
    auto it = batch.find(model_.items_labels);
    if (it != batch.end() && it->second.rank() >= 2)
      ONYX_CHECK(it->second.dim(-1) >= 2, "batch input '", model_.items_labels,
                 "' has sequence length ", it->second.dim(-1),
                 "; a causal language model needs at least 2 tokens per row (its targets are the "
                 "next tokens). Are the texts tokenized into more than one token?");
  }
  return batch;
}

// The items a micro-batch's loss averages over (Model::items_labels); -1 when not known.
static int64_t count_items(const Model& m, const std::map<std::string, Tensor>& batch) {
  if (m.items_labels.empty()) return -1;
  auto it = batch.find(m.items_labels);
  if (it == batch.end()) return -1;
  const Tensor& y = it->second;
  const int64_t row = y.rank() ? y.dim(-1) : 1;
  int64_t n = 0;
  for (int64_t i = 0; i < y.numel(); i++)
    if (!(m.items_shifted && i % row == 0) && (int64_t)y.get_as_double(i) != m.items_ignore_index)
      n++;
  return n;
}

// Data parallel: what the callbacks decided on any rank holds for all (Ctrl-C seen by one rank,
// a callback asking to save or stop), so every rank takes the same steps and collectives.
static void sync_control(dist::Comm& comm, TrainerControl& c) {
  if (comm.size() == 1) return;
  std::vector<char> mine = {c.should_training_stop, c.should_epoch_stop, c.should_save,
                            c.should_evaluate, c.should_log};
  std::vector<char> all = comm.all_gather_values(mine);
  for (size_t i = 0; i < all.size(); i++) mine[i % mine.size()] |= all[i];
  c.should_training_stop = mine[0];
  c.should_epoch_stop = mine[1];
  c.should_save = mine[2];
  c.should_evaluate = mine[3];
  c.should_log = mine[4];
}

static void append_line(const std::string& path, const std::string& line) {
  std::ofstream f(path, std::ios::app);
  f << line << "\n";
}

void Trainer::log(LogEntry e) {
  e.epoch = state_.epoch;
  e.step = state_.global_step;
  state_.log_history.push_back(e);
  if (impl_->comm->rank() == 0)
    append_line((fs::path(args_.output_dir) / "log_history.jsonl").string(), e.to_json());
  if (impl_->progress) impl_->progress->log(e);
  for (auto& cb : callbacks_) cb->on_log(args_, state_, control_, e);
}

// Bytes of a memory size: "6GB", "512MiB", "1.5 GiB", "100000" (bytes); kB/MB/GB are powers of
// 1000, KiB/MiB/GiB of 1024.
static double parse_memory_size(const std::string& text) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw Error(cat("max_memory: '", text, "' is not a size (e.g. 6GB, 512MiB, or bytes)"));
  }
  std::string unit = text.substr(pos);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  static const std::map<std::string, double> units = {{"", 1},
                                                      {"B", 1},
                                                      {"kB", 1e3},
                                                      {"KB", 1e3},
                                                      {"MB", 1e6},
                                                      {"GB", 1e9},
                                                      {"TB", 1e12},
                                                      {"KiB", 1024.0},
                                                      {"MiB", 1048576.0},
                                                      {"GiB", 1073741824.0},
                                                      {"TiB", 1099511627776.0}};
  auto it = units.find(unit);
  ONYX_CHECK(it != units.end() && v > 0, "max_memory: '", text,
             "' is not a size (e.g. 6GB, 512MiB, or bytes)");
  return v * it->second;
}

// MemAvailable of /proc/meminfo in bytes (0 when unknown).
static double available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

void Trainer::fit_batch_to_memory() {
  auto& a = args_;
  if (!a.auto_find_batch_size && !a.max_memory) return;
  double budget = a.max_memory ? parse_memory_size(*a.max_memory) : 0.9 * available_memory();
  if (budget <= 0) return;  // no budget known: nothing to fit
  auto& ts = *impl_->ts;
  int states = impl_->opt->name().rfind("adamw", 0) == 0 ? 2 : (a.sgd_momentum != 0 ? 1 : 0);
  if (a.gradient_accumulation_steps > 1 && a.zero_stage < 2) states++;  // the second grad buffer
  int64_t b = std::min<int64_t>(a.per_device_train_batch_size, train_ds_->size());
  const int64_t asked = a.per_device_train_batch_size;
  double need = 0;
  for (;;) {
    auto idx =
        data::make_batches(data::epoch_order(train_ds_->size(), false, 0, 0), b, false).at(0);
    need = ts.planned_step_bytes(load_batch(*train_ds_, idx), states);
    if (need <= budget || !a.auto_find_batch_size || b == 1) break;
    b = std::max<int64_t>(1, b / 2);
  }
  ts.set_pass_options(ts.pass_options());  // drop the graphs planned for batches not used
  auto mib = [](double x) { return cat((int64_t)std::llround(x / 1048576.0), " MiB"); };
  ONYX_CHECK(
      need <= budget, "a training step at batch ", b, " is planned to need ", mib(need),
      ", more than the memory budget of ", mib(budget),
      a.max_memory ? cat(" (max_memory ", *a.max_memory, ")") : std::string(" (available memory)"),
      a.auto_find_batch_size ? "" : "; set auto_find_batch_size to search a smaller batch");
  if (b != asked)
    std::cerr << "auto_find_batch_size: per_device_train_batch_size " << asked << " -> " << b
              << " (a step is planned to need " << mib(need) << " of " << mib(budget) << ")\n";
  a.per_device_train_batch_size = b;
}

TrainOutput Trainer::train() {
  // weights() hands out writable views (the Python package's numpy arrays): whatever was
  // written through them since the last train() reaches the bf16 shadow too
  impl_->ts->weights_changed();
  struct InTrain {  // evaluations from here on are "while train is running"
    bool& flag;
    explicit InTrain(bool& f) : flag(f) { flag = true; }
    ~InTrain() { flag = false; }
  } in_train(impl_->in_train);
  try {
    precompute_reference_logps();  // before a resume: the reference is the starting policy
    keep_grpo_reference();
    return train_loop();
  } catch (const std::exception& e) {
    // One rank failing ends the whole job at once (the others would wait in the next collective
    // until ddp_timeout): the message names the rank, MPI_Abort stops every process.
    if (impl_->comm->size() > 1) impl_->comm->abort(e.what());
    throw;
  }
}

Trainer::ParallelInfo Trainer::parallel_info() const {
  ParallelInfo p;
  p.world_size = impl_->comm->size();
  p.rank = impl_->comm->rank();
  p.backend = impl_->comm->backend();
  p.zero_stage = (int)args_.zero_stage;
  p.gradient_reductions = impl_->dp->gradient_reductions;
  p.reduce_seconds = impl_->dp->reduce_seconds;
  p.comm_seconds = impl_->dp->comm_seconds;
  p.buckets = (int64_t)impl_->dp->buckets();
  p.overlapped = impl_->dp->overlaps();
  p.optimizer_state_elements = impl_->dp->owned_end() - impl_->dp->owned_begin();
  p.parameter_elements = impl_->ts->params().layout().numel;
  return p;
}

// Before step 1 (or the resumed step): output_dir writable, the batch fitted to memory, the step
// count and schedule, a resume or the initial weights broadcast, the state, the progress display.
void Trainer::start_training() {
  ONYX_CHECK(train_ds_, "train: no train dataset");
  auto& I = *impl_;
  auto& a = args_;
  try {
    fs::create_directories(a.output_dir);
  } catch (const fs::filesystem_error& e) {
    throw Error(cat("output_dir '", a.output_dir, "' cannot be created: ", e.code().message()));
  }
  {  // fail early, before any step, if output_dir cannot be written
    std::string probe =
        (fs::path(a.output_dir) / cat(".onyx-write-test-", impl_->comm->rank())).string();
    std::ofstream f(probe);
    ONYX_CHECK(f.good(), "output_dir '", a.output_dir, "' is not writable");
    f.close();
    fs::remove(probe);
  }
  fit_batch_to_memory();
  dist::Comm& comm = *I.comm;
  const int64_t world = comm.size(), rank = comm.rank();
  const bool by_length = (a.train_sampling_strategy == "group_by_length" ||
                          a.train_sampling_strategy == "batch_rebalance") &&
                         !dynamic_cast<train::GrpoRollouts*>(train_ds_.get());
  I.train_lengths = by_length ? train::sample_lengths(*train_ds_, a, "the train dataset")
                              : std::vector<int64_t>();
  // (every epoch has as many micro-batches as the first)
  if (auto* rollouts = dynamic_cast<train::GrpoRollouts*>(train_ds_.get()))
    rollouts->plan(a.per_device_train_batch_size, a.gradient_accumulation_steps, world, rank);
  const int64_t n_batches = (int64_t)train_batches(0).size();
  ONYX_CHECK(n_batches > 0, "the train dataset (", train_ds_->size(),
             " samples) gives no batch of ", a.per_device_train_batch_size,
             (a.dataloader_drop_last ? " with dataloader_drop_last" : ""));
  const int64_t ga = a.gradient_accumulation_steps;
  const int64_t slots = ga * world;  // micro-batches per optimizer step, over all ranks
  I.dp->check_same({{"the number of parameters", I.ts->params().layout().numel},
                    {"the number of training samples", train_ds_->size()},
                    {"per_device_train_batch_size", a.per_device_train_batch_size},
                    {"gradient_accumulation_steps", ga},
                    {"zero_stage", a.zero_stage},
                    {"max_steps", a.max_steps},
                    {"seed", a.seed}});
  int64_t updates_per_epoch = (n_batches + slots - 1) / slots;
  int64_t max_steps =
      a.max_steps > 0 ? a.max_steps : (int64_t)std::ceil(a.num_train_epochs * updates_per_epoch);
  int64_t num_epochs = (max_steps + updates_per_epoch - 1) / updates_per_epoch;
  state_ = TrainerState();
  I.epoch = I.batches_done = 0;
  I.loss_since_log = I.loss_total = 0;
  I.steps_since_log = 0;
  // the schedule before a resume: load_checkpoint reads a metric-driven schedule's state by type
  I.sched = train::ScheduleConfig();
  I.sched.type = a.lr_scheduler_type;
  I.sched.warmup_steps = a.warmup_steps;
  I.sched.warmup_ratio = a.warmup_ratio;
  I.sched.total_steps = max_steps;
  I.sched.base_lr = a.learning_rate;
  train::apply_scheduler_kwargs(I.sched, a.lr_scheduler_kwargs);
  I.metric_lr = train::MetricLrState();
  std::string log_path = (fs::path(a.output_dir) / "log_history.jsonl").string();
  if (a.resume_from_checkpoint) {
    start_ema();
    load_checkpoint(*a.resume_from_checkpoint);
    load_ema(*a.resume_from_checkpoint);
  } else {
    if (rank == 0) io::write_file_atomic(log_path, "");
    I.dp->broadcast_weights(*I.ts);  // identical initial weights on every rank
    start_ema();
  }
  state_.max_steps = max_steps;
  state_.num_train_epochs = num_epochs;
  state_.logging_steps = TrainingArguments::interval(a.logging_steps, max_steps);
  state_.eval_steps =
      TrainingArguments::interval(a.eval_steps.value_or(a.logging_steps), max_steps);
  state_.save_steps = TrainingArguments::interval(a.save_steps, max_steps);
  state_.train_batch_size = a.per_device_train_batch_size;
  // One progress display and one log: rank 0's.
  I.progress = rank == 0 ? std::make_unique<train::Progress>(max_steps, a.disable_tqdm) : nullptr;
  state_.is_world_process_zero = rank == 0;
  state_.is_local_process_zero = comm.local_rank() == 0;
  if (I.progress) I.progress->start(state_.global_step);
  control_ = TrainerControl();
  for (auto& cb : callbacks_) cb->on_train_begin(a, state_, control_);
  I.t_start = std::chrono::steady_clock::now();
  I.samples_seen = I.steps_run = 0;
}

// Transformers' _maybe_log_save_evaluate after a step (epoch_end: after an epoch): the log, the
// evaluation (stepping a metric-driven schedule), the checkpoint the strategies and callbacks ask.
void Trainer::maybe_log_save_evaluate(bool epoch_end) {
  auto& I = *impl_;
  auto& a = args_;
  bool do_log = control_.should_log, do_eval = control_.should_evaluate,
       do_save = control_.should_save;
  if (!epoch_end) {
    do_log |= a.logging_strategy == "steps" && state_.global_step % state_.logging_steps == 0;
    do_log |= a.logging_first_step && state_.global_step == 1;
    do_eval |= a.eval_strategy == "steps" && state_.global_step % state_.eval_steps == 0;
    do_save |= a.save_strategy == "steps" && state_.global_step % state_.save_steps == 0;
    if (state_.global_step >= state_.max_steps) {  // Transformers' DefaultFlowCallback at the end
      do_eval |= a.eval_strategy == "steps";       // (an evaluation, not a second one)
      do_save |= a.save_strategy == "steps";
    }
  } else {
    do_log |= a.logging_strategy == "epoch";
    do_eval |= a.eval_strategy == "epoch";
    do_save |= a.save_strategy == "epoch";
  }
  if (do_log && I.steps_since_log > 0) {
    LogEntry e;
    e.values["loss"] = I.loss_since_log / (double)I.steps_since_log;
    e.values["grad_norm"] = I.last_grad_norm;
    // the LR the last step applied (Transformers reads it before lr_scheduler.step())
    e.values["learning_rate"] =
        I.lr_override
            ? *I.lr_override
            : train::lr_at(I.sched, std::max<int64_t>(0, state_.global_step - 1), &I.metric_lr);
    for (auto& [name, mean] : logged_means()) e.values[name] = mean;
    I.logged_sums.clear();
    I.logged_counts.clear();
    I.loss_since_log = 0;
    I.steps_since_log = 0;
    log(e);
  }
  if (do_eval) {
    Metrics m = evaluate();
    // Transformers' _evaluate steps a ReduceLROnPlateau / GreedyLR with the metric
    if (I.sched.type == "reduce_lr_on_plateau" || I.sched.type == "greedy") {
      const std::string key = "eval_" + args_.best_metric_name();
      auto it = m.find(key);
      ONYX_CHECK(it != m.end(), I.sched.type, ": the evaluation has no '", key,
                 "' (metric_for_best_model)");
      train::metric_lr_step(I.sched, I.metric_lr, it->second);
    }
  }
  if (do_save) save_checkpoint();
  control_.should_log = control_.should_evaluate = control_.should_save = false;
}

// One optimizer step's gradients into grads(): the micro-batches [group_start, group_end) of
// `batches` (global slots k = j * world + rank; train/data_parallel.h) run forward and backward,
// weighted and reduced over the ranks; the logged loss accumulated. Returns the step's loss.
double Trainer::accumulate_gradients(const std::vector<std::vector<int64_t>>& batches,
                                     int64_t group_start, int64_t group_end) {
  auto& I = *impl_;
  auto& a = args_;
  dist::Comm& comm = *I.comm;
  const int64_t world = comm.size(), rank = comm.rank();
  const int64_t ga = a.gradient_accumulation_steps;
  const int64_t slots = ga * world;
  for (auto& cb : callbacks_) cb->on_step_begin(a, state_, control_);
  // Each micro-batch's gradient is weighted by its share of the step's items over all ranks
  // (Transformers' num_items_in_batch: sum over all items / their number), or equally when
  // the items are not known. The weighted gradients are summed left to right into grads(),
  // micro-batches after the first computed into a second buffer; across ranks the sum is by
  // element owner in rank order — the same bits as one rank accumulating them all.
  std::vector<std::map<std::string, Tensor>> micro_batches(ga);
  std::vector<int64_t> my_items(ga, -2);  // -2: no such slot
  int64_t my_tokens = 0;                  // Model::logs_num_tokens
  for (int64_t j = 0; j < ga; j++) {
    int64_t b = group_start + j * world + rank;
    if (b >= group_end) continue;
    micro_batches[j] = load_batch(*train_ds_, batches[b]);
    my_items[j] = count_items(model_, micro_batches[j]);
    auto mask = micro_batches[j].find("attention_mask");
    if (model_.logs_num_tokens && mask != micro_batches[j].end())
      for (int64_t v : mask->second.to_int64_vector()) my_tokens += v;
  }
  if (model_.logs_num_tokens) {
    for (int64_t n : comm.all_gather_values(std::vector<int64_t>{my_tokens}))
      state_.num_input_tokens_seen += n;
    I.logged_sums["num_tokens"] = (double)state_.num_input_tokens_seen;  // the latest, as TRL's
    I.logged_counts["num_tokens"] = 1;
  }
  // items of global slot k = j * world + q
  std::vector<int64_t> all_items = comm.all_gather_values(my_items);
  auto slot_items = [&](int64_t k) { return all_items[(k % world) * ga + k / world]; };
  int64_t total_items = 0, present = 0;
  bool counted = true;
  for (int64_t k = 0; k < slots; k++) {
    int64_t n = slot_items(k);
    if (n == -2) continue;
    present++;
    counted &= n >= 0;
    total_items += std::max<int64_t>(n, 0);
  }
  // Not one label carries loss in the whole step: Transformers divides the summed loss by
  // num_items_in_batch = 0 (NaN); onyx stops, naming the rows, before updating anything — unless
  // the model's loss is zero then (Model::zero_items_ok: its micro-batches weigh equally).
  if (counted && total_items == 0 && present > 0 && !model_.zero_items_ok) {
    std::vector<int64_t> rows;
    for (int64_t b = group_start; b < group_end && rows.size() < 16; b++)
      for (int64_t r : batches[b]) rows.push_back(r);
    throw Error(cat("step ", state_.global_step + 1, ": no label of its ", present,
                    " batch(es) carries loss (every '", model_.items_labels, "' is ",
                    model_.items_ignore_index, "), so its loss is 0 / 0; rows ", shape_str(rows),
                    group_end - group_start > 1 ? " ..." : "",
                    " of the training data need a token to learn"));
  }
  const bool plain_mean = !counted || total_items == 0;  // items unknown
  auto weight_items = [&](int64_t n) -> int64_t { return n == -2 ? 0 : plain_mean ? 1 : n; };
  const double weight_total = !plain_mean                     ? (double)total_items
                              : model_.sums_micro_batch_means ? 1.0
                                                              : (double)present;
  auto& grads = I.ts->grads();
  bool have_local = false;
  std::vector<double> my_parts(ga, 0.0);
  std::map<std::string, double> logged;  // Model::logged_outputs of the micro-batch just run
  // DDP / ZeRO-1: the last local micro-batch's buckets are reduced while its backward runs.
  const bool overlap = I.dp->overlaps();
  int64_t last_j = -1;
  for (int64_t j = 0; j < ga; j++)
    if (weight_items(my_items[j]) > 0) last_j = j;
  bool overlapping = false;
  for (int64_t j = 0; j < ga; j++) {
    const int64_t k = j * world + rank;
    const int64_t n = weight_items(my_items[j]);
    if (I.zero2 && world > 1) {
      // ZeRO-2 reduces every micro-batch slot any rank has (a collective: all take part)
      bool any = false;
      for (int64_t q = 0; q < world; q++) any |= weight_items(slot_items(j * world + q)) > 0;
      if (!any) continue;
    } else if (n <= 0) {
      continue;  // a micro-batch without targets adds nothing to the loss or gradient
    }
    train::FlatBuffer* into = have_local && !I.zero2 ? &I.scratch() : nullptr;
    train::FlatBuffer& target = into ? *into : grads;
    if (n > 0) {
      const double w = (double)n / weight_total;
      uint64_t seed =
          (uint64_t)a.seed * 1000003ull + (uint64_t)state_.global_step * 131ull + (uint64_t)k;
      if (overlap && j == last_j) {
        // the weighting and the add into grads happen bucket by bucket (DataParallel)
        const auto& timing = I.ts->gradient_timing(micro_batches[j]);
        I.dp->begin_overlap(grads, &target, (float)w, timing.early, timing.late);
        overlapping = true;
        my_parts[j] = w * I.ts->forward_backward(
                              micro_batches[j], false, seed, true, into,
                              [&](const std::string& p) { I.dp->grad_ready(p); }, &logged);
      } else {
        my_parts[j] =
            w * I.ts->forward_backward(micro_batches[j], false, seed, true, into, {}, &logged);
        if ((float)w != 1.0f) train::scale(target, (float)w);
        if (into && !I.zero2) train::add_into(grads, *into);
      }
    } else {
      target.zero();  // ZeRO-2: this rank has no data for the slot, its share is zero
    }
    for (auto& [name, v] : logged) {
      I.logged_sums[name] += v;
      I.logged_counts[name]++;
    }
    logged.clear();
    if (I.zero2) I.dp->accumulate_shard(grads, !have_local);
    have_local = true;
    micro_batches[j].clear();
    if (j + 1 < ga)
      for (auto& cb : callbacks_) cb->on_substep_end(a, state_, control_);
  }
  micro_batches.clear();
  if (!have_local) grads.zero();  // no data on this rank this step: it adds zero
  if (I.zero2) {
    I.dp->finish_shard(grads);
  } else if (overlap) {
    if (!overlapping) I.dp->begin_overlap(grads, nullptr, 1.0f, {}, {});
    I.dp->end_overlap();
  } else {
    I.dp->reduce_gradients(grads);
  }
  // The logged loss, in global slot order on every rank, as Transformers accumulates tr_loss
  // per micro-batch: a nan/inf one adds tr_loss / (1 + steps since the last log) with
  // logging_nan_inf_filter.
  std::vector<double> all_parts = comm.all_gather_values(my_parts);
  double step_loss = 0;
  for (int64_t k = 0; k < slots; k++) {
    if (weight_items(slot_items(k)) <= 0) continue;
    const double part = all_parts[(k % world) * ga + k / world];
    step_loss += part;
    const double add = std::isfinite(part) || !a.logging_nan_inf_filter
                           ? part
                           : I.loss_since_log / (double)(1 + I.steps_since_log);
    I.loss_since_log += add;
    I.loss_total += add;
  }
  for (int64_t b = group_start; b < group_end; b++) I.samples_seen += (int64_t)batches[b].size();
  return step_loss;
}

// The optimizer step on the reduced gradients (clipped to max_grad_norm), or a logged skip when
// they are not finite.
void Trainer::apply_gradients() {
  auto& I = *impl_;
  auto& a = args_;
  auto& grads = I.ts->grads();
  const int64_t own_b = I.dp->owned_begin(), own_e = I.dp->owned_end();
  double norm = I.dp->grad_norm(grads);
  double lr =
      I.lr_override ? *I.lr_override : train::lr_at(I.sched, state_.global_step, &I.metric_lr);
  // (a finite norm means finite gradients: a NaN or inf term makes the exact square sum, and
  // so the norm, non-finite — no pass of its own over the gradients is needed)
  if (!std::isfinite(norm)) {
    I.skipped_steps++;
    LogEntry e;
    e.values["skipped_nonfinite_step"] = 1;
    e.values["grad_norm"] = norm;
    log(e);
  } else {
    // clip_grad_norm_'s factor: read into the update where the optimizer can (one pass fewer
    // over the gradients), else scaled first
    float clip = 1.0f;
    if (a.max_grad_norm > 0 && norm > a.max_grad_norm)
      clip = (float)(a.max_grad_norm / (norm + 1e-6));
    if (clip != 1.0f && !I.opt->scales_gradients()) {
      train::scale(grads, clip, own_b, own_e);
      clip = 1.0f;
    }
    // The bf16 shadow of the weights (mixed precision) written by the update pass, unless
    // the optimizer updates one shard (ZeRO): then the next run rounds it from the gathered
    // weights.
    const bool whole = own_b == 0 && own_e == I.ts->params().layout().numel;
    train::FlatBuffer* shadow = whole ? I.ts->bf16_shadow() : nullptr;
    I.opt->step(I.ts->params(), grads, lr, shadow, clip);
    I.dp->gather_params(I.ts->params());
    if (shadow) I.ts->bf16_shadow_written();
  }
  I.last_grad_norm = norm;
}

// After the last step: the best model loaded back (load_best_model_at_end), the train_* metrics
// logged, on_train_end, trainer_state.json.
TrainOutput Trainer::finish_training() {
  auto& I = *impl_;
  auto& a = args_;
  if (I.progress) I.progress->finish();
  I.ts->release_activation_memory(true);  // the final save and evaluation need no training arena
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - I.t_start).count();
  if (a.load_best_model_at_end && state_.best_model_checkpoint) {
    // rank 0 reads the best weights, the other ranks receive them (no shared folder needed)
    fs::path best = fs::path(*state_.best_model_checkpoint) / model_.weights_file;
    if (I.comm->rank() == 0 && fs::exists(best))
      I.ts->load_weights(io::load_safetensors(best.string()).tensors, cat("'", best.string(), "'"));
    I.dp->broadcast_weights(*I.ts);
  }
  TrainOutput out;
  out.global_step = state_.global_step;
  out.training_loss = state_.global_step ? I.loss_total / (double)state_.global_step : 0;
  LogEntry e;
  e.values["train_runtime"] = secs;
  e.values["train_samples_per_second"] = secs > 0 ? I.samples_seen / secs : 0;
  e.values["train_steps_per_second"] = secs > 0 ? I.steps_run / secs : 0;
  e.values["train_loss"] = out.training_loss;
  out.metrics = e.values;
  log(e);
  for (auto& cb : callbacks_) cb->on_train_end(a, state_, control_);
  // The final state next to the checkpoints, as Transformers' save_state() does.
  if (I.comm->rank() == 0)
    io::write_file_atomic((fs::path(a.output_dir) / "trainer_state.json").string(),
                          state_.to_json() + "\n");
  return out;
}

// The logged values' means since the last log (Model::logged_outputs, GRPO's rollout metrics):
// each process's mean of a graph output, then the mean over the processes that have one, as
// TRL gathers its metrics (a collective: every process logs at the same steps). The others (the
// rollout's, computed from gathered rows; a reward function's log_metric) stay this process's.
std::map<std::string, double> Trainer::logged_means() {
  auto& I = *impl_;
  std::map<std::string, double> means;
  for (auto& [name, sum] : I.logged_sums) means[name] = sum / (double)I.logged_counts[name];
  dist::Comm& comm = *I.comm;
  const std::vector<std::string>& names = model_.logged_outputs;  // the same on every process
  if (comm.size() == 1 || names.empty()) return means;
  std::vector<double> mine;
  for (auto& name : names) mine.push_back(means.count(name) ? means[name] : NAN);
  std::vector<double> all = comm.all_gather_values(mine);
  for (size_t k = 0; k < names.size(); k++) {
    double sum = 0;
    int n = 0;
    for (int q = 0; q < comm.size(); q++) {
      const double v = all[q * names.size() + k];
      if (!std::isnan(v)) sum += v, n++;
    }
    if (n > 0) means[names[k]] = sum / (double)n;
  }
  return means;
}

std::vector<std::vector<int64_t>> Trainer::train_batches(int64_t epoch) const {
  if (!dynamic_cast<const train::GrpoRollouts*>(train_ds_.get()))
    return train::epoch_batches(args_, impl_->train_lengths, train_ds_->size(), impl_->comm->size(),
                                impl_->data_seed, epoch);
  // GRPO's rows are the generation batches in order (RepeatSampler orders the prompts)
  return data::make_batches(data::epoch_order(train_ds_->size(), false, 0, epoch),
                            args_.per_device_train_batch_size, false);
}

TrainOutput Trainer::train_loop() {
  start_training();
  auto& I = *impl_;
  auto& a = args_;
  dist::Comm& comm = *I.comm;
  const int64_t slots = a.gradient_accumulation_steps * comm.size();  // micro-batches per step
  while (I.epoch < state_.num_train_epochs && state_.global_step < state_.max_steps &&
         !control_.should_training_stop) {
    auto batches = train_batches(I.epoch);
    train_ds_->set_epoch(I.epoch, I.data_seed);
    if (I.batches_done == 0)
      for (auto& cb : callbacks_) cb->on_epoch_begin(a, state_, control_);
    while (I.batches_done < (int64_t)batches.size() && state_.global_step < state_.max_steps) {
      // One optimizer step over up to K = ga * world micro-batches of the epoch.
      const int64_t group_start = I.batches_done;
      const int64_t group_end = std::min<int64_t>((int64_t)batches.size(), group_start + slots);
      comm.set_context(cat("step ", state_.global_step + 1));
      prepare_rollout();
      for (auto& cb : callbacks_) cb->on_step_begin(a, state_, control_);
      const double step_loss = accumulate_gradients(batches, group_start, group_end);
      apply_gradients();
      I.batches_done = group_end;
      state_.global_step++;
      update_ema();
      I.steps_run++;
      state_.epoch = (double)I.epoch + (double)I.batches_done / (double)batches.size();
      I.steps_since_log++;
      if (I.progress)
        I.progress->update(state_.global_step, step_loss,
                           train::lr_at(I.sched, state_.global_step - 1, &I.metric_lr),
                           I.samples_seen);
      for (auto& cb : callbacks_) cb->on_step_end(a, state_, control_);
      sync_control(comm, control_);
      maybe_log_save_evaluate(false);
      if (control_.should_epoch_stop || control_.should_training_stop) break;
    }
    bool finished_epoch = I.batches_done >= (int64_t)batches.size();
    if (finished_epoch) {
      for (auto& cb : callbacks_) cb->on_epoch_end(a, state_, control_);
      sync_control(comm, control_);
      I.epoch++;
      I.batches_done = 0;
      state_.epoch = (double)I.epoch;
      maybe_log_save_evaluate(true);
    }
    control_.should_epoch_stop = false;
    if (!finished_epoch) break;
  }
  return finish_training();
}

namespace train {

std::vector<int64_t> sample_lengths(const data::Dataset& ds, const TrainingArguments& a,
                                    const char* which) {
  std::vector<int64_t> lengths = ds.lengths(a.length_column_name);
  ONYX_CHECK((int64_t)lengths.size() == ds.size(), which, ": train_sampling_strategy ",
             a.train_sampling_strategy, " needs each sample's length: a '", a.length_column_name,
             "' column (length_column_name) or input_ids");
  return lengths;
}

std::vector<std::vector<int64_t>> epoch_batches(const TrainingArguments& a,
                                                const std::vector<int64_t>& lengths, int64_t n,
                                                int64_t world, uint64_t seed, int64_t epoch) {
  const int64_t bs = a.per_device_train_batch_size, ga = a.gradient_accumulation_steps;
  const std::string& how = a.train_sampling_strategy;
  if (how == "batch_rebalance")
    return data::rebalanced_batches(data::epoch_order(n, true, seed, epoch), lengths,
                                    bs * ga * world, world, ga, a.dataloader_drop_last);
  // group_by_length: megabatches of per_device_train_batch_size * GA, as Transformers'
  auto order = how == "group_by_length" ? data::length_grouped_order(lengths, bs * ga, seed, epoch)
                                        : data::epoch_order(n, how == "random", seed, epoch);
  return data::make_batches(order, bs, a.dataloader_drop_last);
}

std::vector<int64_t> eval_order(const data::Dataset& ds, const TrainingArguments& a) {
  if (a.train_sampling_strategy != "group_by_length")
    return data::epoch_order(ds.size(), false, 0, 0);
  return data::length_grouped_order(sample_lengths(ds, a, "the eval dataset"),
                                    a.per_device_eval_batch_size,
                                    (uint64_t)a.data_seed.value_or(a.seed), 0);
}

}  // namespace train

}  // namespace onyx
