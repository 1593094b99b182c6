// python/_onyx.cc — the extension module onyx._onyx: the C++ Trainer, TrainingArguments' key table,
// TrainerState / TrainerControl, for the Python package python/onyx/__init__.py (which holds the
// Transformers-shaped classes; this file is the thin layer under them).
//
// Binding library: nanobind (3.1), not pybind11. Reasons: its ndarray type wraps numpy memory and
// hands C++ memory to numpy without copies (datasets go into data::TensorDataset as Tensor::wrap
// views; predictions come back as arrays that own the C++ tensor), it compiles several times faster
// and links smaller modules (this machine has 2 cores), and scikit-build-core finds it by its
// CMake config with no setup.py. Built only by `pip install .` (CMakeLists.txt: if(SKBUILD)).
//
// GIL: train / evaluate / predict / save_model run with the GIL released; Python callbacks and
// compute_metrics take it back. A Python exception raised there is restored as the thread's error
// indicator, unwinds the C++ Trainer as PyPending, and is raised again to the caller unchanged.
// TrainerState and TrainerControl reach Python callbacks by reference (rv_policy::reference), so
// `control.should_training_stop = True` in Python sets the C++ Trainer's own control.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <memory>

#include "config/run_config.h"
#include "data/dataset.h"
#include "diffusion/diffusers_folder.h"
#include "diffusion/sampler.h"
#include "diffusion/text_encoder.h"
#include "diffusion/vae.h"
#include "models/hf_model.h"
#include "models/lora.h"
#include "onyx/custom_ops.h"
#include "onyx/error.h"
#include "onyx/trainer.h"
#include "onyx/training_args.h"
#include "runtime/parallel.h"
#include "train/grpo.h"
#include "train/progress.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace onyx::python {
namespace {

// A Python exception is pending (set as this thread's error indicator) and unwinds C++ code.
struct PyPending {};

// Runs f with the GIL released; a Python exception raised inside (PyPending) is raised again.
template <class F>
auto without_gil(F&& f) {
  try {
    nb::gil_scoped_release release;
    return f();
  } catch (const PyPending&) {
    throw nb::python_error();
  }
}

// Calls fn(*args, **kwargs) with the GIL held; a Python exception becomes PyPending.
nb::object call_py(nb::handle fn, nb::tuple args, nb::dict kwargs) {
  PyObject* r = PyObject_Call(fn.ptr(), args.ptr(), kwargs.ptr());
  if (!r) throw PyPending{};
  return nb::steal(r);
}

// ---- dtypes and arrays ------------------------------------------------------------------------

DType dtype_of(nb::dlpack::dtype d) {
  using C = nb::dlpack::dtype_code;
  if (d.lanes != 1) throw Error("arrays with vector lanes are not supported");
  C c = (C)d.code;
  if (c == C::Float && d.bits == 32) return DType::Float32;
  if (c == C::Float && d.bits == 64) return DType::Float64;
  if (c == C::Float && d.bits == 16) return DType::Float16;
  if (c == C::Bfloat && d.bits == 16) return DType::BFloat16;
  if (c == C::Int && d.bits == 64) return DType::Int64;
  if (c == C::Int && d.bits == 32) return DType::Int32;
  if (c == C::Int && d.bits == 16) return DType::Int16;
  if (c == C::Int && d.bits == 8) return DType::Int8;
  if (c == C::UInt && d.bits == 8) return DType::UInt8;
  if (c == C::UInt && d.bits == 16) return DType::UInt16;
  if (c == C::UInt && d.bits == 32) return DType::UInt32;
  if (c == C::UInt && d.bits == 64) return DType::UInt64;
  if (c == C::Bool && d.bits == 8) return DType::Bool;
  throw Error(cat("unsupported array dtype (code ", (int)d.code, ", ", (int)d.bits, " bits)"));
}

nb::dlpack::dtype dlpack_of(DType t) {
  using C = nb::dlpack::dtype_code;
  auto mk = [](C c, int bits) { return nb::dlpack::dtype{(uint8_t)c, (uint8_t)bits, 1}; };
  switch (t) {
    case DType::Float32:
      return mk(C::Float, 32);
    case DType::Float64:
      return mk(C::Float, 64);
    case DType::Float16:
      return mk(C::Float, 16);
    case DType::BFloat16:
      return mk(C::Bfloat, 16);
    case DType::Int64:
      return mk(C::Int, 64);
    case DType::Int32:
      return mk(C::Int, 32);
    case DType::Int16:
      return mk(C::Int, 16);
    case DType::Int8:
      return mk(C::Int, 8);
    case DType::UInt8:
      return mk(C::UInt, 8);
    case DType::UInt16:
      return mk(C::UInt, 16);
    case DType::UInt32:
      return mk(C::UInt, 32);
    case DType::UInt64:
      return mk(C::UInt, 64);
    case DType::Bool:
      return mk(C::Bool, 8);
    default:
      throw Error(cat("tensor dtype ", dtype_name(t), " has no numpy equivalent"));
  }
}

using CpuArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

// A numpy array as a Tensor without a copy: the Tensor's storage owner holds a reference to the
// array (released with the GIL taken, whichever thread drops the last Tensor).
Tensor tensor_from_array(nb::handle obj, const std::string& what) {
  CpuArray a;
  if (!nb::try_cast(obj, a, false))
    throw Error(cat(what, ": expected a C-contiguous numpy array on the CPU"));
  Shape s(a.ndim());
  for (size_t i = 0; i < a.ndim(); i++) s[i] = (int64_t)a.shape(i);
  DType dt;
  try {
    dt = dtype_of(a.dtype());
  } catch (const Error& e) {
    throw Error(cat(what, ": ", e.what()));
  }
  PyObject* ref = obj.ptr();
  Py_INCREF(ref);
  std::shared_ptr<void> owner(ref, [](void* p) {
    if (!Py_IsInitialized()) return;  // interpreter gone: nothing to release
    nb::gil_scoped_acquire gil;
    Py_DECREF((PyObject*)p);
  });
  return Tensor::wrap(dt, std::move(s), a.data(), std::move(owner));
}

// A Tensor as a numpy array sharing its storage (the array owns a Tensor copy); None if undefined.
nb::object array_from_tensor(const Tensor& t) {
  if (!t.defined()) return nb::none();
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  nb::ndarray<nb::numpy> a(keep->raw(), shape.size(), shape.data(), owner, nullptr,
                           dlpack_of(t.dtype()));
  return a.cast();
}

// A dataset whose batches Python makes on demand: fetch(indices) -> {name: array}, called once
// per batch with the GIL held, as Transformers' DataLoader calls its collate_fn (the
// data_collator) per batch. The arrays are viewed, not copied.
class PyBatchDataset : public data::Dataset {
 public:
  PyBatchDataset(nb::object fetch, nb::object lengths, int64_t size, std::vector<std::string> keys,
                 std::string which)
      : fetch_(std::move(fetch)),
        lengths_(std::move(lengths)),
        size_(size),
        keys_(std::move(keys)),
        which_(std::move(which)) {}
  ~PyBatchDataset() override {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    fetch_.reset();
    lengths_.reset();
  }
  // lengths(length_column) -> [int] per row, computed in Python as Transformers does
  std::vector<int64_t> lengths(const std::string& length_column) const override {
    nb::gil_scoped_acquire gil;
    nb::object r = call_py(lengths_, nb::make_tuple(length_column), nb::dict());
    return nb::cast<std::vector<int64_t>>(r);
  }
  int64_t size() const override { return size_; }
  std::vector<std::string> keys() const override { return keys_; }
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override {
    nb::gil_scoped_acquire gil;
    nb::list idx;
    for (int64_t i : indices) idx.append(i);
    nb::object r = call_py(fetch_, nb::make_tuple(idx), nb::dict());
    if (!nb::isinstance<nb::dict>(r))
      throw Error(cat(which_, ": the data collator returned no dict of arrays"));
    std::map<std::string, Tensor> out;
    for (auto [k, v] : nb::borrow<nb::dict>(r)) {
      const std::string key = nb::cast<std::string>(nb::str(k));
      out[key] = tensor_from_array(v, cat(which_, " batch ['", key, "']"));
    }
    return out;
  }

 private:
  nb::object fetch_, lengths_;
  int64_t size_;
  std::vector<std::string> keys_;
  std::string which_;
};

// {name: array} (first dimension = sample) as a TensorDataset of zero-copy views, or
// ("per_batch", fetch, size, keys, lengths) as a PyBatchDataset.
std::shared_ptr<data::Dataset> dataset_from_dict(nb::handle d, const std::string& which) {
  if (d.is_none()) return nullptr;
  if (nb::isinstance<nb::tuple>(d)) {
    auto t = nb::borrow<nb::tuple>(d);
    if (t.size() != 5 || !nb::isinstance<nb::str>(t[0]) ||
        nb::cast<std::string>(t[0]) != "per_batch")
      throw Error(cat(which, ": expected a dict of numpy arrays"));
    return std::make_shared<PyBatchDataset>(nb::borrow(t[1]), nb::borrow(t[4]),
                                            nb::cast<int64_t>(t[2]),
                                            nb::cast<std::vector<std::string>>(t[3]), which);
  }
  if (!nb::isinstance<nb::dict>(d)) throw Error(cat(which, ": expected a dict of numpy arrays"));
  std::map<std::string, Tensor> tensors;
  for (auto [k, v] : nb::borrow<nb::dict>(d)) {
    std::string key = nb::cast<std::string>(nb::str(k));
    tensors[key] = tensor_from_array(v, cat(which, "['", key, "']"));
  }
  return std::make_shared<data::TensorDataset>(std::move(tensors), which);
}

nb::dict metrics_dict(const Metrics& m) {
  nb::dict d;
  for (auto& [k, v] : m) d[k.c_str()] = v;
  return d;
}

nb::dict log_entry_dict(const LogEntry& e) {
  nb::dict d = metrics_dict(e.values);
  d["epoch"] = e.epoch;
  d["step"] = e.step;
  return d;
}

// ---- TrainingArguments ----------------------------------------------------------------------

TrainingArguments args_from_items(const std::vector<std::pair<std::string, std::string>>& items) {
  TrainingArguments a;
  for (auto& [k, v] : items) a.set(k, v);
  return a;
}

// ---- callbacks -------------------------------------------------------------------------------

// One Python callback object: each Transformers event calls its method of that name, if it has
// one, with (args, state, control, **kwargs); a TrainerControl it returns replaces the control.
// The Python objects are borrowed: TrainerBox::refs owns them (and shows them to the garbage
// collector, so a cycle through a callback or compute_metrics is collected).
class PyCallback : public TrainerCallback {
 public:
  PyCallback(nb::handle cb, nb::handle py_args) : cb_(cb), py_args_(py_args) {}
  void on_init_end(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_init_end", s, c);
  }
  void on_train_begin(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_train_begin", s, c);
  }
  void on_train_end(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_train_end", s, c);
  }
  void on_epoch_begin(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_epoch_begin", s, c);
  }
  void on_epoch_end(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_epoch_end", s, c);
  }
  void on_step_begin(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_step_begin", s, c);
  }
  void on_substep_end(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_substep_end", s, c);
  }
  void on_step_end(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_step_end", s, c);
  }
  void on_save(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_save", s, c);
  }
  void on_prediction_step(const TrainingArguments&, TrainerState& s, TrainerControl& c) override {
    call("on_prediction_step", s, c);
  }
  void on_evaluate(const TrainingArguments&, TrainerState& s, TrainerControl& c,
                   const Metrics& m) override {
    call("on_evaluate", s, c, [&](nb::dict& kw) { kw["metrics"] = metrics_dict(m); });
  }
  void on_log(const TrainingArguments&, TrainerState& s, TrainerControl& c,
              const LogEntry& e) override {
    call("on_log", s, c, [&](nb::dict& kw) {
      nb::dict logs = metrics_dict(e.values);
      logs["epoch"] = e.epoch;  // as Transformers' Trainer.log passes it
      kw["logs"] = logs;
    });
  }

 private:
  template <class K = void (*)(nb::dict&)>
  void call(
      const char* event, TrainerState& s, TrainerControl& c, K add_kwargs = [](nb::dict&) {}) {
    nb::gil_scoped_acquire gil;
    nb::object fn = nb::getattr(cb_, event, nb::none());
    if (fn.is_none()) return;
    nb::dict kw;
    add_kwargs(kw);
    nb::object r = call_py(fn,
                           nb::make_tuple(py_args_, nb::cast(&s, nb::rv_policy::reference),
                                          nb::cast(&c, nb::rv_policy::reference)),
                           kw);
    if (nb::isinstance<TrainerControl>(r)) c = nb::cast<TrainerControl&>(r);
  }
  nb::handle cb_, py_args_;
};

// compute_metrics(predictions, label_ids, loss) -> {name: number}, called with the GIL held
// (fn borrowed, as PyCallback's objects).
ComputeMetrics py_compute_metrics(nb::handle fn) {
  return [fn](const EvalPrediction& p) -> Metrics {
    nb::gil_scoped_acquire gil;
    nb::object r = call_py(
        fn,
        nb::make_tuple(array_from_tensor(p.predictions), array_from_tensor(p.label_ids), p.loss),
        nb::dict());
    Metrics m;
    if (r.is_none()) return m;
    if (!nb::isinstance<nb::dict>(r)) throw Error("compute_metrics must return a dict of numbers");
    for (auto [k, v] : nb::borrow<nb::dict>(r)) {
      std::string key = nb::cast<std::string>(nb::str(k));
      PyObject* f = PyNumber_Float(v.ptr());
      if (!f) throw PyPending{};
      m[key] = PyFloat_AsDouble(f);
      Py_DECREF(f);
    }
    return m;
  };
}

// ---- GRPO ------------------------------------------------------------------------------------

// A GRPOTrainer reward function (python/onyx/grpo.py _reward_call): called with (prompt rows,
// completion texts, completion ids, global step), returns (one float or NaN per completion,
// {name: [logged values]}).
class PyReward : public train::RewardFunction {
 public:
  PyReward(std::string name, nb::handle fn) : name_(std::move(name)), fn_(fn) {}
  std::string name() const override { return name_; }
  std::vector<double> score(const train::RewardBatch& b) override {
    nb::gil_scoped_acquire gil;
    nb::list rows, texts, ids;
    for (int64_t r : b.prompt_rows) rows.append(r);
    for (auto& t : b.completions) texts.append(nb::str(t.data(), t.size()));
    for (auto& c : b.completion_ids) ids.append(nb::cast(c));
    nb::object r = call_py(fn_, nb::make_tuple(rows, texts, ids, b.global_step), nb::dict());
    auto [values, logged] =
        nb::cast<std::pair<std::vector<double>, std::map<std::string, std::vector<double>>>>(r);
    if (b.logged)
      for (auto& [k, v] : logged) (*b.logged)[k].insert((*b.logged)[k].end(), v.begin(), v.end());
    return values;
  }

 private:
  std::string name_;
  nb::handle fn_;  // owned by TrainerBox::refs
};

// GRPOTrainer's rollout_func (python/onyx/grpo.py _rollout_call): prompt rows -> [(prompt ids,
// completion ids)].
train::RolloutFunction py_rollout(nb::handle fn) {
  return [fn](const std::vector<int64_t>& rows) {
    nb::gil_scoped_acquire gil;
    nb::object r = call_py(fn, nb::make_tuple(nb::cast(rows)), nb::dict());
    std::vector<train::Rollout> out;
    for (auto& [p, c] :
         nb::cast<std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>>(r))
      out.push_back({p, c});
    return out;
  };
}

// ---- Trainer ---------------------------------------------------------------------------------

// The C++ Trainer and the Python objects its callbacks and compute_metrics call (owned here,
// borrowed by them; tp_traverse / tp_clear below let Python's garbage collector see and break
// cycles).
struct TrainerBox {
  std::unique_ptr<Trainer> t;
  std::vector<nb::object> refs;
};

int trainer_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  for (auto& r : nb::inst_ptr<TrainerBox>(self)->refs) Py_VISIT(r.ptr());
  return 0;
}

int trainer_clear(PyObject* self) {
  TrainerBox* b = nb::inst_ptr<TrainerBox>(self);
  b->t.reset();  // first: its callbacks borrow refs
  b->refs.clear();
  return 0;
}

PyType_Slot trainer_slots[] = {
    {Py_tp_traverse, (void*)trainer_traverse}, {Py_tp_clear, (void*)trainer_clear}, {0, nullptr}};

autodiff::LossSpec loss_spec(nb::handle loss) {
  autodiff::LossSpec spec;
  if (loss.is_none()) return spec;
  if (nb::isinstance<nb::str>(loss)) {
    spec.output = nb::cast<std::string>(loss);
    return spec;
  }
  if (!nb::isinstance<nb::dict>(loss))
    throw Error("loss: expected an output name or a dict {type, logits, labels, ignore_index}");
  std::string type = "cross_entropy";
  for (auto [k, v] : nb::borrow<nb::dict>(loss)) {
    std::string key = nb::cast<std::string>(nb::str(k));
    if (key == "type")
      type = nb::cast<std::string>(v);
    else if (key == "logits" || key == "predictions" || key == "output")
      spec.output = nb::cast<std::string>(v);
    else if (key == "labels")
      spec.labels = nb::cast<std::string>(v);
    else if (key == "ignore_index")
      spec.ignore_index = nb::cast<int64_t>(v);
    else
      throw Error(cat("loss: unknown key '", key, "' (type, logits, labels, ignore_index)"));
  }
  if (type == "cross_entropy")
    spec.kind = autodiff::LossSpec::Kind::CrossEntropy;
  else if (type == "mse")
    spec.kind = autodiff::LossSpec::Kind::MSE;
  else if (type == "output")
    spec.kind = autodiff::LossSpec::Kind::GraphOutput;
  else
    throw Error(cat("loss: 'type' must be cross_entropy, mse or output, got '", type, "'"));
  if (spec.kind != autodiff::LossSpec::Kind::GraphOutput)
    ONYX_CHECK(!spec.output.empty() && !spec.labels.empty(), "loss of type '", type,
               "' needs 'logits' and 'labels'");
  return spec;
}

void trainer_init(TrainerBox* self, const std::string& model,
                  const std::vector<std::pair<std::string, std::string>>& arg_items,
                  nb::object py_args, nb::object train_dataset, nb::object eval_dataset,
                  nb::object compute_metrics, std::vector<std::string> metric_names,
                  nb::list callbacks, nb::object loss, std::string predictions,
                  std::vector<std::string> frozen, std::string peft_dir,
                  const std::vector<std::pair<std::string, std::string>>& config_items,
                  const std::string& train_spec, const std::string& eval_spec,
                  const std::vector<std::pair<std::string, nb::object>>& grpo_rewards,
                  nb::object rollout_func) {
  TrainerBox box;  // moved into *self at the end (nanobind runs no destructor if __init__ throws)
  // Everything `onyx train` reads from a config, through the same function (model_from_config).
  config::RunConfig c;
  c.path = model;
  c.dir = ".";
  c.model = model;
  c.args = args_from_items(arg_items);
  c.loss = loss_spec(loss);
  c.predictions = predictions;
  c.frozen = frozen;
  c.metrics = metric_names;
  if (!peft_dir
           .empty()) {  // a PEFT model object: its adapters, as `peft_config: FOLDER` reads them
    c.lora = models::read_adapter_config(peft_dir);
    const std::filesystem::path w = std::filesystem::path(peft_dir) / "adapter_model.safetensors";
    c.lora_initial = std::filesystem::exists(w) ? w.string() : "";
  }
  // Keys a config would hold beyond TrainingArguments (DPOTrainer: trainer dpo, beta, ...), and
  // datasets given as a config's typed specs (DPOTrainer: type preference)
  for (auto& [k, v] : config_items) config::set_config_key(c, k, v, "the Trainer's configuration");
  auto dataset = [&](nb::object obj, const std::string& spec, const char* which, const char* name) {
    return spec.empty() ? dataset_from_dict(obj, name)
                        : config::dataset_from_spec({"", spec}, c, which);
  };
  auto train_ds = dataset(train_dataset, train_spec, "train_data", "train_dataset");
  auto eval_ds = dataset(eval_dataset, eval_spec, "eval_data", "eval_dataset");
  if (auto* rollouts = dynamic_cast<train::GrpoRollouts*>(train_ds.get())) {
    for (auto& [name, fn] : grpo_rewards) {
      box.refs.push_back(fn);
      rollouts->add_reward(std::make_shared<PyReward>(name, fn));
    }
    if (!rollout_func.is_none()) {
      box.refs.push_back(rollout_func);
      rollouts->set_rollout_function(py_rollout(rollout_func));
    }
  }
  ComputeMetrics cm;
  bool need_predictions = true;
  if (!compute_metrics.is_none()) {
    box.refs.push_back(compute_metrics);
    cm = py_compute_metrics(compute_metrics);
  } else if (!metric_names.empty()) {
    cm = metrics::by_names(metric_names);
    need_predictions = false;
    for (auto& m : metric_names)
      if (m != "perplexity") need_predictions = true;
  }
  box.refs.push_back(py_args);
  std::vector<std::shared_ptr<TrainerCallback>> cbs;
  for (nb::handle cb : callbacks) {
    if (nb::isinstance<nb::tuple>(cb)) {  // ("early_stopping", patience, threshold): the C++ one
      auto t = nb::borrow<nb::tuple>(cb);
      cbs.push_back(
          std::make_shared<EarlyStoppingCallback>(nb::cast<int>(t[1]), nb::cast<double>(t[2])));
    } else {
      box.refs.push_back(nb::borrow(cb));
      cbs.push_back(std::make_shared<PyCallback>(cb, py_args));
    }
  }
  without_gil([&] {
    Model m = config::model_from_config(c);
    box.t = std::make_unique<Trainer>(std::move(m), c.args, train_ds, eval_ds, cm, std::move(cbs));
    box.t->set_metrics_need_predictions(need_predictions);
    return 0;
  });
  new (self) TrainerBox(std::move(box));
}

Trainer& get(TrainerBox& b) {
  ONYX_CHECK(b.t, "the Trainer was not constructed");
  return *b.t;
}

// The module's functions: training arguments, custom ops, output, architectures, sampling.
void bind_functions(nb::module_& m) {
  m.def(
      "describe_args",
      [] {
        nb::list out;
        for (auto& a : TrainingArguments::describe()) {
          nb::dict d;
          d["name"] = a.name;
          d["type"] = a.type;
          d["choices"] = a.choices;
          d["default"] = a.default_value;
          d["help"] = a.help;
          out.append(d);
        }
        return out;
      },
      "Every TrainingArguments key, in order: name, type, choices, default (JSON text or None), "
      "help.");
  m.def("arg_keys", &TrainingArguments::keys);
  m.def(
      "check_args",
      [](const std::vector<std::pair<std::string, std::string>>& items) {
        TrainingArguments a = args_from_items(items);
        a.validate();
        return a.to_json();
      },
      "items"_a,
      "Sets each (key, text) as `onyx train` does, validates, returns the arguments as JSON.");
  m.def(
      "load_custom_ops",
      [](const std::string& path) {
        nb::list out;
        for (auto& op : load_custom_op_library(path)) {
          nb::dict d;
          d["domain"] = op.domain;
          d["name"] = op.name;
          d["library"] = op.library;
          d["gradient"] = op.gradient;
          out.append(d);
        }
        return out;
      },
      "path"_a,
      "Loads a custom-op library (include/onyx/custom_op.h), as --custom-ops does; returns the ops "
      "it "
      "registered ([] when the file was loaded before).");
  m.def(
      "set_output",
      [](nb::object write, bool is_tty, int columns) {
        if (write.is_none()) return train::Progress::set_output({});
        // Called from the thread running train() (the caller's, GIL released): take the GIL.
        // The Python package sets it around each call and clears it after (no Python object
        // outlives the call in this process-wide hook).
        train::Progress::set_output({[write](const std::string& s) {
                                       nb::gil_scoped_acquire gil;
                                       write(s);
                                     },
                                     is_tty, columns, /*dicts_without_tty=*/true});
      },
      "write"_a.none(), "is_tty"_a, "columns"_a,
      "Routes the progress bar and log lines to write(text) (None: back to stdout).");
  m.def("built_architectures", &models::built_architectures,
        "The Transformers classes onyx's C++ builders make (BertForSequenceClassification, ...): "
        "a module of one of them trains through its save_pretrained folder.");
  m.def("rebalanced_batches", &data::rebalanced_batches, "order"_a, "lengths"_a, "per_step"_a,
        "world"_a, "ga"_a, "drop_last"_a,
        "train_sampling_strategy='batch_rebalance': Transformers' BatchRebalanceSampler's "
        "micro-batches over `order`, in onyx's slot order (src/data/sampling.h).");
  m.def(
      "diffusion_sample",
      [](const std::string& model, const std::string& scheduler, int64_t steps, int64_t num_images,
         std::vector<int64_t> class_labels, int64_t batch_size, uint64_t seed,
         const std::string& scheduler_config, nb::object encoder_hidden_states,
         nb::object negative_encoder_hidden_states, double guidance_scale, double eta,
         std::vector<std::string> prompts, const std::string& negative_prompt, int64_t per_prompt,
         const std::string& text_encoder, const std::string& tokenizer, const std::string& vae,
         bool use_karras_sigmas) {
        diffusion::SampleOptions o;
        o.use_karras_sigmas = use_karras_sigmas;
        diffusion::PromptOptions p{std::move(prompts), negative_prompt, per_prompt, text_encoder,
                                   tokenizer};
        ONYX_CHECK(p.prompts.empty() || encoder_hidden_states.is_none(),
                   "prompt and encoder_hidden_states: give one");
        o.eta = eta;
        if (!encoder_hidden_states.is_none()) {
          o.encoder_hidden_states =
              tensor_from_array(encoder_hidden_states, "encoder_hidden_states");
          ONYX_CHECK(o.encoder_hidden_states->rank() == 3,
                     "encoder_hidden_states must be (N, sequence, dim), got ",
                     shape_str(o.encoder_hidden_states->shape()));
          num_images = o.encoder_hidden_states->dim(0);
        }
        if (!negative_encoder_hidden_states.is_none())
          o.negative_encoder_hidden_states =
              tensor_from_array(negative_encoder_hidden_states, "negative_encoder_hidden_states");
        o.guidance_scale = guidance_scale;
        o.scheduler = scheduler;
        o.num_inference_steps = steps;
        o.num_images = class_labels.empty() ? num_images : (int64_t)class_labels.size();
        o.class_labels = std::move(class_labels);
        o.batch_size = batch_size;
        o.seed = seed;
        Tensor images = without_gil([&] {
          if (!p.prompts.empty()) diffusion::encode_prompts(model, p, o);
          diffusion::decode_with_vae(model, vae, o);
          return diffusion::sample_images(diffusion::load_denoiser(model),
                                          diffusion::find_schedule_config(model, scheduler_config),
                                          o);
        });
        return array_from_tensor(images);
      },
      "model"_a, "scheduler"_a, "num_inference_steps"_a, "num_images"_a, "class_labels"_a,
      "batch_size"_a, "seed"_a, "scheduler_config"_a, "encoder_hidden_states"_a.none(),
      "negative_encoder_hidden_states"_a.none(), "guidance_scale"_a, "eta"_a, "prompts"_a,
      "negative_prompt"_a, "per_prompt"_a, "text_encoder"_a, "tokenizer"_a, "vae"_a,
      "use_karras_sigmas"_a = false,
      "Images (N,C,H,W) float32 in [0, 1] from a diffusers UNet2DModel / UNet2DConditionModel / "
      "DiTTransformer2DModel folder, as `onyx sample` (src/diffusion/sampler.h).");
  m.def("set_num_threads", &runtime::set_num_threads, "n"_a,
        "Threads of onyx's kernels, oneDNN and OpenBLAS (the CLI's --threads).");
}

void bind_trainer_control(nb::module_& m) {
  nb::class_<TrainerControl>(m, "TrainerControl")
      .def(nb::init<>())
      .def_rw("should_training_stop", &TrainerControl::should_training_stop)
      .def_rw("should_epoch_stop", &TrainerControl::should_epoch_stop)
      .def_rw("should_save", &TrainerControl::should_save)
      .def_rw("should_evaluate", &TrainerControl::should_evaluate)
      .def_rw("should_log", &TrainerControl::should_log)
      .def("__repr__", [](const TrainerControl& c) {
        return cat(
            "TrainerControl(should_training_stop=", c.should_training_stop ? "True" : "False",
            ", should_epoch_stop=", c.should_epoch_stop ? "True" : "False",
            ", should_save=", c.should_save ? "True" : "False",
            ", should_evaluate=", c.should_evaluate ? "True" : "False",
            ", should_log=", c.should_log ? "True" : "False", ")");
      });
}

void bind_trainer_state(nb::module_& m) {
  nb::class_<TrainerState>(m, "TrainerState")
      .def_rw("epoch", &TrainerState::epoch)
      .def_rw("global_step", &TrainerState::global_step)
      .def_rw("max_steps", &TrainerState::max_steps)
      .def_rw("num_train_epochs", &TrainerState::num_train_epochs)
      .def_rw("logging_steps", &TrainerState::logging_steps)
      .def_rw("eval_steps", &TrainerState::eval_steps)
      .def_rw("save_steps", &TrainerState::save_steps)
      .def_rw("train_batch_size", &TrainerState::train_batch_size)
      .def_rw("best_metric", &TrainerState::best_metric)
      .def_rw("best_model_checkpoint", &TrainerState::best_model_checkpoint)
      .def_rw("best_global_step", &TrainerState::best_global_step)
      .def_prop_ro(
          "log_history",
          [](const TrainerState& s) {
            nb::list l;
            for (auto& e : s.log_history) l.append(log_entry_dict(e));
            return l;
          },
          "A list of dicts, one per log, as Transformers' TrainerState.log_history (a copy).")
      .def_prop_ro("is_local_process_zero",
                   [](const TrainerState& s) { return s.is_local_process_zero; })
      .def_prop_ro("is_world_process_zero",
                   [](const TrainerState& s) { return s.is_world_process_zero; })
      .def("to_json_string", &TrainerState::to_json);
}

void bind_trainer(nb::module_& m) {
  nb::class_<TrainerBox>(m, "Trainer", nb::type_slots(trainer_slots))
      .def("__init__", &trainer_init, "model"_a, "arg_items"_a, "py_args"_a,
           "train_dataset"_a.none(), "eval_dataset"_a.none(), "compute_metrics"_a.none(),
           "metric_names"_a, "callbacks"_a, "loss"_a.none(), "predictions"_a, "frozen"_a,
           "peft_dir"_a = "", "config_items"_a = std::vector<std::pair<std::string, std::string>>{},
           "train_spec"_a = "", "eval_spec"_a = "",
           "grpo_rewards"_a = std::vector<std::pair<std::string, nb::object>>{},
           "rollout_func"_a.none() = nb::none())
      .def("train",
           [](TrainerBox& b) {
             TrainOutput o = without_gil([&] { return get(b).train(); });
             return nb::make_tuple(o.global_step, o.training_loss, metrics_dict(o.metrics));
           })
      .def(
          "evaluate",
          [](TrainerBox& b, nb::object ds, const std::string& prefix) {
            auto d = dataset_from_dict(ds, "eval_dataset");
            Metrics m = without_gil(
                [&] { return d ? get(b).evaluate(*d, prefix) : get(b).evaluate(prefix); });
            return metrics_dict(m);
          },
          "eval_dataset"_a.none(), "metric_key_prefix"_a = "eval")
      .def(
          "predict",
          [](TrainerBox& b, nb::object ds) {
            auto d = dataset_from_dict(ds, "test_dataset");
            ONYX_CHECK(d, "predict: test_dataset is None");
            PredictionOutput p = without_gil([&] { return get(b).predict(*d); });
            return nb::make_tuple(array_from_tensor(p.predictions), array_from_tensor(p.label_ids),
                                  metrics_dict(p.metrics));
          },
          "test_dataset"_a)
      .def(
          "set_generation_kwargs",
          [](TrainerBox& b, std::optional<int64_t> max_length,
             std::optional<int64_t> max_new_tokens, std::optional<int64_t> num_beams) {
            get(b).set_generation_kwargs(max_length, max_new_tokens, num_beams);
          },
          "max_length"_a.none(), "max_new_tokens"_a.none(), "num_beams"_a.none())
      .def(
          "save_model",
          [](TrainerBox& b, const std::string& dir) {
            without_gil([&] {
              get(b).save_model(dir);
              return 0;
            });
          },
          "output_dir"_a)
      .def(
          "weights",
          [](TrainerBox& b) {
            nb::dict d;
            for (auto& [name, t] : get(b).weights()) d[name.c_str()] = array_from_tensor(t);
            return d;
          },
          "{name: numpy view} of the current weights, as save_model writes them.")
      .def_prop_ro(
          "state", [](TrainerBox& b) -> const TrainerState& { return get(b).state(); },
          nb::rv_policy::reference_internal)
      .def(
          "release",
          [](TrainerBox& b) {
            without_gil([&] {
              b.t.reset();
              return 0;
            });
          },
          "Frees the C++ Trainer (its arenas, parameters, datasets).");
}

}  // namespace
}  // namespace onyx::python

NB_MODULE(_onyx, m) {
  using namespace onyx;
  using namespace onyx::python;
  m.doc() = "onyx's C++ core (the Python API is the package onyx)";
  nb::exception<Error>(m, "OnyxError", PyExc_ValueError);
  bind_functions(m);
  bind_trainer_control(m);
  bind_trainer_state(m);
  bind_trainer(m);
}
