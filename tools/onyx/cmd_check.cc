// cmd_check.cc — `onyx check MODEL.onnx|HF_FOLDER|CONFIG.yaml [--loss NAME | --logits NAME
// --labels NAME [--loss-type cross_entropy|mse]] [--frozen A,B] [--key value ...]`: before any
// data is read, every op type of the training graph's forward part (the model as `onyx train`
// loads it, with the loss appended) with its count, whether a forward kernel exists, and whether
// it lies on the path from a trainable parameter to the loss and has a gradient rule
// (autodiff/coverage.h). Ends with "N op types: all supported" (exit 0) or an error naming every
// missing kernel and rule with its nodes (exit 1). `onyx train` runs the same check in the
// Trainer's constructor.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "autodiff/coverage.h"
#include "commands.h"
#include "config/run_config.h"
#include "onyx/trainer.h"

namespace fs = std::filesystem;

namespace onyx::cli {
namespace {

bool is_config(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  return ext == ".yaml" || ext == ".yml" || ext == ".json";
}

}  // namespace

Action add_check_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "check",
      "list every op of the training graph with its kernel and gradient rule; exit 1 "
      "naming the missing ones");
  struct Opts {
    std::string model, loss, logits, labels, loss_type = "cross_entropy";
    std::vector<std::string> frozen;
    int64_t ignore_index = -100;
    float label_smoothing = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("model", o->model,
                  "an .onnx file, a Hugging Face model folder, or a training config (.yaml/.json)")
      ->required();
  cmd->add_option("--loss", o->loss, "name of a scalar graph output to use as the loss (.onnx)");
  cmd->add_option("--logits", o->logits, "append a loss on this output instead (.onnx)");
  cmd->add_option("--labels", o->labels, "labels input for --logits");
  cmd->add_option("--loss-type", o->loss_type, "cross_entropy (default) or mse");
  cmd->add_option("--ignore-index", o->ignore_index, "cross_entropy ignore_index (default -100)");
  cmd->add_option("--label-smoothing", o->label_smoothing, "cross_entropy label smoothing");
  cmd->add_option("--frozen", o->frozen, "initializers that get no gradient")->delimiter(',');
  cmd->allow_extras();
  cmd->footer(
      "With a config, --key value overrides its keys as for `onyx train` (see `onyx train "
      "--help`); the config's loss, frozen and label_smoothing_factor apply.");
  return [o, cmd]() {
    const bool config = is_config(o->model) && !fs::is_directory(o->model);
    const bool folder = fs::is_directory(o->model);
    std::vector<std::string> extras = cmd->remaining();
    ONYX_CHECK(config || extras.empty(), "check: unknown argument '",
               extras.empty() ? "" : extras[0], "' (--key value overrides apply to a config file)");
    config::RunConfig cfg;
    if (config) {
      ONYX_CHECK(
          o->loss.empty() && o->logits.empty() && o->labels.empty(),
          "check: --loss / --logits / --labels apply to an .onnx model; a config names its loss");
      cfg = config::load_run_config(o->model, config::parse_overrides(extras));
    } else {
      ONYX_CHECK(!folder || (o->loss.empty() && o->logits.empty() && o->labels.empty()),
                 "check: --loss / --logits / --labels apply to an .onnx model; a Hugging Face "
                 "folder's loss comes from its task");
      cfg.path = o->model;
      cfg.model = o->model;
      if (!o->logits.empty()) {
        ONYX_CHECK(o->loss.empty(), "--loss and --logits cannot be used together");
        ONYX_CHECK(o->loss_type == "mse" || o->loss_type == "cross_entropy",
                   "unknown --loss-type '", o->loss_type, "' (cross_entropy or mse)");
        cfg.loss.kind = o->loss_type == "mse" ? autodiff::LossSpec::Kind::MSE
                                              : autodiff::LossSpec::Kind::CrossEntropy;
        cfg.loss.output = o->logits;
        cfg.loss.labels = o->labels;
        cfg.loss.ignore_index = o->ignore_index;
        cfg.loss.label_smoothing = o->label_smoothing;
      } else {
        ONYX_CHECK(o->labels.empty(), "--labels needs --logits");
        cfg.loss.output = o->loss;
      }
    }
    cfg.frozen.insert(cfg.frozen.end(), o->frozen.begin(), o->frozen.end());
    Model m = config::model_from_config(cfg);
    // The gradient options the Trainer's constructor builds (src/train/trainer.cc).
    autodiff::GradientOptions go;
    go.loss = m.loss;
    if (cfg.args.label_smoothing_factor > 0)
      go.loss.label_smoothing = (float)cfg.args.label_smoothing_factor;
    go.frozen = m.frozen;
    autodiff::CoverageReport r = autodiff::check_coverage(*m.graph, go);

    int64_t elements = 0;
    for (auto& p : r.parameters) elements += m.graph->initializers.at(p).numel();
    std::cout << "model: "
              << (config ? cfg.model.empty() ? std::string("(model spec)") : cfg.model : o->model)
              << "\n"
              << "graph: " << r.forward_nodes << " nodes";
    if ((int)r.graph->nodes.size() > r.forward_nodes)
      std::cout << " + " << r.graph->nodes.size() - r.forward_nodes << " of the loss";
    std::cout << "; loss '" << r.loss << "'; " << r.parameters.size() << " trainable parameter"
              << (r.parameters.size() == 1 ? "" : "s") << " (" << elements << " elements)\n"
              << "checked: the forward graph as loaded, with the loss appended; the optimization "
                 "passes add only onyx ops, which have kernels and gradient rules\n";
    size_t w = 2;
    for (auto& c : r.ops) w = std::max(w, c.op_type.size());
    size_t wd = 6;
    for (auto& c : r.ops) wd = std::max(wd, c.domain.empty() ? size_t(7) : c.domain.size());
    std::printf("%-*s  %-*s  %5s  %5s  %-7s  %s\n", (int)w, "op", (int)wd, "domain", "opset",
                "count", "forward", "gradient");
    for (auto& c : r.ops) {
      std::string grad = c.on_path.empty() ? (c.gradient ? "yes (not needed)" : "not needed")
                         : c.gradient      ? "yes"
                                           : "NO";
      if (!c.on_path.empty() && c.on_path.size() < c.nodes.size())
        grad += cat(" (", c.on_path.size(), " of ", c.count, " on the loss path)");
      std::printf("%-*s  %-*s  %5lld  %5d  %-7s  %s\n", (int)w, c.op_type.c_str(), (int)wd,
                  c.domain.empty() ? "ai.onnx" : c.domain.c_str(), (long long)c.opset, c.count,
                  c.forward ? "yes" : "NO", grad.c_str());
    }
    std::fflush(stdout);
    if (!r.ok()) throw Error(r.summary());
    ONYX_CHECK(!r.parameters.empty(), "the model has no trainable parameter: no float initializer",
               go.frozen.empty() ? "" : " that is not frozen", " (nothing to train)");
    std::cout << r.summary() << "\n";
    return 0;
  };
}

}  // namespace onyx::cli
