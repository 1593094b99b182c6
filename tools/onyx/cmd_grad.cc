// cmd_grad.cc — `onyx grad MODEL.onnx --inputs IN.safetensors --output GRADS.safetensors
// [--loss NAME] [--logits NAME --labels NAME [--loss-type cross_entropy|mse]] [--no-dropout]
// [--frozen A,B] [--bf16 | --fp16]`: one forward + backward in training mode; writes `loss` and
// one gradient per trainable float initializer, under the initializer's name. --bf16 / --fp16:
// mixed precision as `bf16: true` / `fp16: true` train (TrainingSession::set_bf16_gemm /
// set_fp16_gemm).
#include <chrono>
#include <filesystem>
#include <iostream>

#include "autodiff/gradient.h"
#include "commands.h"
#include "hf_folder.h"
#include "io/safetensors.h"
#include "ir/onnx_io.h"
#include "runtime/session.h"
#include "train/training_session.h"

namespace onyx::cli {

Action add_grad_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("grad", "one forward+backward pass; writes loss and gradients");
  struct Opts {
    std::string model, inputs, output, loss, logits, labels, loss_type = "cross_entropy";
    std::vector<std::string> frozen;
    bool no_dropout = false, bf16 = false, fp16 = false;
    uint64_t seed = 0;
    int64_t ignore_index = -100;
    float label_smoothing = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("model", o->model, "an .onnx file or a Hugging Face model folder")->required();
  cmd->add_option("--inputs", o->inputs, "safetensors with the graph inputs (and labels)")
      ->required();
  cmd->add_option("--output", o->output, "safetensors to write loss + gradients to")->required();
  cmd->add_option("--loss", o->loss, "name of a scalar graph output to use as the loss");
  cmd->add_option("--logits", o->logits, "append a loss on this output instead");
  cmd->add_option("--labels", o->labels, "labels input for --logits");
  cmd->add_option("--loss-type", o->loss_type, "cross_entropy (default) or mse");
  cmd->add_option("--ignore-index", o->ignore_index, "cross_entropy ignore_index (default -100)");
  cmd->add_option("--label-smoothing", o->label_smoothing, "cross_entropy label smoothing");
  cmd->add_option("--frozen", o->frozen, "initializers that get no gradient")->delimiter(',');
  cmd->add_flag("--no-dropout", o->no_dropout, "run Dropout as the identity");
  cmd->add_option("--seed", o->seed, "dropout seed");
  cmd->add_flag("--bf16", o->bf16, "mixed precision as bf16: true trains (bf16 GEMM inputs)");
  cmd->add_flag("--fp16", o->fp16, "mixed precision as fp16: true trains (emulated float16)");
  return [o]() {
    ONYX_CHECK(!(o->bf16 && o->fp16), "--bf16 and --fp16: at most one");
    ONYX_CHECK(!std::filesystem::is_directory(o->model) || !(o->bf16 || o->fp16),
               "--bf16 / --fp16 take an .onnx model (", o->model,
               " is a folder: train it with bf16: true instead)");
    if (std::filesystem::is_directory(o->model))
      return grad_hf_folder_cli(o->model, o->inputs, o->output, o->seed, !o->no_dropout);
    ir::Graph fwd = ir::load_onnx(o->model);
    if (o->no_dropout)  // Dropout without its training_mode input is the identity
      for (auto& n : fwd.nodes)
        if (n.op_type == "Dropout" && n.domain.empty() && n.inputs.size() > 2) n.inputs.resize(2);
    auto in = io::load_safetensors(o->inputs);
    autodiff::GradientOptions opts;
    if (!o->logits.empty()) {
      ONYX_CHECK(o->loss.empty(), "--loss and --logits cannot be used together");
      opts.loss.kind = o->loss_type == "mse" ? autodiff::LossSpec::Kind::MSE
                                             : autodiff::LossSpec::Kind::CrossEntropy;
      ONYX_CHECK(o->loss_type == "mse" || o->loss_type == "cross_entropy", "unknown --loss-type '",
                 o->loss_type, "' (cross_entropy or mse)");
      opts.loss.output = o->logits;
      opts.loss.labels = o->labels;
      opts.loss.ignore_index = o->ignore_index;
      opts.loss.label_smoothing = o->label_smoothing;
    } else {
      opts.loss.output = o->loss;
    }
    opts.frozen.insert(o->frozen.begin(), o->frozen.end());
    runtime::Session(std::make_shared<ir::Graph>(fwd)).check_supported();
    train::TrainingSession ts(std::make_shared<ir::Graph>(std::move(fwd)), opts);
    ts.set_bf16_gemm(o->bf16);
    ts.set_fp16_gemm(o->fp16);
    auto t0 = std::chrono::steady_clock::now();
    double loss = ts.forward_backward(in.tensors, /*accumulate=*/false, o->seed, !o->no_dropout);
    auto t1 = std::chrono::steady_clock::now();
    const auto& tg = ts.training_graph_for(in.tensors);
    std::map<std::string, Tensor> result;
    result["loss"] = Tensor::scalar_f32((float)loss);
    for (auto& p : ts.parameters()) result[p] = ts.grads().view(p);
    io::save_safetensors(o->output, result);
    double total = std::chrono::duration<double, std::milli>(t1 - t0).count();
    std::cout << "loss " << loss << "; " << ts.parameters().size()
              << " gradients; training graph: " << tg.graph->nodes.size() << " nodes ("
              << tg.backward_nodes << " backward), built in " << ts.last_build_ms()
              << " ms; first step (build + run) " << total << " ms\n";
    return 0;
  };
}

}  // namespace onyx::cli
