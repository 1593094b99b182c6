// cmd_plan.cc — `onyx plan CONFIG [--batch B] [--key value ...]`: builds the optimized training
// graph for one batch of the config's training data and prints, before running anything, what a
// step will do: the passes and the fusions they applied (with counts), the op histogram of the
// training graph, FLOPs per step, and the planned memory (activation arena, parameters,
// gradients, optimizer state).
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "config/run_config.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "onyx/trainer.h"
#include "runtime/plan_stats.h"
#include "train/training_session.h"

namespace onyx::cli {
namespace {

std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
  return b;
}

std::string op_name(const ir::Node& n) {
  return n.domain.empty() ? n.op_type : n.domain + "." + n.op_type;
}

// Pass name -> how many times it applied, in the order the passes ran.
struct PassTotals {
  std::map<std::string, int> applied;
  std::vector<std::string> order;
};

PassTotals print_passes(const passes::PassReport& rep) {
  std::cout << "passes (forward graph " << rep.nodes_before << " -> " << rep.nodes_after
            << " nodes):\n";
  PassTotals t;
  for (auto& s : rep.stats) {
    if (!t.applied.count(s.pass)) t.order.push_back(s.pass);
    t.applied[s.pass] += s.applied;
  }
  for (auto& p : t.order) std::printf("  %-34s %6d\n", p.c_str(), t.applied[p]);
  std::cout << "fusions applied:";
  bool any = false;
  for (auto& p : t.order)
    if ((p.find("fusion") != std::string::npos || p == "token_pruning") && t.applied[p] > 0) {
      std::cout << (any ? ", " : " ") << p << " x" << t.applied[p];
      any = true;
    }
  std::cout << (any ? "" : " none") << "\n";
  return t;
}

// The same step planned without recompute, for the memory gradient checkpointing saves (a second
// session: the first one's graph, report and plan stay as they are).
void print_recompute(train::TrainingSession& ts, const passes::PassReport& rep,
                     const PassTotals& totals, const std::map<std::string, Tensor>& b) {
  train::TrainingSession plain(ts.forward_graph(), ts.options());
  passes::OptimizeOptions po = ts.pass_options();
  po.recompute = false;
  plain.set_pass_options(po);
  double without = plain.planned_activation_bytes(b);
  double with = ts.planned_activation_bytes(b);
  auto it = totals.applied.find("recompute_layers");
  std::cout << "gradient_checkpointing: " << rep.recomputed_layers << " layers recomputed ("
            << (it == totals.applied.end() ? 0 : it->second) << " nodes cloned); activations "
            << mib(without) << " -> " << mib(with) << " (saves " << mib(without - with) << ")\n";
}

void print_op_histogram(const autodiff::TrainingGraph& tg, const runtime::Plan& plan) {
  std::map<std::string, int> hist;
  for (auto& st : plan.steps) hist[op_name(tg.graph->nodes[st.node])]++;
  std::vector<std::pair<int, std::string>> rows;
  for (auto& [op, c] : hist) rows.push_back({c, op});
  std::sort(rows.rbegin(), rows.rend());
  std::cout << "training graph: " << plan.steps.size() << " steps (" << tg.backward_nodes
            << " backward nodes built), ops:\n";
  for (auto& [c, op] : rows) std::printf("  %-34s %6d\n", op.c_str(), c);
}

void print_fp16() {
  std::cout << "fp16 (mixed precision, emulated: these CPUs have no float16 arithmetic): "
               "MatMulT, MatMulGradB, LinearCrossEntropy, attention's tiles and Conv round "
               "their float32 inputs to float16 per call and multiply them with float32 GEMMs; "
               "the graph and its memory are float32's\n";
}

// Which ops run with bf16 inputs (read off the planned metas), what the mixed_precision pass did,
// and the memory it saves (the same step planned with float32 operands, in a second session).
void print_bf16(train::TrainingSession& ts, const passes::PassReport& rep,
                const autodiff::TrainingGraph& tg, const runtime::Plan& plan,
                const std::map<std::string, Tensor>& b) {
  std::map<std::string, int> low;
  for (auto& st : plan.steps) {
    const ir::Node& n = tg.graph->nodes[st.node];
    bool reads16 = false;
    for (auto& in : n.inputs) {
      auto m = plan.metas.find(in);
      reads16 = reads16 || (m != plan.metas.end() && m->second.dtype == DType::BFloat16);
    }
    if (reads16) low[op_name(n)]++;
  }
  const auto& mp = rep.mixed_precision;
  std::cout << "bf16 (mixed precision): GEMMs take bf16 inputs with float32 accumulation; "
               "norms, softmax, the loss, the residual stream, master weights and gradients "
               "stay float32\n  ops reading bf16 values:";
  for (auto& [op, c] : low) std::cout << " " << op << " x" << c;
  std::cout << (low.empty() ? " none" : "") << "\n  mixed_precision pass: " << mp.gemms
            << " GEMM nodes rewired, " << mp.fused << " values written bf16 by their producer, "
            << mp.casts << " Casts to bf16, " << mp.bias_grads
            << " gradients written bf16 by their BiasGrad, " << mp.norm_copies
            << " LayerNorm outputs copied to bf16 by the LayerNorm, " << mp.outputs
            << " GEMM outputs written bf16 for the GELU and attention, " << mp.normalized
            << " norm gradients reading the forward's bf16 normalized input, " << mp.weights
            << " weights read through the bf16 shadow the optimizer writes (other float32 "
               "operands are rounded per call)\n";
  train::TrainingSession f32(ts.forward_graph(), ts.options());
  f32.set_pass_options(ts.pass_options());
  f32.set_bf16_gemm(true, /*store_bf16=*/false);
  double without = f32.planned_activation_bytes(b), with = ts.planned_activation_bytes(b);
  std::printf("  activation arena %s with bf16 operands, %s with float32 ones (%.2fx)\n",
              mib(with).c_str(), mib(without).c_str(), without > 0 ? with / without : 1.0);
}

void print_flops(const autodiff::TrainingGraph& tg, const runtime::Plan& plan) {
  runtime::FlopCount fc = runtime::count_flops(*tg.graph, plan);
  std::printf("FLOPs per step: %.2f GFLOP", fc.total / 1e9);
  for (auto& [op, f] : fc.by_op) std::printf("; %s %.2f", op.c_str(), f / 1e9);
  std::printf("\n");
}

// Frozen weights (LoRA's base, `frozen` layers): read in place, float32, stored bf16
// (model_init_kwargs.dtype: bfloat16) or 4-bit (quantization_config: the packed codes and their
// absmax tensors).
struct FrozenBytes {
  double bytes = 0, bf16 = 0, q4 = 0, as_f32 = 0;
};

bool is_4bit_part(const ir::Graph& g, const std::string& name) {
  for (const char* s : {".absmax", ".nested_absmax", ".nested_quant_map"}) {
    const std::string suffix = s;
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      auto w = g.initializers.find(name.substr(0, name.size() - suffix.size()));
      if (w != g.initializers.end() && w->second.dtype() == DType::UInt8) return true;
    }
  }
  return false;
}

FrozenBytes frozen_bytes(train::TrainingSession& ts) {
  FrozenBytes f;
  const ir::Graph& g = *ts.forward_graph();
  for (auto& name : ts.options().frozen) {
    auto it = g.initializers.find(name);
    if (it == g.initializers.end()) continue;
    const Tensor& t = it->second;
    f.bytes += (double)t.nbytes();
    if (is_4bit_part(g, name)) {
      f.q4 += (double)t.nbytes();
    } else if (t.dtype() == DType::UInt8 && g.initializers.count(name + ".absmax")) {
      f.q4 += (double)t.nbytes();
      f.as_f32 += 8.0 * (double)t.numel();  // two 4-bit codes a byte
    } else {
      f.as_f32 += 4.0 * (double)t.numel();
      if (t.dtype() == DType::BFloat16) f.bf16 += (double)t.nbytes();
    }
  }
  return f;
}

// The memory of a training step, per rank under data parallelism (train/data_parallel.h): ZeRO
// shards the optimizer state (and with stage 2 the accumulated gradient); gradient accumulation
// over more than one local micro-batch keeps a second gradient buffer (stage 2: a shard-sized
// accumulator instead).
void print_memory(Trainer& t, const config::RunConfig& cfg, int world_flag,
                  const autodiff::TrainingGraph& tg, const runtime::Plan& plan,
                  const std::map<std::string, Tensor>& b) {
  train::TrainingSession& ts = t.session();
  std::set<std::string> bound;
  for (auto& [p, gname] : tg.gradients) {
    bound.insert(gname);
    bound.insert(passes::tied_gradient_output(gname));  // (when the graph has it)
  }
  double live = runtime::peak_live_bytes(*tg.graph, plan, bound);
  double arena = ts.planned_activation_bytes(b);
  const int64_t numel = ts.params().layout().numel;
  double pbytes = 4.0 * (double)numel;  // float32
  std::string opt = cfg.args.optimizer_name();
  int states = opt.rfind("adamw", 0) == 0 ? 2 : (cfg.args.sgd_momentum != 0 ? 1 : 0);
  const int world = world_flag > 0 ? world_flag : t.parallel_info().world_size;
  const int zero = (int)cfg.args.zero_stage;
  const auto part = dist::Partition::of(numel, world);
  const double shard_bytes = 4.0 * (double)(zero ? part.end(0) - part.begin(0) : numel);
  const bool ga = cfg.args.gradient_accumulation_steps > 1;
  const double accum = !ga ? 0 : zero == 2 ? shard_bytes : pbytes;
  const FrozenBytes frozen = frozen_bytes(ts);
  // mixed precision: the bf16 copy of the weights the GEMMs read (TrainingSession::bf16_shadow)
  const double shadow = ts.bf16_shadow() ? (double)ts.bf16_shadow()->flat().nbytes() : 0;
  const double total = arena + 2 * pbytes + shadow + accum + states * shard_bytes + frozen.bytes;
  std::cout << "memory plan: " << plan.memory.summary(bound) << "\n"
            << "  activations (arena)                " << mib(arena) << "  (" << mib(live)
            << " at the peak without in-place and views; " << mib((double)plan.memory.kept_bytes)
            << " kept for backward)\n"
            << "  parameters                         " << mib(pbytes) << "\n";
  if (frozen.bytes > 0)
    std::cout << "  frozen weights                     " << mib(frozen.bytes)
              << (frozen.bf16 > 0 ? cat("  (", mib(frozen.bf16), " of them bf16; ",
                                        mib(frozen.as_f32), " as float32)")
                  : frozen.q4 > 0 ? cat("  (", mib(frozen.q4), " of them 4-bit with their absmax; ",
                                        mib(frozen.as_f32), " as float32)")
                                  : std::string())
              << "\n";
  if (shadow > 0) std::cout << "  bf16 weight shadow                 " << mib(shadow) << "\n";
  std::cout << "  gradients                          " << mib(pbytes) << "\n";
  if (ga)
    std::cout << "  gradient accumulation buffer       " << mib(accum)
              << (zero == 2 ? "  (the local shard, ZeRO-2)" : "") << "\n";
  std::cout << "  optimizer state (" << states << " buffers)        " << mib(states * shard_bytes)
            << (zero ? cat("  (", (int64_t)(shard_bytes / 4), " of ", numel,
                           " elements per buffer: this rank's ZeRO shard)")
                     : std::string())
            << "\n"
            << "  total                              " << mib(total)
            << (world > 1 || zero ? cat("  per rank (world size ", world, ", ",
                                        zero ? cat("ZeRO stage ", zero) : std::string("DDP"), ")")
                                  : std::string())
            << "\n";
}

struct PlanOpts {
  std::string config;
  int64_t batch = 0;
  int world = 0;
};

int run_plan(const PlanOpts& o, const std::vector<std::string>& overrides) {
  auto cfg = config::load_run_config(o.config, config::parse_overrides(overrides));
  ONYX_CHECK(!cfg.train_data.empty(), "config '", o.config, "': 'train_data' is missing");
  auto ds = config::dataset_from_spec(cfg.train_data, cfg, "train_data");
  int64_t batch = o.batch > 0 ? o.batch : cfg.args.per_device_train_batch_size;
  ONYX_CHECK(ds->size() > 0, "config '", o.config, "': the training data is empty");
  batch = std::min<int64_t>(batch, ds->size());
  TrainingArguments args = cfg.args;  // planning a training step: no evaluation involved
  args.eval_strategy = "no";
  args.load_best_model_at_end = false;
  Model model = config::model_from_config(cfg);
  auto fill_defaults = model.fill_defaults;  // inputs the model fills (position_ids, masks)
  Trainer t(std::move(model), args, ds, nullptr);
  train::TrainingSession& ts = t.session();
  auto idx = data::make_batches(data::epoch_order(ds->size(), false, 0, 0), batch, false).at(0);
  auto b = ds->batch(idx);
  if (fill_defaults) fill_defaults(b);

  std::cout << "model: " << (cfg.model.empty() ? std::string("(model spec)") : cfg.model) << "\n";
  std::cout << "batch:";
  for (auto& [n, tn] : b)
    std::cout << " " << n << " " << dtype_name(tn.dtype()) << shape_str(tn.shape());
  std::cout << "\n";
  const auto& tg = ts.training_graph_for(b);
  const auto& rep = ts.pass_report_for(b);
  const runtime::Plan& plan = ts.plan_for(b);
  PassTotals totals = print_passes(rep);
  if (ts.pass_options().recompute) print_recompute(ts, rep, totals, b);
  print_op_histogram(tg, plan);
  if (cfg.args.fp16) print_fp16();
  if (cfg.args.bf16) print_bf16(ts, rep, tg, plan, b);
  print_flops(tg, plan);
  print_memory(t, cfg, o.world, tg, plan, b);
  return 0;
}

}  // namespace

Action add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan", "print the optimized training step of a config: fusions, ops, FLOPs, memory");
  auto o = std::make_shared<PlanOpts>();
  cmd->add_option("config", o->config, "config file (.yaml or .json), as for `onyx train`")
      ->required();
  cmd->add_option("--batch", o->batch, "batch size (default: per_device_train_batch_size)");
  cmd->add_option("--world-size", o->world,
                  "ranks to plan the per-rank memory for (default: this job's; 1 without mpirun)");
  cmd->allow_extras();
  cmd->footer(
      "Config keys and every TrainingArguments key (--key value overrides the file): "
      "see `onyx train --help`.");
  return [o, cmd]() { return run_plan(*o, cmd->remaining()); };
}

}  // namespace onyx::cli
