// train/evaluate.cc — evaluation and prediction: run_eval (forward over a dataset in order, the
// mean loss, predictions and labels concatenated, compute_metrics), evaluate() (prefixed metrics,
// runtime, best-metric tracking), predict(), and EarlyStoppingCallback, which reads evaluations.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "io/json.h"
#include "ir/graph.h"
#include "kernels/cpu/gemm.h"
#include "models/lora.h"
#include "train/trainer_internal.h"

namespace onyx {

// ---- early stopping ------------------------------------------------------------------------

void EarlyStoppingCallback::on_train_begin(const TrainingArguments& args, TrainerState&,
                                           TrainerControl&) {
  ONYX_CHECK(args.metric_for_best_model, "early stopping needs metric_for_best_model");
  ONYX_CHECK(args.eval_strategy != "no", "early stopping needs an eval_strategy of steps or epoch");
}

// As Transformers: an evaluation improves when it beats TrainerState.best_metric (the best of the
// evaluations before this one) by more than the threshold.
void EarlyStoppingCallback::on_evaluate(const TrainingArguments& args, TrainerState& state,
                                        TrainerControl& control, const Metrics& m) {
  auto it = m.find("eval_" + args.best_metric_name());
  if (it == m.end()) return;
  double v = it->second;
  bool improved = !state.best_metric ||
                  ((args.best_is_greater() ? v > *state.best_metric : v < *state.best_metric) &&
                   std::fabs(v - *state.best_metric) > threshold_);
  bad_evals_ = improved ? 0 : bad_evals_ + 1;
  if (bad_evals_ >= patience_) control.should_training_stop = true;
}

// ---- evaluation and prediction -------------------------------------------------------------

// The batches' tensors along dimension 0, as Transformers' nested_concat joins them: batches
// padded to different lengths (per-batch collation, length buckets) are padded to the longest
// with -100 (its padding_index), so each row keeps its values and its padding reads as ignored.
static Tensor concat_padded(const std::vector<Tensor>& ts) {
  if (ts.empty()) return {};
  auto shape_of = [](const Tensor& t) {  // rank 0 -> [1], rank 1 -> [n, 1]: rows of `inner`
    Shape sh = t.rank() ? t.shape() : Shape{1};
    if (sh.size() == 1) sh.push_back(1);
    return sh;
  };
  Shape s = shape_of(ts[0]);
  int64_t n = 0;
  bool ragged = false;
  for (auto& t : ts) {
    const Shape sh = shape_of(t);
    ONYX_CHECK(t.dtype() == ts[0].dtype() && sh.size() == s.size(),
               "evaluation: batches disagree "
               "in dtype or rank (",
               dtype_name(t.dtype()), shape_str(t.shape()), " vs ", dtype_name(ts[0].dtype()),
               shape_str(ts[0].shape()), ")");
    n += sh[0];
    for (size_t d = 1; d < s.size(); d++) {
      ragged |= sh[d] != s[d];
      s[d] = std::max(s[d], sh[d]);
    }
  }
  s[0] = n;
  Shape out_shape = s;
  if (ts[0].rank() <= 1) out_shape.pop_back();  // back to [N]
  Tensor out(ts[0].dtype(), out_shape);
  if (ragged) {
    if (out.dtype() == DType::Float32)
      std::fill_n(out.data<float>(), out.numel(), -100.0f);
    else if (out.dtype() == DType::Int64)
      std::fill_n(out.data<int64_t>(), out.numel(), int64_t{-100});
    else if (out.dtype() == DType::Int32)
      std::fill_n(out.data<int32_t>(), out.numel(), -100);
    else
      std::memset(out.raw(), 0, out.nbytes());
  }
  const size_t es = dtype_size(out.dtype());
  int64_t row0 = 0;
  for (auto& t : ts) {
    const Shape sh = shape_of(t);
    const int64_t inner = sh.back(), rows = inner ? t.numel() / inner : 0;
    for (int64_t r = 0; r < rows; r++) {
      int64_t rem = r, off = 0, stride = 1;  // r over sh[0..k-2] -> its place in out
      for (int d = (int)sh.size() - 2; d >= 0; d--) {
        const int64_t i = rem % sh[d] + (d == 0 ? row0 : 0);
        rem /= sh[d];
        off += i * stride;
        stride *= s[d];
      }
      std::memcpy((char*)out.raw() + off * s.back() * es, (const char*)t.raw() + r * inner * es,
                  inner * es);
    }
    row0 += sh[0];
  }
  return out;
}

PredictionOutput Trainer::run_eval(const data::Dataset& ds, bool with_metrics,
                                   bool keep_predictions) {
  auto& ts = *impl_->ts;
  // bf16_full_eval outside train(): Transformers' evaluation_loop runs model.to(torch.bfloat16)
  // there; onyx reads the trained weights rounded to bf16 for this evaluation (the weights
  // themselves stay float32) and gives the GEMMs bf16 inputs.
  // fp16_full_eval likewise with float16 (model.half()).
  struct FullEval {
    train::TrainingSession& ts;
    FullEval(train::TrainingSession& s, kernels::LowPrecision f) : ts(s) {
      ts.weights_changed();  // the weights may have been written through weights() views
      ts.set_full_eval(f);
    }
    ~FullEval() { ts.set_full_eval(kernels::LowPrecision::None); }
  } full_eval(ts, impl_->in_train        ? kernels::LowPrecision::None
                  : args_.bf16_full_eval ? kernels::LowPrecision::Bf16
                  : args_.fp16_full_eval ? kernels::LowPrecision::Fp16
                                         : kernels::LowPrecision::None);
  std::string pred_name = model_.predictions;
  if (pred_name.empty())
    for (auto& o : model_.graph->outputs)
      if (model_.loss.kind != autodiff::LossSpec::Kind::GraphOutput ||
          o.name != model_.loss.output) {
        if (model_.loss.kind == autodiff::LossSpec::Kind::GraphOutput &&
            model_.loss.output.empty() && &o == &model_.graph->outputs[0])
          continue;
        pred_name = o.name;
        break;
      }
  std::string label_name =
      model_.loss.kind != autodiff::LossSpec::Kind::GraphOutput ? model_.loss.labels : "";
  if (label_name.empty()) {
    for (auto& k : ds.keys())
      if (k == "labels" || k == "label") label_name = k;
  }
  double loss_sum = 0;
  int64_t n_loss = 0;
  std::vector<Tensor> preds, labels;
  // Model::logged_outputs (DPO's metrics): the mean over the batches, as TRL averages its eval
  // _metrics (reported as eval_<name>)
  std::map<std::string, double> logged_sums;
  int64_t logged_batches = 0;
  // predict() returns the predictions; evaluate() keeps them only for metrics that read them
  const bool keep_preds =
      keep_predictions || !with_metrics || (compute_metrics_ && metrics_need_predictions_);
  auto order = train::eval_order(ds, args_);
  // dataloader_drop_last applies to evaluation too, as Transformers' eval DataLoader has it
  for (auto& idx :
       data::make_batches(order, args_.per_device_eval_batch_size, args_.dataloader_drop_last)) {
    auto batch = load_batch(ds, idx);
    auto out = ts.forward(batch);
    if (out.count("loss")) {
      loss_sum += out["loss"].get_as_double(0) * (double)idx.size();
      n_loss += (int64_t)idx.size();
    }
    for (auto& name : model_.logged_outputs)
      if (out.count(name)) logged_sums[name] += out[name].get_as_double(0);
    logged_batches++;
    if (keep_preds && !pred_name.empty() && out.count(pred_name)) preds.push_back(out[pred_name]);
    if (!label_name.empty() && batch.count(label_name)) labels.push_back(batch[label_name]);
    for (auto& cb : callbacks_) cb->on_prediction_step(args_, state_, control_);
  }
  ts.release_activation_memory(false);  // training resumes: its arena, not evaluation's, is needed
  PredictionOutput po;
  po.predictions = concat_padded(preds);
  po.label_ids = concat_padded(labels);
  if (n_loss) po.metrics["loss"] = loss_sum / n_loss;
  for (auto& [name, sum] : logged_sums) po.metrics[name] = sum / (double)logged_batches;
  if (model_.logs_num_tokens) po.metrics["num_tokens"] = (double)state_.num_input_tokens_seen;
  if (args_.predict_with_generate) {  // predictions: the generated ids (Seq2SeqTrainer's)
    Tensor generated;
    auto g = generation_metrics(ds, &generated);
    po.metrics.insert(g.begin(), g.end());
    // Seq2SeqTrainer's predictions, which compute_metrics reads too
    if (keep_predictions || compute_metrics_) po.predictions = generated;
  }
  // Metrics are what was asked for: perplexity only when the metrics name it (a language model's
  // exp(eval loss)), not for every model with a loss.
  if (with_metrics && compute_metrics_) {
    EvalPrediction ep{po.predictions, po.label_ids, n_loss ? loss_sum / n_loss : NAN};
    auto m = compute_metrics_(ep);
    po.metrics.insert(m.begin(), m.end());
  }
  return po;
}

// LoRA adapters merged into copies of the weights `w` of the layers of `graph` they adapt (an
// encoder–decoder's encoder and decoder each take the adapters of their own layers).
static void merge_adapters(const ir::Graph& graph, const models::LoraSpec& spec,
                           const std::map<std::string, Tensor>& adapter,
                           std::map<std::string, Tensor>& w) {
  ir::Graph g = graph;
  for (auto& [name, t] : w)
    if (g.initializers.count(name)) g.initializers[name] = t;
  std::map<std::string, Tensor> mine;  // the adapters (and trained biases) of g's layers
  for (auto& [saved, t] : adapter) {
    std::string module = saved.substr(std::min(saved.size(), strlen(models::kPeftPrefix)));
    for (const char* tail : {".lora_A.weight", ".lora_B.weight"})
      if (module.ends_with(tail))
        module = module.substr(0, module.size() - strlen(tail)) + ".weight";
    if (g.initializers.count(module)) mine[saved] = t;
  }
  models::merge_lora(g, spec, mine);
  for (auto& [name, t] : w)
    if (g.initializers.count(name)) t = g.initializers.at(name);
}

// The decoder with a KV cache (made on first use, or again when the evaluation precision or the
// layout changed) fed the Trainer's current weights: predict_with_generate's and GRPO's sampler.
// shared: the decoder laid out as the training graph stores its weights — LoRA adapters as nodes
// of their own, fed the trained adapters, and frozen weights stored in bf16 read as bf16 — so
// every weight it reads is a view of the Trainer's (GRPO: no copy per rollout); otherwise the
// adapters are merged into copies of the layers they adapt (predict_with_generate, as PEFT's
// merged model generates).
generate::Generator& Trainer::current_generator(kernels::LowPrecision low, bool shared) {
  auto& gen = impl_->generator;
  shared = shared && (!model_.adapter_tensors.empty() || !model_.bf16_weights.empty());
  if (!gen || impl_->generator_rounding != low || impl_->generator_shared != shared) {
    models::HfConfig c = models::parse_hf_config(model_.config_json, "the model's config.json");
    models::BuiltModel decoder = models::build_hf_decoder_with_past(c, 0);
    std::optional<models::BuiltModel> encoder;  // an encoder–decoder's, run once per batch
    if (models::is_encoder_decoder(c.model_type)) encoder = models::build_hf_encoder(c, 0);
    // bf16_full_eval / fp16_full_eval: model.to(dtype) rounds the inv_freq buffer generate()
    // reads too (the same copy as the evaluation graphs', train/training_session.cc)
    if (low != kernels::LowPrecision::None)
      decoder.model.graph = train::with_rounded_rotary_frequencies(*decoder.model.graph, low);
    if (shared) {
      auto g = std::make_shared<ir::Graph>(*decoder.model.graph);
      if (!model_.adapter_tensors.empty())
        models::apply_lora(
            *g, models::parse_adapter_config(model_.adapter_config_json, "LoRA config"), 0);
      if (!model_.bf16_weights.empty()) models::store_frozen_weights_bf16(*g, model_.bf16_weights);
      decoder.model.graph = g;
    }
    gen = std::make_unique<generate::Generator>(std::move(decoder), std::move(encoder));
    impl_->generator_rounding = low;
    impl_->generator_shared = shared;
    // generation_config.json travels with the model (processor_files); without one, the
    // defaults (greedy) and config.json's eos_token_id, as generate() reads it.
    generate::GenerationConfig d = generate::apply_generation_config_json(
        io::parse_json(model_.config_json, "predict_with_generate: the model's config.json"), {},
        "predict_with_generate: the model's config.json", true);
    for (auto& f : model_.processor_files)
      if (std::filesystem::path(f).filename() == "generation_config.json")
        d = generate::read_generation_config(std::filesystem::path(f).parent_path().string(), d);
    impl_->generation_defaults = d;
  }
  // The current weights (views); unless shared, LoRA adapters merged into copies of the layers
  // they adapt.
  std::map<std::string, Tensor> w;
  auto all = weights();
  std::vector<const ir::Graph*> graphs = {&gen->graph()};
  if (gen->is_encoder_decoder()) graphs.push_back(&gen->encoder_graph());
  for (const ir::Graph* graph : graphs)
    for (auto& [name, t] : graph->initializers) {
      auto it = all.find(name);
      ONYX_CHECK(it != all.end(), "predict_with_generate: the model has no weight '", name, "'");
      w[name] = it->second;
      if (w[name].dtype() == DType::BFloat16 && t.dtype() == DType::Float32) {
        // a frozen weight stored in bf16: the decoder reads float32 (a widened copy)
        Tensor f(DType::Float32, t.shape());
        kernels::bf16_to_f32(w[name].data<uint16_t>(), f.data<float>(), f.numel());
        w[name] = f;
      } else if (low != kernels::LowPrecision::None && w[name].dtype() == DType::Float32) {
        // bf16_full_eval / fp16_full_eval: the decoder generates from the rounded weights (a copy)
        Tensor f(DType::Float32, t.shape());
        kernels::round_to(low, w[name].data<float>(), f.data<float>(), f.numel());
        w[name] = f;
      }
    }
  if (!model_.adapter_tensors.empty() && !shared) {
    std::map<std::string, Tensor> adapter;
    for (auto& [graph_name, saved] : model_.adapter_tensors) adapter[saved] = all.at(graph_name);
    const models::LoraSpec spec =
        models::parse_adapter_config(model_.adapter_config_json, "LoRA config");
    for (const ir::Graph* graph : graphs) merge_adapters(*graph, spec, adapter, w);
  }
  gen->set_weights(std::move(w));
  return *gen;
}

Metrics Trainer::generation_metrics(const data::Dataset& ds, Tensor* generated) {
  const kernels::LowPrecision low = impl_->ts->full_eval();
  generate::Generator* gen = &current_generator(low);

  // Seq2SeqTrainer's priority: the generation_* arguments, then the model's generation_config
  generate::GenerationConfig cfg = impl_->generation_defaults;
  cfg.seed = (uint64_t)args_.seed;
  if (gen->is_encoder_decoder()) return seq2seq_generation_metrics(ds, *gen, cfg, generated);
  auto keys = ds.keys();
  auto has = [&](const char* k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); };
  ONYX_CHECK(has("input_ids") && has("labels"),
             "predict_with_generate: the eval dataset needs input_ids and labels");
  std::vector<std::vector<int64_t>> gens;
  train::GenerationScore score;
  int64_t skipped = 0;
  auto order = train::eval_order(ds, args_);
  for (auto& idx : data::make_batches(order, args_.per_device_eval_batch_size, false)) {
    auto batch = load_batch(ds, idx);
    const Tensor& ids = batch.at("input_ids");
    const Tensor& labels = batch.at("labels");
    const Tensor* mask = batch.count("attention_mask") ? &batch.at("attention_mask") : nullptr;
    const int64_t B = ids.dim(0), T = ids.dim(1);
    if (batch.count("position_ids")) {  // packed rows hold several prompts: not one to continue
      const int64_t* pp = batch.at("position_ids").data<int64_t>();
      for (int64_t i = 0; i < B * T; i++)
        ONYX_CHECK(i % T == 0 || pp[i] != 0 || (mask && mask->data<int64_t>()[i] == 0),
                   "predict_with_generate: eval row ", idx[i / T],
                   " packs several samples (position_ids restart); use packing: false for "
                   "eval_data");
    }
    std::vector<std::vector<int64_t>> prompts, refs;
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < B; r++) {
      const int64_t* ir = ids.data<int64_t>() + r * T;
      const int64_t* lr = labels.data<int64_t>() + r * T;
      int64_t first = -1, end = 0;
      for (int64_t t = 0; t < T; t++) {
        if (mask && mask->data<int64_t>()[r * T + t] == 0) continue;
        if (first < 0 && lr[t] != -100) first = t;
        if (lr[t] != -100) end = t + 1;
      }
      if (first <= 0) {  // no prompt (every token labelled) or no completion: nothing to score
        skipped++;
        gens.emplace_back();
        continue;
      }
      std::vector<int64_t> p;
      for (int64_t t = 0; t < first; t++)
        if (!mask || mask->data<int64_t>()[r * T + t]) p.push_back(ir[t]);
      prompts.push_back(p);
      refs.emplace_back(lr + first, lr + end);
      rows.push_back(r);
      gens.emplace_back();
    }
    if (prompts.empty()) continue;
    int64_t longest = 0;
    for (auto& r : refs) longest = std::max(longest, (int64_t)r.size());
    cfg.max_new_tokens = args_.generation_max_new_tokens.value_or(longest);
    if (!args_.generation_max_new_tokens && args_.generation_max_length) {
      cfg.max_new_tokens = -1;  // Seq2SeqTrainer's max_length: the padded prompt counts
      cfg.max_length = *args_.generation_max_length;
    }
    if (args_.generation_num_beams) cfg.num_beams = *args_.generation_num_beams;
    if (cfg.num_beams > 1) cfg.do_sample = false;  // (beam sampling: warned when read)
    auto out = gen->generate(prompts, cfg);
    for (size_t i = 0; i < out.size(); i++) {
      score.add(refs[i], out[i]);
      gens[gens.size() - (size_t)B + (size_t)rows[i]] = out[i];
    }
  }
  ONYX_CHECK(score.n > 0,
             "predict_with_generate: no eval sample has a prompt followed by labelled "
             "tokens (labels -100 on the prompt, as prompt/completion SFT data has)");
  if (generated) *generated = train::padded_rows(gens);
  Metrics m;
  score.write(m);
  if (skipped) m["gen_skipped"] = (double)skipped;
  return m;
}

void train::GenerationScore::add(const std::vector<int64_t>& ref, const std::vector<int64_t>& out) {
  int64_t same = 0;
  for (size_t t = 0; t < ref.size() && t < out.size(); t++) same += ref[t] == out[t];
  matched += same;
  ref_tokens += (int64_t)ref.size();
  exact += out.size() >= ref.size() && same == (int64_t)ref.size();
  n++;
}

void train::GenerationScore::write(Metrics& m) const {
  m["gen_exact_match"] = n ? (double)exact / (double)n : 0.0;
  m["gen_token_accuracy"] = ref_tokens ? (double)matched / (double)ref_tokens : 0.0;
}

Tensor train::padded_rows(const std::vector<std::vector<int64_t>>& rows) {
  int64_t width = 0;
  for (auto& r : rows) width = std::max(width, (int64_t)r.size());
  Tensor t(DType::Int64, {(int64_t)rows.size(), width});
  int64_t* d = t.data<int64_t>();
  std::fill(d, d + t.numel(), (int64_t)-100);
  for (size_t r = 0; r < rows.size(); r++)
    std::copy(rows[r].begin(), rows[r].end(), d + (int64_t)r * width);
  return t;
}

Metrics Trainer::evaluate(const std::string& prefix) {
  ONYX_CHECK(eval_ds_, "evaluate: no eval dataset");
  return evaluate_on(*eval_ds_, prefix, /*track_best=*/true);
}

Metrics Trainer::evaluate(const data::Dataset& ds, const std::string& prefix) {
  return evaluate_on(ds, prefix, /*track_best=*/false);
}

Metrics Trainer::evaluate_on(const data::Dataset& ds, const std::string& prefix, bool track_best) {
  auto t0 = std::chrono::steady_clock::now();
  PredictionOutput po = run_eval(ds, true);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Metrics m;
  for (auto& [k, v] : po.metrics) m[prefix + "_" + k] = v;
  m[prefix + "_runtime"] = secs;
  m[prefix + "_samples_per_second"] = secs > 0 ? ds.size() / secs : 0;
  LogEntry e;
  e.values = m;
  log(e);
  for (auto& cb : callbacks_) cb->on_evaluate(args_, state_, control_, m);
  // The best metric after the callbacks have seen the evaluation (Transformers'
  // _determine_best_metric): tracked when metric_for_best_model is set or load_best_model_at_end
  // is on (whose default metric is the loss).
  if (track_best && prefix == "eval" &&
      (args_.metric_for_best_model || args_.load_best_model_at_end)) {
    std::string key = "eval_" + args_.best_metric_name();
    auto it = m.find(key);
    if (it == m.end()) {
      std::string have;
      for (auto& [k, v] : m) have += (have.empty() ? "" : ", ") + k;
      throw Error(cat("metric_for_best_model '", args_.best_metric_name(),
                      "': the evaluation has no '", key, "' (it has: ", have, ")"));
    }
    double v = it->second;
    if (!state_.best_metric ||
        (args_.best_is_greater() ? v > *state_.best_metric : v < *state_.best_metric)) {
      state_.best_metric = v;
      if (args_.save_strategy != "no") state_.best_global_step = state_.global_step;
    }
  }
  return m;
}

PredictionOutput Trainer::predict(const data::Dataset& ds) {
  PredictionOutput po = run_eval(ds, true, /*keep_predictions=*/true);
  Metrics m;
  for (auto& [k, v] : po.metrics) m["test_" + k] = v;
  po.metrics = m;
  return po;
}

}  // namespace onyx
