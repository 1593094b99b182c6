// diffusion/objective.cc — see objective.h. The arithmetic is diffusers' DDPMScheduler.add_noise /
// get_velocity and training_utils.compute_snr on the schedule's float32 tables (noise_schedule.h).
#include "diffusion/objective.h"

namespace onyx::diffusion {
namespace {

using models::Attr;
using models::GraphBuilder;

// x0 (B,C,H,W), the drawn or given noise and timesteps -> x_t, the target, the per-sample weight
// ("" without min-SNR) and the timesteps.
struct Noised {
  std::string x_t, target, weight, timesteps;
};

Noised add_noise(GraphBuilder& b, const Objective& o, const std::string& x0) {
  NoiseSchedule s(o.schedule);
  auto table = [&](const std::vector<float>& v) {
    return b.const_tensor(Tensor::from_vector<float>(DType::Float32, {(int64_t)v.size()}, v));
  };
  b.set_scope("noise_scheduler");
  std::string noise = b.op("DrawNormal", {"noise", x0});
  b.graph().nodes.back().domain = "onyx";
  std::string t = b.op("DrawIntegers", {"timesteps", x0}, {{"high", Attr::of_int(s.steps())}});
  b.graph().nodes.back().domain = "onyx";
  auto at_t = [&](const std::vector<float>& v) {  // v[t] as (B,1,1,1)
    return b.op("Reshape", {b.op("Gather", {table(v), t}), b.const_i64({-1, 1, 1, 1})});
  };
  std::string a = at_t(s.sqrt_alphas_cumprod()), sg = at_t(s.sqrt_one_minus_alphas_cumprod());
  Noised r;
  r.timesteps = t;
  r.x_t = b.op("Add", {b.op("Mul", {a, x0}), b.op("Mul", {sg, noise})});
  const std::string& pt = o.schedule.prediction_type;
  r.target = pt == "epsilon"  ? noise
             : pt == "sample" ? x0
                              : b.op("Sub", {b.op("Mul", {a, noise}), b.op("Mul", {sg, x0})});
  if (o.snr_gamma > 0) r.weight = b.op("Gather", {table(s.min_snr_weights(o.snr_gamma)), t});
  return r;
}

}  // namespace

std::string image_input(GraphBuilder& b, const std::string& name, int64_t channels) {
  return b.input(name, DType::Float32, {-1, channels, -1, -1},
                 {"batch_size", "", "height", "width"});
}

std::string batch_input(GraphBuilder& b, const std::string& name) {
  return b.input(name, DType::Int64, {-1}, {"batch_size"});
}

Model diffusion_training_model(GraphBuilder& b, int64_t channels, const Objective& o,
                               const Denoise& denoise, const std::string& config_json,
                               int64_t classes) {
  std::string x0 = image_input(b, "pixel_values", channels);
  image_input(b, "noise", channels);
  b.graph().inputs.back().has_shape = false;  // (0) when the batch has none: drawn
  batch_input(b, "timesteps");
  Noised n = add_noise(b, o, x0);
  std::string y = denoise(n.x_t, n.timesteps);
  b.set_scope("loss");
  b.op("Identity", {y}, {}, "model_output");
  std::string d = b.op("Sub", {y, n.target});
  std::string per_sample = b.op("ReduceMean", {b.op("Mul", {d, d}), b.const_i64({1, 2, 3})},
                                {{"keepdims", Attr::of_int(0)}});
  if (!n.weight.empty()) per_sample = b.op("Mul", {per_sample, n.weight});
  b.op("ReduceMean", {per_sample}, {{"keepdims", Attr::of_int(0)}}, "loss");
  b.output("loss", DType::Float32, {});
  b.output("model_output", DType::Float32, {-1, channels, -1, -1});
  Model m;
  m.graph = std::make_shared<ir::Graph>(b.take());
  m.loss.kind = autodiff::LossSpec::Kind::GraphOutput;
  m.loss.output = "loss";
  m.predictions = "model_output";
  m.generic_onnx = false;
  m.decay_all = true;
  m.weights_file = "diffusion_pytorch_model.safetensors";
  m.config_json = config_json;
  m.optional_inputs = {"noise", "timesteps", "class_labels"};
  m.fill_defaults = [classes](std::map<std::string, Tensor>& batch) {
    // an image classification dataset's labels are the class labels (or unused)
    auto labels = batch.find("labels");
    if (labels != batch.end()) {
      if (classes && !batch.count("class_labels")) batch["class_labels"] = labels->second;
      batch.erase("labels");
    }
    ONYX_CHECK(!classes || batch.count("class_labels"), "the model is class-conditional (", classes,
               " classes): the data needs class_labels or labels");
    // empty: drawn in the graph
    if (!batch.count("noise")) batch["noise"] = Tensor(DType::Float32, {0});
    if (!batch.count("timesteps")) batch["timesteps"] = Tensor(DType::Int64, {0});
  };
  return m;
}

}  // namespace onyx::diffusion
