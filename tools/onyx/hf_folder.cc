// hf_folder.cc — see hf_folder.h.
#include "hf_folder.h"

#include <filesystem>
#include <iostream>

#include "diffusion/diffusers_folder.h"
#include "diffusion/unet2d_config.h"
#include "diffusion/vae.h"
#include "io/safetensors.h"
#include "models/hf_weights.h"
#include "passes/inference_export.h"
#include "runtime/session.h"
#include "train/training_session.h"

namespace onyx::cli {

namespace {

void save_and_list(const std::string& output, const std::map<std::string, Tensor>& out) {
  io::save_safetensors(output, out);
  for (auto& [k, t] : out)
    std::cout << k << ": " << dtype_name(t.dtype()) << " " << shape_str(t.shape()) << "\n";
}

// One forward + backward of `ts` on `in`: "loss" and every parameter's gradient into `output`.
int write_gradients(train::TrainingSession& ts, const std::map<std::string, Tensor>& in,
                    uint64_t seed, const std::string& output) {
  double loss = ts.forward_backward(in, /*accumulate=*/false, seed, /*training=*/true);
  std::map<std::string, Tensor> result;
  result["loss"] = Tensor::scalar_f32((float)loss);
  for (auto& p : ts.parameters()) result[p] = ts.grads().view(p);
  io::save_safetensors(output, result);
  std::cout << "loss " << loss << "; " << ts.parameters().size() << " gradients\n";
  return 0;
}

// A diffusers denoiser: the sampling graph's model_output for sample, timestep and the
// conditioning inputs (class_labels, encoder_hidden_states).
int run_diffusers_folder(const std::string& dir, const std::string& inputs,
                         const std::string& output) {
  const bool vae = diffusion::diffusers_class_name(diffusion::read_text(
                       std::filesystem::path(dir) / "config.json")) == "AutoencoderKL";
  runtime::Session s(vae ? diffusion::load_vae_graph(dir) : diffusion::load_denoiser(dir).graph);
  s.check_supported();
  save_and_list(output, s.run(io::load_safetensors(inputs).tensors));
  return 0;
}

// A diffusers denoiser: the training objective's loss on pixel_values with the given noise and
// timesteps (drawn when absent), and its gradients (DiT's label dropout off: `onyx grad` is a
// deterministic pass).
int grad_diffusers_folder(const std::string& dir, const std::string& inputs,
                          const std::string& output, uint64_t seed) {
  diffusion::Objective o;
  o.schedule = diffusion::find_schedule_config(dir, "");
  Model m = diffusion::load_denoiser_training(dir, o, seed, /*class_dropout_prob=*/0);
  auto in = io::load_safetensors(inputs).tensors;
  m.fill_defaults(in);
  autodiff::GradientOptions opts;
  opts.loss = m.loss;
  train::TrainingSession ts(m.graph, opts);
  return write_gradients(ts, in, seed, output);
}

}  // namespace

int run_hf_folder_cli(const std::string& dir, const std::string& inputs,
                      const std::string& output) {
  if (diffusion::is_diffusers_folder(dir)) return run_diffusers_folder(dir, inputs, output);
  models::BuiltModel m = models::load_hf_folder(dir);
  passes::InferenceExportOptions opts;
  if (m.model.loss.kind == autodiff::LossSpec::Kind::GraphOutput)
    opts.loss_output = m.model.loss.output;
  auto g = std::make_shared<ir::Graph>(passes::make_inference_graph(*m.model.graph, opts));
  auto in = io::load_safetensors(inputs).tensors;
  models::fill_default_inputs(m, in);  // (an encoder–decoder's decoder_input_ids from labels)
  if (!g->find_input("labels")) in.erase("labels");
  for (auto it = in.begin(); it != in.end();)  // inputs only the removed loss needed
    it = !g->find_input(it->first) && m.model.graph->find_input(it->first) ? in.erase(it)
                                                                           : std::next(it);
  runtime::Session s(g);
  s.check_supported();
  save_and_list(output, s.run(in));
  return 0;
}

int grad_hf_folder_cli(const std::string& dir, const std::string& inputs, const std::string& output,
                       uint64_t seed, bool dropout) {
  if (diffusion::is_diffusers_folder(dir)) return grad_diffusers_folder(dir, inputs, output, seed);
  models::BuiltModel m = models::load_hf_folder(dir);
  ONYX_CHECK(m.task != models::Task::Base, dir, ": the bare model (",
             models::architecture_name(m.config.model_type, m.task),
             ") has no loss to differentiate");
  ir::Graph fwd = *m.model.graph;
  if (!dropout)  // Dropout without its training_mode input is the identity
    for (auto& n : fwd.nodes)
      if (n.op_type == "Dropout" && n.inputs.size() > 2) n.inputs.resize(2);
  auto in = io::load_safetensors(inputs).tensors;
  models::fill_default_inputs(m, in);
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  opts.frozen = m.model.frozen;  // (Whisper's encoder positions, BART's final_logits_bias)
  train::TrainingSession ts(std::make_shared<ir::Graph>(std::move(fwd)), opts);
  return write_gradients(ts, in, seed, output);
}

}  // namespace onyx::cli
