// capi/onyx_c.cc — include/onyx/onyx_c.h over the C++ Trainer: each call catches every C++
// exception and turns it into a status and the thread's last-error message; inputs are wrapped
// in place (Tensor::wrap, no copy); the trainer is built as `onyx train` builds it
// (config::parse_run_config, model_from_config, dataset_from_spec).
#include "onyx/onyx_c.h"

#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>

#include "config/run_config.h"
#include "ir/onnx_io.h"
#include "kernels/cpu/simd/dispatch.h"
#include "onyx/trainer.h"
#include "passes/inference_export.h"
#include "quant/store_4bit.h"
#include "train/training_session.h"

struct onyx_trainer {
  std::unique_ptr<onyx::Trainer> trainer;
};

namespace {

thread_local std::string last_error;

// Runs `body`, mapping exceptions to ONYX_STATUS_ERROR with the message kept for onyx_last_error().
template <class F>
onyx_status guarded(F&& body) {
  try {
    body();
    last_error.clear();
    return ONYX_STATUS_OK;
  } catch (const std::bad_alloc&) {
    last_error = "out of memory";
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return ONYX_STATUS_ERROR;
}

onyx_status invalid(const char* what) {
  last_error = what;
  return ONYX_STATUS_INVALID_ARGUMENT;
}

// The trainer of a run config, with its datasets, as `onyx train` makes it.
onyx_trainer* make_trainer(const onyx::config::RunConfig& c) {
  using namespace onyx;
  std::shared_ptr<data::Dataset> train, eval;
  if (!c.train_data.empty()) train = config::dataset_from_spec(c.train_data, c, "train_data");
  if (!c.eval_data.empty()) eval = config::dataset_from_spec(c.eval_data, c, "eval_data");
  auto h = std::make_unique<onyx_trainer>();
  h->trainer = config::make_trainer(c, train, eval);
  return h.release();
}

// The caller's inputs as tensors over their memory.
std::map<std::string, onyx::Tensor> wrap_inputs(const onyx_input* inputs, size_t n) {
  using namespace onyx;
  std::map<std::string, Tensor> batch;
  for (size_t i = 0; i < n; i++) {
    const onyx_input& in = inputs[i];
    ONYX_CHECK(in.name && in.data && (in.shape || in.rank == 0), "input ", i,
               ": name, data and shape must be given");
    const int code = (int)in.dtype;
    ONYX_CHECK(code == ONYX_FLOAT32 || code == ONYX_UINT8 || code == ONYX_INT8 ||
                   code == ONYX_INT32 || code == ONYX_INT64 || code == ONYX_BOOL ||
                   code == ONYX_FLOAT64 || code == ONYX_BFLOAT16,
               "input '", in.name, "': dtype ", code, " is not an onyx_dtype");
    const DType dt = static_cast<DType>(code);
    Shape shape(in.shape, in.shape + in.rank);
    for (int64_t d : shape) ONYX_CHECK(d >= 0, "input '", in.name, "': negative dimension ", d);
    ONYX_CHECK(!batch.count(in.name), "input '", in.name, "' is given twice");
    batch[in.name] = Tensor::wrap(dt, std::move(shape), const_cast<void*>(in.data), nullptr);
  }
  return batch;
}

}  // namespace

extern "C" {

int onyx_c_api_version(void) { return ONYX_C_API_VERSION; }

const char* onyx_last_error(void) { return last_error.c_str(); }

const char* onyx_build_info(void) {
  static const std::string info = onyx::simd::describe();
  return info.c_str();
}

onyx_status onyx_trainer_create(const char* config_text, const char* base_dir, onyx_trainer** out) {
  if (!config_text || !out) return invalid("onyx_trainer_create: config_text and out are required");
  return guarded([&] {
    *out = make_trainer(onyx::config::parse_run_config(config_text, base_dir ? base_dir : ".",
                                                       "the C API's config"));
  });
}

onyx_status onyx_trainer_create_from_file(const char* path, onyx_trainer** out) {
  if (!path || !out) return invalid("onyx_trainer_create_from_file: path and out are required");
  return guarded([&] { *out = make_trainer(onyx::config::load_run_config(path, {})); });
}

void onyx_trainer_free(onyx_trainer* t) { delete t; }

onyx_status onyx_trainer_train(onyx_trainer* t, double* training_loss) {
  if (!t) return invalid("onyx_trainer_train: null trainer");
  return guarded([&] {
    const double loss = t->trainer->train().training_loss;
    if (training_loss) *training_loss = loss;
  });
}

onyx_status onyx_trainer_train_step(onyx_trainer* t, const onyx_input* inputs, size_t n,
                                    float* loss) {
  if (!t || (n && !inputs)) return invalid("onyx_trainer_train_step: null trainer or inputs");
  return guarded([&] {
    const double l = t->trainer->train_step(wrap_inputs(inputs, n));
    if (loss) *loss = (float)l;
  });
}

onyx_status onyx_trainer_optimizer_step(onyx_trainer* t) {
  if (!t) return invalid("onyx_trainer_optimizer_step: null trainer");
  return guarded([&] { t->trainer->optimizer_step(); });
}

onyx_status onyx_trainer_lazy_reset_grad(onyx_trainer* t) {
  if (!t) return invalid("onyx_trainer_lazy_reset_grad: null trainer");
  return guarded([&] { t->trainer->reset_gradients(); });
}

onyx_status onyx_trainer_eval_step(onyx_trainer* t, const onyx_input* inputs, size_t n,
                                   float* loss) {
  if (!t || (n && !inputs) || !loss)
    return invalid("onyx_trainer_eval_step: null trainer, inputs or loss");
  return guarded([&] { *loss = (float)t->trainer->eval_step(wrap_inputs(inputs, n)); });
}

onyx_status onyx_trainer_evaluate(onyx_trainer* t, const char* metric, double* value) {
  if (!t || !metric || !value) return invalid("onyx_trainer_evaluate: null argument");
  return guarded([&] {
    const onyx::Metrics m = t->trainer->evaluate();
    auto it = m.find(metric);
    if (it == m.end()) {
      std::string keys;
      for (auto& [k, v] : m) keys += (keys.empty() ? "" : ", ") + k;
      throw onyx::Error(onyx::cat("onyx_trainer_evaluate: the evaluation has no '", metric,
                                  "' (it has ", keys, ")"));
    }
    *value = it->second;
  });
}

onyx_status onyx_trainer_get_learning_rate(onyx_trainer* t, double* lr) {
  if (!t || !lr) return invalid("onyx_trainer_get_learning_rate: null argument");
  return guarded([&] { *lr = t->trainer->learning_rate(); });
}

onyx_status onyx_trainer_set_learning_rate(onyx_trainer* t, double lr) {
  if (!t) return invalid("onyx_trainer_set_learning_rate: null trainer");
  return guarded([&] { t->trainer->set_learning_rate(lr); });
}

onyx_status onyx_trainer_global_step(onyx_trainer* t, int64_t* step) {
  if (!t || !step) return invalid("onyx_trainer_global_step: null argument");
  *step = t->trainer->state().global_step;
  return ONYX_STATUS_OK;
}

onyx_status onyx_trainer_parameters_size(onyx_trainer* t, size_t* count) {
  if (!t || !count) return invalid("onyx_trainer_parameters_size: null argument");
  return guarded([&] { *count = (size_t)t->trainer->session().params().layout().numel; });
}

onyx_status onyx_trainer_copy_parameters_to(onyx_trainer* t, float* buffer, size_t count) {
  if (!t || !buffer) return invalid("onyx_trainer_copy_parameters_to: null argument");
  return guarded([&] {
    const auto& p = std::as_const(t->trainer->session()).params();
    ONYX_CHECK((int64_t)count == p.layout().numel, "onyx_trainer_copy_parameters_to: count ", count,
               " is not the parameters' ", p.layout().numel);
    std::memcpy(buffer, p.flat().data<float>(), count * sizeof(float));
  });
}

onyx_status onyx_trainer_copy_parameters_from(onyx_trainer* t, const float* buffer, size_t count) {
  if (!t || !buffer) return invalid("onyx_trainer_copy_parameters_from: null argument");
  return guarded([&] {
    auto& p = t->trainer->session().params();  // (marks the bf16 shadow stale)
    ONYX_CHECK((int64_t)count == p.layout().numel, "onyx_trainer_copy_parameters_from: count ",
               count, " is not the parameters' ", p.layout().numel);
    std::memcpy(p.flat().data<float>(), buffer, count * sizeof(float));
  });
}

onyx_status onyx_trainer_save(onyx_trainer* t, const char* dir) {
  if (!t || !dir) return invalid("onyx_trainer_save: null argument");
  return guarded([&] { t->trainer->save_model(dir); });
}

onyx_status onyx_trainer_load(onyx_trainer* t, const char* dir) {
  if (!t || !dir) return invalid("onyx_trainer_load: null argument");
  return guarded([&] { t->trainer->load_weights(dir); });
}

onyx_status onyx_trainer_export_onnx(onyx_trainer* t, const char* path) {
  if (!t || !path) return invalid("onyx_trainer_export_onnx: null argument");
  return guarded([&] {
    const onyx::Model& m = t->trainer->model();
    // the graph with the current weights, a 4-bit base dequantized (standard ops only)
    onyx::ir::Graph g = *m.graph;
    for (auto& [name, w] : t->trainer->weights()) g.initializers[name] = w;
    onyx::quant::restore_float_weights(g);
    onyx::passes::InferenceExportOptions eo;  // the loss output removed, as `onyx export` does
    eo.loss_output = m.graph_loss_output();
    onyx::ir::save_onnx(onyx::passes::make_inference_graph(g, eo), path);
  });
}

}  // extern "C"
