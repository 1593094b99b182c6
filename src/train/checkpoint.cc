// train/checkpoint.cc — the Trainer's files: LogEntry / TrainerState to and from JSON
// (log_history.jsonl, trainer_state.json), save_model (model.safetensors, onyx_model.json,
// config.json, processor files), checkpoint-N folders written atomically (weights, optimizer
// moments, schedule, data position and loss accumulators in rng_state.json, training arguments,
// state), their rotation under save_total_limit keeping the best, and loading one for exact resume.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "ir/graph.h"
#include "quant/store_4bit.h"
#include "train/trainer_internal.h"

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace onyx {

// ---- log entries, state --------------------------------------------------------------------

static json entry_json(const LogEntry& e) {
  json j;
  for (auto& [k, v] : e.values) j[k] = v;
  j["epoch"] = e.epoch;
  j["step"] = e.step;
  return j;
}

std::string LogEntry::to_json() const { return entry_json(*this).dump(); }

std::string TrainerState::to_json() const {
  json j;
  j["epoch"] = epoch;
  j["global_step"] = global_step;
  j["max_steps"] = max_steps;
  j["num_train_epochs"] = num_train_epochs;
  j["logging_steps"] = logging_steps;
  j["eval_steps"] = eval_steps;
  j["save_steps"] = save_steps;
  j["train_batch_size"] = train_batch_size;
  j["num_input_tokens_seen"] = num_input_tokens_seen;
  j["best_metric"] = best_metric ? json(*best_metric) : json();
  j["best_global_step"] = best_global_step ? json(*best_global_step) : json();
  j["best_model_checkpoint"] = best_model_checkpoint ? json(*best_model_checkpoint) : json();
  j["is_local_process_zero"] = is_local_process_zero;
  j["is_world_process_zero"] = is_world_process_zero;
  j["is_hyper_param_search"] = false;
  j["total_flos"] = 0;
  json h = json::array();
  for (auto& e : log_history) h.push_back(entry_json(e));
  j["log_history"] = h;
  return j.dump(2);
}

TrainerState TrainerState::from_json(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(cat(what, ": not valid JSON: ", e.what()));
  }
  TrainerState s;
  try {
    s.epoch = j.at("epoch").get<double>();
    s.global_step = j.at("global_step").get<int64_t>();
    s.max_steps = j.at("max_steps").get<int64_t>();
    s.num_train_epochs = j.value("num_train_epochs", (int64_t)0);
    s.logging_steps = j.value("logging_steps", (int64_t)500);
    s.eval_steps = j.value("eval_steps", (int64_t)500);
    s.save_steps = j.value("save_steps", (int64_t)500);
    s.train_batch_size = j.value("train_batch_size", (int64_t)0);
    s.num_input_tokens_seen = j.value("num_input_tokens_seen", (int64_t)0);
    if (j.contains("best_metric") && !j["best_metric"].is_null())
      s.best_metric = j["best_metric"].get<double>();
    if (j.contains("best_global_step") && !j["best_global_step"].is_null())
      s.best_global_step = j["best_global_step"].get<int64_t>();
    if (j.contains("best_model_checkpoint") && !j["best_model_checkpoint"].is_null())
      s.best_model_checkpoint = j["best_model_checkpoint"].get<std::string>();
    for (auto& e : j.at("log_history")) {
      LogEntry le;
      for (auto& [k, v] : e.items()) {
        if (k == "epoch")
          le.epoch = v.get<double>();
        else if (k == "step")
          le.step = v.get<int64_t>();
        else if (v.is_number())
          le.values[k] = v.get<double>();
      }
      s.log_history.push_back(le);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(cat(what, ": missing or ill-typed field: ", e.what()));
  }
  return s;
}

// ---- model and checkpoints -----------------------------------------------------------------

static void fsync_path(const fs::path& p, bool dir) {
  int fd = ::open(p.c_str(), dir ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string Model::graph_loss_output() const {
  if (loss.kind != autodiff::LossSpec::Kind::GraphOutput) return "";
  return loss.output.empty() && !graph->outputs.empty() ? graph->outputs[0].name : loss.output;
}

std::map<std::string, Tensor> Trainer::weights() {
  auto& ts = *impl_->ts;
  std::map<std::string, Tensor> weights;
  for (auto& [name, t] : model_.graph->initializers)
    weights[name] = ts.params().views().count(name) ? ts.params().view(name)
                    : ts.buffers().count(name)      ? ts.buffers().at(name)
                                                    : t;
  return weights;
}

// PEFT's adapter tensors ("base_model.model.<module>.lora_A.weight") as diffusers' LoRA file:
// "<component>.<module>.lora.down.weight" (A) and ".lora.up.weight" (B), as
// convert_state_dict_to_diffusers and save_lora_weights write them, with the LoRA config's keys
// (prefixed "<component>.") as the header's lora_adapter_metadata, which carries lora_alpha.
// Adapters with trained biases have no such layout: only PEFT's files are written then.
static void save_diffusers_lora(const std::string& dir, const std::map<std::string, Tensor>& peft,
                                const std::string& config_json, const std::string& component) {
  auto replace_end = [](const std::string& s, const std::string& end, const std::string& by,
                        std::string& out) {
    if (s.size() < end.size() || s.compare(s.size() - end.size(), end.size(), end) != 0)
      return false;
    out = s.substr(0, s.size() - end.size()) + by;
    return true;
  };
  const std::string prefix = "base_model.model.";
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : peft) {
    std::string module = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name, key;
    if (!replace_end(module, ".lora_A.weight", ".lora.down.weight", key) &&
        !replace_end(module, ".lora_B.weight", ".lora.up.weight", key))
      return;
    out[component + "." + key] = t;
  }
  const nlohmann::json config = nlohmann::json::parse(config_json);
  nlohmann::json meta = nlohmann::json::object();
  for (auto it = config.begin(); it != config.end(); ++it) meta[component + "." + it.key()] = *it;
  io::save_safetensors((fs::path(dir) / "pytorch_lora_weights.safetensors").string(), out,
                       {{"format", "pt"}, {"lora_adapter_metadata", meta.dump(2)}});
}

void Trainer::save_model(const std::string& dir) {
  save_model_files(dir, impl_->ema != nullptr);
  if (impl_->comm->rank() != 0) return;
  for (auto& [name, from] : model_.side_folders) {
    const fs::path to = fs::path(dir) / name;
    std::error_code ec;
    if (fs::exists(to) && fs::equivalent(from, to, ec)) continue;  // saving into the pipeline
    fs::create_directories(to, ec);
    fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
    ONYX_CHECK(!ec, "cannot copy '", from, "' to '", to.string(), "': ", ec.message());
  }
}

void Trainer::save_model_files(const std::string& dir, bool ema_weights) {
  if (impl_->comm->rank() != 0) return;  // data parallel: rank 0 writes the model
  fs::create_directories(dir);
  // With LoRA, model.safetensors is the base model (what from_pretrained expects of the folder)
  // and the adapters go to adapter_model.safetensors below.
  std::map<std::string, Tensor> base = weights();
  if (ema_weights)
    for (auto& [name, view] : impl_->ema->views()) base[name] = view;
  for (auto it = base.begin(); it != base.end();) {
    bool adapter_only =
        model_.adapter_tensors.count(it->first) && it->first.find(".lora_") != std::string::npos;
    it = adapter_only ? base.erase(it) : std::next(it);
  }
  // QLoRA: the 4-bit weights as Transformers saves them (with their quant_map and quant_state)
  for (auto& [k, t] : quant::hf_state_tensors(*model_.graph)) base[k] = t;
  io::save_safetensors((fs::path(dir) / model_.weights_file).string(), base, {{"format", "pt"}});
  json m;
  m["source"] = model_.source;
  if (model_.loss.kind == autodiff::LossSpec::Kind::GraphOutput)
    m["loss_output"] = model_.graph_loss_output();
  else
    m["labels"] = model_.loss.labels;
  m["producer"] = "onyx";
  io::write_file_atomic((fs::path(dir) / "onyx_model.json").string(), m.dump(2) + "\n");
  if (!model_.config_json.empty())
    io::write_file_atomic((fs::path(dir) / "config.json").string(), model_.config_json);
  for (auto& [name, text] : model_.side_files)
    io::write_file_atomic((fs::path(dir) / name).string(), text);
  if (!model_.adapter_config_json.empty()) {  // LoRA: the adapter as PEFT saves it
    std::map<std::string, Tensor> all = weights(), adapter;
    for (auto& [name, saved] : model_.adapter_tensors) adapter[saved] = all.at(name);
    io::save_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), adapter,
                         {{"format", "pt"}});
    io::write_file_atomic((fs::path(dir) / "adapter_config.json").string(),
                          model_.adapter_config_json);
    if (!model_.diffusers_lora_component.empty())
      save_diffusers_lora(dir, adapter, model_.adapter_config_json,
                          model_.diffusers_lora_component);
  }
  for (auto& f : model_.processor_files) {
    fs::path to = fs::path(dir) / fs::path(f).filename();
    std::error_code ec;
    if (fs::exists(to) && fs::equivalent(f, to, ec)) continue;  // saving into the source folder
    fs::copy_file(f, to, fs::copy_options::overwrite_existing, ec);
    ONYX_CHECK(!ec, "cannot copy '", f, "' to '", to.string(), "': ", ec.message());
  }
}

// Optimizer state files: "optimizer.safetensors" when this rank's state covers the whole
// buffer (one process, DDP: rank 0 writes it), else one "optimizer-RRRRR-of-NNNNN.safetensors"
// per rank (ZeRO) with its element range in the metadata, so a resume at any world size and
// stage reads the ranges it needs (load_optimizer_range).
static std::string shard_file_name(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer-%05d-of-%05d.safetensors", rank, world);
  return buf;
}

// scheduler.json's key for the state of a metric-driven schedule (nullptr: the schedule has none).
static const char* metric_state_key(const std::string& type) {
  return type == "reduce_lr_on_plateau" ? "plateau" : type == "greedy" ? "greedy" : nullptr;
}

// ReduceLROnPlateau's / GreedyLR's state_dict, in short (best: null for torch's +-inf).
static json metric_state_json(const train::MetricLrState& s) {
  return {{"lr", s.lr},
          {"best", s.has_best ? json(s.best) : json(nullptr)},
          {"num_bad_epochs", s.num_bad},
          {"cooldown_counter", s.cooldown_counter},
          {"num_good_epochs", s.num_good},
          {"warmup_counter", s.warmup_counter},
          {"reset_start", s.reset_start},
          {"last_epoch", s.last_epoch},
          {"window", s.window},
          {"window_sum", s.window_sum}};
}

// (a checkpoint from before greedy has only the plateau's four fields)
static train::MetricLrState metric_state_from_json(const json& j) {
  train::MetricLrState s;
  s.lr = j.at("lr").get<double>();
  s.has_best = !j.at("best").is_null();
  s.best = s.has_best ? j.at("best").get<double>() : 0.0;
  s.num_bad = j.at("num_bad_epochs").get<int64_t>();
  s.cooldown_counter = j.at("cooldown_counter").get<int64_t>();
  s.num_good = j.value("num_good_epochs", (int64_t)0);
  s.warmup_counter = j.value("warmup_counter", (int64_t)0);
  s.reset_start = j.value("reset_start", (int64_t)-1);
  s.last_epoch = j.value("last_epoch", (int64_t)0);
  s.window = j.value("window", std::vector<double>{});
  s.window_sum = j.value("window_sum", 0.0);
  return s;
}

void Trainer::save_checkpoint() {
  auto& I = *impl_;
  dist::Comm& comm = *I.comm;
  const int rank = comm.rank(), world = comm.size();
  std::string name = cat("checkpoint-", state_.global_step);
  fs::path final_dir = fs::path(args_.output_dir) / name;
  // every rank must agree on the temporary folder's name (no pid under mpirun)
  fs::path tmp = fs::path(args_.output_dir) /
                 (world > 1 ? cat(".tmp-", name, "-ranks") : cat(".tmp-", name, "-", ::getpid()));
  // As Transformers 5: the best checkpoint is the one of the best evaluation's step, when that
  // step was saved (this one, or one still on disk).
  if (state_.best_global_step) {
    fs::path best = fs::path(args_.output_dir) / cat("checkpoint-", *state_.best_global_step);
    if (*state_.best_global_step == state_.global_step)
      state_.best_model_checkpoint = final_dir.string();
    else if (fs::exists(best))
      state_.best_model_checkpoint = best.string();
  }
  if (rank == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    save_model_files(tmp.string(), /*ema_weights=*/false);  // the live weights, to resume from
    save_ema(tmp.string());
    json sch;
    sch["last_epoch"] = state_.global_step;
    sch["type"] = args_.lr_scheduler_type;
    if (const char* key = metric_state_key(I.sched.type)) sch[key] = metric_state_json(I.metric_lr);
    io::write_file_atomic((tmp / "scheduler.json").string(), sch.dump(2) + "\n");
    json rng;
    rng["seed"] = args_.seed;
    rng["data_seed"] = I.data_seed;
    rng["epoch"] = I.epoch;
    rng["batches_done_in_epoch"] = I.batches_done;  // micro-batches of all ranks
    rng["loss_since_log"] = I.loss_since_log;
    rng["steps_since_log"] = I.steps_since_log;
    rng["loss_total"] = I.loss_total;
    rng["last_grad_norm"] = I.last_grad_norm;
    rng["skipped_steps"] = I.skipped_steps;
    rng["world_size"] = world;
    rng["zero_stage"] = args_.zero_stage;
    rng["per_device_train_batch_size"] = args_.per_device_train_batch_size;
    io::write_file_atomic((tmp / "rng_state.json").string(), rng.dump(2) + "\n");
    io::write_file_atomic((tmp / "training_args.json").string(), args_.to_json() + "\n");
    io::write_file_atomic((tmp / "trainer_state.json").string(), state_.to_json() + "\n");
  }
  comm.barrier();  // the folder exists
  const int64_t numel = I.ts->params().layout().numel;
  const bool whole = I.opt->range_begin == 0 && I.opt->range_end == numel;
  std::map<std::string, std::string> meta = {{"optimizer", args_.optimizer_name()},
                                             {"begin", std::to_string(I.opt->range_begin)},
                                             {"end", std::to_string(I.opt->range_end)},
                                             {"numel", std::to_string(numel)}};
  if (!whole)
    io::save_safetensors((tmp / shard_file_name(rank, world)).string(), I.opt->state(), meta);
  else if (rank == 0)
    io::save_safetensors((tmp / "optimizer.safetensors").string(), I.opt->state(), meta);
  comm.barrier();  // every shard is written
  if (rank == 0) {
    fsync_path(tmp, true);
    if (fs::exists(final_dir)) {
      fs::path old = fs::path(args_.output_dir) / cat(".old-", name, "-", ::getpid());
      fs::rename(final_dir, old);
      fs::rename(tmp, final_dir);
      fs::remove_all(old);
    } else {
      fs::rename(tmp, final_dir);
    }
    fsync_path(args_.output_dir, true);
  }
  comm.barrier();  // the checkpoint is complete before anyone goes on
  for (auto& cb : callbacks_) cb->on_save(args_, state_, control_);
  if (rank == 0) rotate_checkpoints();
}

std::map<std::string, Tensor> train::load_optimizer_range(const std::string& dir, int64_t begin,
                                                          int64_t end, int64_t numel) {
  fs::path d(dir);
  std::vector<fs::path> files;
  if (fs::exists(d / "optimizer.safetensors")) {
    files.push_back(d / "optimizer.safetensors");
  } else if (fs::is_directory(d)) {
    for (auto& e : fs::directory_iterator(d)) {
      std::string n = e.path().filename().string();
      if (n.rfind("optimizer-", 0) == 0 && n.size() > 12 &&
          n.substr(n.size() - 12) == ".safetensors")
        files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  }
  ONYX_CHECK(!files.empty(), "checkpoint '", dir,
             "' has no optimizer.safetensors (nor optimizer-R-of-N shards)");
  std::map<std::string, Tensor> out;
  int64_t covered = 0;
  for (auto& f : files) {
    auto sf = io::load_safetensors(f.string());
    auto meta_int = [&](const char* key, int64_t fallback) -> int64_t {
      auto it = sf.metadata.find(key);
      if (it == sf.metadata.end()) return fallback;
      try {
        return std::stoll(it->second);
      } catch (...) {
        throw Error(
            cat("'", f.string(), "': metadata '", key, "' is not an integer: '", it->second, "'"));
      }
    };
    int64_t fb = meta_int("begin", 0), fe = -1;
    for (auto& [k, t] : sf.tensors)
      if (k != "step") fe = fb + t.numel();
    if (fe < 0) fe = meta_int("end", fb);
    ONYX_CHECK(meta_int("end", fe) == fe && meta_int("numel", numel) == numel, "'", f.string(),
               "': holds elements [", fb, ", ", meta_int("end", fe), ") of a buffer of ",
               meta_int("numel", numel), " elements; this model's has ", numel);
    const int64_t b = std::max(begin, fb), e = std::min(end, fe);
    for (auto& [k, t] : sf.tensors) {
      if (k == "step") {
        out[k] = t.clone();
        continue;
      }
      ONYX_CHECK(t.dtype() == DType::Float32 && t.rank() == 1 && t.numel() == fe - fb, "'",
                 f.string(), "': state '", k, "' is ", dtype_name(t.dtype()), " ",
                 shape_str(t.shape()), ", expected float32 [", fe - fb, "]");
      auto it = out.find(k);
      if (it == out.end()) it = out.emplace(k, Tensor::zeros(DType::Float32, {end - begin})).first;
      if (e > b)
        std::memcpy(it->second.data<float>() + (b - begin), t.data<float>() + (b - fb),
                    (size_t)(e - b) * sizeof(float));
    }
    if (e > b) covered += e - b;
  }
  bool has_moments = false;
  for (auto& [k, t] : out) has_moments |= k != "step";
  ONYX_CHECK(!has_moments || covered == end - begin, "checkpoint '", dir,
             "': the optimizer files cover ", covered, " of the elements [", begin, ", ", end,
             ") this rank needs (a shard is missing?)");
  return out;
}

void Trainer::rotate_checkpoints() {
  if (!args_.save_total_limit) return;
  std::vector<std::pair<int64_t, fs::path>> cks;
  for (auto& e : fs::directory_iterator(args_.output_dir)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("checkpoint-", 0) == 0) {
      try {
        cks.push_back({std::stoll(n.substr(11)), e.path()});
      } catch (...) {
      }
    }
  }
  std::sort(cks.begin(), cks.end());
  // As Transformers' _sorted_checkpoints / _rotate_checkpoints: the best checkpoint is never
  // deleted (it moves to the second-newest place, the newest stays last, so a run can always be
  // resumed), and a limit of 1 keeps two when the best is not the newest.
  bool best_is_newest = false;
  if (state_.best_model_checkpoint) {
    for (size_t i = 0; i < cks.size(); i++)
      if (fs::path(*state_.best_model_checkpoint).filename() == cks[i].second.filename()) {
        for (size_t j = i; j + 2 < cks.size(); j++) std::swap(cks[j], cks[j + 1]);
        best_is_newest = i + 1 == cks.size();
        break;
      }
  }
  int64_t limit = *args_.save_total_limit;
  if (limit == 1 && state_.best_model_checkpoint && !best_is_newest) limit = 2;
  while ((int64_t)cks.size() > limit) {
    fs::remove_all(cks.front().second);
    cks.erase(cks.begin());
  }
}

std::map<std::string, Tensor> Trainer::read_checkpoint_weights(const std::string& dir) {
  fs::path d(dir);
  auto weights = io::load_safetensors((d / model_.weights_file).string()).tensors;
  if (!model_.adapter_tensors.empty()) {  // LoRA: the adapters from adapter_model.safetensors
    ONYX_CHECK(fs::exists(d / "adapter_model.safetensors"), "checkpoint '", dir,
               "' has no adapter_model.safetensors (this run trains LoRA adapters)");
    auto adapter = io::load_safetensors((d / "adapter_model.safetensors").string());
    for (auto& [name, saved] : model_.adapter_tensors) {
      auto it = adapter.tensors.find(saved);
      ONYX_CHECK(it != adapter.tensors.end(), "checkpoint '", dir,
                 "': adapter_model.safetensors has no '", saved, "'");
      weights[name] = it->second;
    }
  }
  return weights;
}

void Trainer::load_weights(const std::string& dir) {
  ONYX_CHECK(fs::exists(fs::path(dir) / model_.weights_file), "'", dir, "' has no ",
             model_.weights_file);
  impl_->ts->load_weights(read_checkpoint_weights(dir), cat("checkpoint '", dir, "'"));
}

void Trainer::load_checkpoint(const std::string& dir) {
  fs::path d(dir);
  ONYX_CHECK(fs::is_directory(d), "resume_from_checkpoint: '", dir, "' is not a folder");
  auto& I = *impl_;
  auto read = [&](const char* f) {
    fs::path p = d / f;
    ONYX_CHECK(fs::exists(p), "checkpoint '", dir, "' has no ", f);
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  auto weights = read_checkpoint_weights(dir);
  // Parameters and BatchNorm running statistics (buffers), as they were at the save.
  I.ts->load_weights(weights, cat("checkpoint '", dir, "': ", model_.weights_file));
  // The optimizer state of this rank's range, from whatever world size and stage wrote it.
  I.opt->load_state(train::load_optimizer_range(dir, I.opt->range_begin, I.opt->range_end,
                                                I.ts->params().layout().numel));
  state_ = TrainerState::from_json(read("trainer_state.json"),
                                   cat("'", (d / "trainer_state.json").string(), "'"));
  json rng;
  try {
    rng = json::parse(read("rng_state.json"));
    I.epoch = rng.at("epoch").get<int64_t>();
    I.batches_done = rng.at("batches_done_in_epoch").get<int64_t>();
    I.loss_since_log = rng.at("loss_since_log").get<double>();
    I.steps_since_log = rng.at("steps_since_log").get<int64_t>();
    I.loss_total = rng.at("loss_total").get<double>();
    I.last_grad_norm = rng.at("last_grad_norm").get<double>();
    I.skipped_steps = rng.value("skipped_steps", (int64_t)0);
    I.data_seed = rng.at("data_seed").get<uint64_t>();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(cat("checkpoint '", dir, "': rng_state.json: ", e.what()));
  }
  const char* key = metric_state_key(I.sched.type);
  if (key && fs::exists(d / "scheduler.json")) {
    try {
      I.metric_lr = metric_state_from_json(json::parse(read("scheduler.json")).at(key));
    } catch (const std::exception& e) {
      throw Error(cat("checkpoint '", dir, "': scheduler.json: the ", key, " state: ", e.what()));
    }
  }
  // The log file continues exactly where the checkpoint's history ends.
  if (I.comm->rank() == 0) {
    std::string log_path = (fs::path(args_.output_dir) / "log_history.jsonl").string();
    std::string text;
    for (auto& e : state_.log_history) text += e.to_json() + "\n";
    io::write_file_atomic(log_path, text);
  }
}

}  // namespace onyx
