"""onyx.trainer — Transformers' Trainer over onyx's C++ Trainer: models given as Transformers or
PEFT modules, torch modules, ONNX files or Hugging Face folders; output routed through
sys.stdout and logging; Ctrl-C between steps."""
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import threading

from . import _onyx
from .data import _dataset, _for_cpp, _PerBatch
from .hyperparameter_search import run_optuna
from .trainer_callback import TrainerCallback, _SaveAsTransformers
from .trainer_utils import EvalPrediction, PredictionOutput, TrainOutput, _last_checkpoint
from .training_args import TrainingArguments, _ArgsBase, _save_training_args

_logger = logging.getLogger("onyx")


@contextlib.contextmanager
def _in_python():
    """While C++ runs: its progress bar and log lines go to the current sys.stdout (Jupyter,
    contextlib.redirect_stdout) — the logs as Transformers prints them, dicts of 4-digit strings,
    also without a terminal — each log also to logging.getLogger("onyx") at DEBUG, and Ctrl-C
    (in the main thread) stops training after the current step, then raises KeyboardInterrupt."""
    out = sys.stdout
    tty = bool(getattr(out, "isatty", lambda: False)())

    def write(text):
        sys.stdout.write(text)
        sys.stdout.flush()

    _onyx.set_output(write, tty, shutil.get_terminal_size().columns)
    interrupted = []
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGINT, lambda *a: interrupted.append(True))
    try:
        yield interrupted
    finally:
        _onyx.set_output(None, False, 0)
        if old is not None:
            signal.signal(signal.SIGINT, old)
    if interrupted:
        raise KeyboardInterrupt("training stopped after the current step (Ctrl-C)")


class _PythonWorld(TrainerCallback):
    """Logs to the `logging` module; stops at the end of a step when Ctrl-C was pressed (Python
    runs its signal handlers when this callback's code runs, between steps)."""

    def __init__(self):
        self.interrupted = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        _logger.debug(json.dumps(dict(logs or {})))  # (at INFO it doubled the printed logs)

    def on_step_end(self, args, state, control, **kwargs):
        if self.interrupted:
            control.should_training_stop = True


def _with_peft(model, peft_config):
    """TRL's SFTTrainer(peft_config=...) on a torch model: peft.get_peft_model wraps it (the
    adapters initialized as PEFT initializes them) and the PEFT model trains in place."""
    if _is_peft_model(model):
        raise ValueError("peft_config with a model that is already a PEFT model")
    import peft
    return peft.get_peft_model(model, peft_config)


def _adapter_config_folder(peft_config, tmp):
    """peft_config (a peft.LoraConfig or its dict) as the adapter_config.json of a folder onyx
    trains as `peft_config: FOLDER` (no weights: initialized as PEFT initializes them)."""
    d = peft_config.to_dict() if hasattr(peft_config, "to_dict") else dict(peft_config)
    d = {k: (sorted(v) if isinstance(v, (set, frozenset)) else getattr(v, "value", v))
         for k, v in d.items()}
    folder = os.path.join(tmp, "adapter-config")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(d, f, default=str)
    return folder


def _model_init_kwargs_items(model_init_kwargs, model):
    """TRL's `model_init_kwargs` (DPOConfig, GRPOConfig) as the run-config key onyx reads when
    the model is given by its path: dtype / torch_dtype (torch.bfloat16 or its name) and
    quantization_config (a transformers.BitsAndBytesConfig or its dict); the C++ side checks the
    keys and values. With a model object, as TRL does, they are ignored with a warning."""
    if not model_init_kwargs:
        return []
    if not isinstance(model, (str, os.PathLike)):
        _logger.warning("You passed `model_init_kwargs` to the config, but your model is already "
                        "instantiated. The `model_init_kwargs` will be ignored.")
        return []
    out = {}
    for k, v in dict(model_init_kwargs).items():
        if k == "quantization_config" and hasattr(v, "to_dict"):
            v = v.to_dict()
        elif k in ("dtype", "torch_dtype") and not isinstance(v, str):
            v = str(v).replace("torch.", "")
        out[k] = v
    return [("model_init_kwargs", json.dumps(out, default=str))]


def _is_peft_model(m):
    return any(c.__module__.startswith("peft") for c in type(m).__mro__) and hasattr(m, "peft_config")


def _is_torch_module(m):
    return any(c.__module__.startswith("torch.nn") and c.__name__ == "Module" for c in type(m).__mro__)


class Trainer:
    """Transformers' Trainer over onyx's C++ Trainer.

    Trainer(model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
            processing_class=None, model_init=None, compute_loss_func=None, compute_metrics=None,
            callbacks=None, *, loss=None, predictions=None, frozen=None)

    Positional order and names are Transformers'. model: a Transformers PreTrainedModel of an
    architecture onyx builds (BERT, RoBERTa, DistilBERT, GPT-2, ViT: written with save_pretrained
    into a temporary folder and trained from there; after train() its parameters hold the trained
    values, tied weights stay tied, parameters with requires_grad=False stay frozen); an .onnx path
    (trains its scalar `loss` output, or `loss`: an output name or {type: cross_entropy | mse,
    logits, labels}); or a Hugging Face folder. model_init: a function returning such a model
    (called once here). args: onyx's TrainingArguments, a transformers.TrainingArguments or its
    to_dict(). Datasets: a dict of numpy arrays or torch tensors (shared, not copied), a
    datasets.Dataset, or a map-style torch Dataset; data_collator (e.g. DataCollatorWithPadding)
    is applied to every sample at once, so batches are padded to the dataset's longest sample.
    compute_metrics: f(EvalPrediction) -> dict, or a list of onyx's built-in metric names
    (accuracy, f1, mse, perplexity), as a config's `metrics:`.
    """

    # a subclass's run-config keys beyond TrainingArguments and typed data specs (DPOTrainer)
    _config_items = ()
    _data_specs = {}
    _grpo_hooks = ([], None)  # GRPOTrainer's (reward functions by name, rollout function)

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, model_init=None, compute_loss_func=None,
                 compute_metrics=None, callbacks=None, optimizers=(None, None),
                 preprocess_logits_for_metrics=None, *, loss=None, predictions=None, frozen=None,
                 peft_config=None):
        if args is None:
            args = TrainingArguments(output_dir="trainer_output")  # Transformers' default folder
        elif not isinstance(args, _ArgsBase):
            args = TrainingArguments.from_transformers(args)
        for name, value in (("compute_loss_func", compute_loss_func),
                            ("preprocess_logits_for_metrics", preprocess_logits_for_metrics)):
            if value is not None:
                raise NotImplementedError(f"{name}: onyx trains the loss its model computes")
        if optimizers is not None and any(o is not None for o in optimizers):
            raise NotImplementedError("optimizers=(optimizer, scheduler): onyx's optimizer runs on "
                                      "its flat buffers; choose it with args.optim / lr_scheduler_type")
        if model is None:
            if model_init is None:
                raise ValueError("Trainer: give model or model_init")
            import inspect
            takes_trial = len(inspect.signature(model_init).parameters) >= 1
            model = model_init(None) if takes_trial else model_init()  # as Transformers calls it
        if peft_config is not None and _is_torch_module(model):  # TRL's SFTTrainer(peft_config=)
            model = _with_peft(model, peft_config)
        if (_is_torch_module(model) and getattr(model, "is_gradient_checkpointing", False)
                and not args.gradient_checkpointing):
            # a model that checkpoints on its own (gradient_checkpointing_enable(), as PEFT's
            # prepare_model_for_kbit_training calls it) trains so under transformers.Trainer too
            args = dataclasses.replace(args, gradient_checkpointing=True)
        self.model_init = model_init
        self.args = args
        self.data_collator = data_collator
        self.processing_class = processing_class
        self.compute_metrics = compute_metrics
        self._module, self._tmp, self._peft_dir = None, None, None
        self._frozen = list(frozen or [])
        self._loss, self._predictions = loss, predictions
        if not (_is_torch_module(model) or isinstance(model, (str, os.PathLike))):
            raise TypeError("model: expected a torch.nn.Module (a Transformers model or any module "
                            "whose forward(**batch) returns the loss), the path of an .onnx file or "
                            f"of a Hugging Face folder, got {type(model).__name__}")
        self._module = model if _is_torch_module(model) else None
        # rows are collated per batch, as Transformers' DataLoaders call the collator
        self.train_dataset = self._rows(train_dataset, "train_dataset",
                                        args.per_device_train_batch_size)
        self.eval_dataset = self._rows(eval_dataset, "eval_dataset", args.per_device_eval_batch_size)
        if self._module is not None:
            self.model = self._from_module(model)
        else:
            self.model = os.fspath(model)
            if peft_config is not None:  # a model folder: the adapters' configuration, PEFT's init
                import tempfile
                self._tmp = tempfile.TemporaryDirectory(prefix="onyx-model-")
                self._peft_dir = _adapter_config_folder(peft_config, self._tmp.name)
        self.callbacks = []
        for cb in callbacks or []:
            self.callbacks.append(cb() if isinstance(cb, type) else cb)
        self.callbacks.append(_SaveAsTransformers(processing_class))  # into every checkpoint
        self._t = self._build(args)

    # -- models given as torch modules
    # the Transformers classes the C++ builders make (models::built_architectures: one list)
    _BUILT = frozenset(_onyx.built_architectures())

    def _from_module(self, module):
        """A Transformers model of an architecture onyx builds: its save_pretrained folder. Any
        other module: exported with torch.onnx.export (TorchScript exporter, opset 17, training
        mode, no constant folding, dynamic batch axis) on the first training samples, its output
        `loss` trained; parameters keep their state_dict names, buffers are frozen."""
        import tempfile
        self._tmp = tempfile.TemporaryDirectory(prefix="onyx-model-")
        if _is_peft_model(module):
            return self._from_peft_model(module)
        self._frozen += [n for n, p in module.named_parameters() if not p.requires_grad]
        if type(module).__name__ in self._BUILT and hasattr(module, "save_pretrained"):
            module.save_pretrained(self._tmp.name, safe_serialization=True)
            return self._tmp.name
        return self._export(module, os.path.join(self._tmp.name, "model.onnx"))

    def _from_peft_model(self, module):
        """A PEFT model (get_peft_model(model, LoraConfig(...))) of an architecture onyx builds:
        the base model's own weights (the LoRA layers' base_layer ones, without the adapters) as a
        Hugging Face folder, and the adapters as PEFT saves them (adapter_config.json,
        adapter_model.safetensors), which onyx trains as `peft_config: FOLDER` does; the base
        stays frozen. train() writes the trained adapters back into the module's LoRA parameters,
        so module.save_pretrained() afterwards writes what PEFT loads."""
        import torch
        from safetensors.torch import save_file
        base = module.get_base_model()
        if type(base).__name__ not in self._BUILT:
            raise NotImplementedError(f"a PEFT model over {type(base).__name__}: onyx trains "
                                      "adapters on the architectures it builds: "
                                      + ", ".join(sorted(self._BUILT)))
        if len(module.peft_config) != 1:
            raise NotImplementedError("a PEFT model with several adapters: onyx trains one")
        folder = os.path.join(self._tmp.name, "base")
        os.makedirs(folder)
        config = base.config.to_dict()
        config["architectures"] = [type(base).__name__]  # as save_pretrained writes it
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        if getattr(base, "is_loaded_in_8bit", False):
            raise NotImplementedError("a PEFT model over an 8-bit (LLM.int8) base: onyx trains "
                                      "4-bit bases (BitsAndBytesConfig(load_in_4bit=True))")
        weights = {}
        for name, t in base.state_dict().items():
            if ".lora_" in name:
                continue
            # a 4-bit base (BitsAndBytesConfig): its codes, absmax and quant_state as bitsandbytes
            # holds them (uint8, kept), read by onyx as a folder Transformers saved 4-bit
            t = t.detach().to(torch.float32) if t.is_floating_point() else t.detach()
            weights[name.replace(".base_layer.", ".")] = t.contiguous().clone()
        save_file(weights, os.path.join(folder, "model.safetensors"))
        self._peft_dir = os.path.join(self._tmp.name, "adapter")
        module.save_pretrained(self._peft_dir)
        return folder

    def _export(self, module, path):
        import torch
        if not self.train_dataset:
            raise ValueError("model: a torch.nn.Module is exported on samples of train_dataset; "
                             "give one")
        names = list(self.train_dataset)
        n = min(2, len(next(iter(self.train_dataset.values()))))
        sample = tuple(torch.from_numpy(self.train_dataset[k][:n].copy()) for k in names)

        class _Call(torch.nn.Module):  # forward(**batch) -> (loss, first other tensor output)
            def __init__(self, m):
                super().__init__()
                object.__setattr__(self, "m", m)  # not a submodule: the names stay m's own
                for name, child in m.named_children():
                    self.add_module(name, child)
                for name, p in m.named_parameters(recurse=False):
                    self.register_parameter(name, p)
                for name, b in m.named_buffers(recurse=False):
                    self.register_buffer(name, b)

            def forward(self, *args):
                out = self.m(**dict(zip(names, args)))
                if isinstance(out, dict) or hasattr(out, "keys"):
                    items = [(k, out[k]) for k in out.keys()]
                elif isinstance(out, (tuple, list)):
                    items = [("loss" if i == 0 else f"output_{i}", v) for i, v in enumerate(out)]
                else:
                    items = [("loss", out)]
                loss = dict(items).get("loss")
                if loss is None:
                    raise ValueError("model: forward(**batch) returned no loss (give labels in the "
                                     "dataset, or return a dict with 'loss')")
                rest = [v for k, v in items if k != "loss" and isinstance(v, torch.Tensor)]
                return (loss,) + tuple(rest[:1])

        wrapped = _Call(module)
        was_training = module.training
        module.train()
        with torch.no_grad():
            outs = wrapped(*sample)
        out_names = ["loss", "logits"][:len(outs)]
        import warnings as _w
        with _w.catch_warnings():
            _w.simplefilter("ignore")
            torch.onnx.export(wrapped, sample, path, dynamo=False, input_names=names,
                              output_names=out_names, opset_version=17, do_constant_folding=False,
                              dynamic_axes={k: {0: "batch"} for k in names},
                              training=torch.onnx.TrainingMode.TRAINING)
        module.train(was_training)
        self._frozen += [n for n, _ in module.named_buffers()]
        if self._predictions is None and len(out_names) > 1:
            self._predictions = "logits"
        return path

    def _rows(self, ds, which, batch_size):
        """`ds` as the C++ Trainer takes it (_dataset): with this Trainer's data_collator and
        model inputs; under group_by_length / batch_rebalance, rows that know their lengths as
        Transformers infers them (length_column_name, else processing_class.model_input_names[0])."""
        by_length = getattr(self.args, "train_sampling_strategy", "") in ("group_by_length",
                                                                          "batch_rebalance")
        out = _dataset(ds, which, self.data_collator, self._input_names(), per_batch=batch_size,
                       length_column=self.args.length_column_name if by_length else None)
        names = getattr(self.processing_class, "model_input_names", None)
        if isinstance(out, _PerBatch) and names:
            out.input_name = names[0]
        return out

    def _input_names(self):
        """What the model's forward takes (Transformers' remove_unused_columns), for modules."""
        if self._module is None or not getattr(self.args, "remove_unused_columns", True):
            return None
        import inspect
        names = set(inspect.signature(self._module.forward).parameters)
        return names | {"labels"}

    def _sync_module(self):
        """Copies the trained weights into the torch module (tied parameters share storage, so
        they stay tied); buffers are left as they are."""
        if self._module is None:
            return
        import torch
        if self._peft_dir:  # the trained adapters, as PEFT saves them, into the LoRA parameters
            import peft
            from safetensors.torch import load_file
            out = os.path.join(self._tmp.name, "trained-adapter")
            self._t.save_model(out)
            state = load_file(os.path.join(out, "adapter_model.safetensors"))
            result = peft.set_peft_model_state_dict(self._module, state)
            if getattr(result, "unexpected_keys", None):
                raise _onyx.OnyxError("the trained adapters do not match the PEFT model: "
                                + ", ".join(result.unexpected_keys[:8]))
            return
        trained = self._t.weights()  # numpy views of the C++ storage, copied into the module below
        params = dict(self._module.named_parameters(remove_duplicate=False))
        missing = [n for n in params if n not in trained]
        untied = [n for n in missing if not any(p is params[n] for k, p in params.items()
                                                if k in trained)]
        untied = [n for n in untied if params[n].requires_grad]
        if untied:
            raise _onyx.OnyxError("the trained weights lack parameters of the module (renamed by the "
                            "ONNX export?): " + ", ".join(untied[:8]))
        with torch.no_grad():
            for n, p in params.items():
                if n in trained:
                    p.copy_(torch.from_numpy(trained[n]).to(p.dtype))

    def _build(self, args):
        names, fn = [], None
        cm = self.compute_metrics
        if isinstance(cm, (list, tuple)):
            names = [str(n) for n in cm]
        elif cm is not None:
            def fn(predictions, label_ids, loss, _cm=cm):
                return _cm(EvalPrediction(predictions, label_ids))
        self._world = _PythonWorld()
        cbs = [self._world]
        for cb in self.callbacks:
            if type(cb).__name__ == "EarlyStoppingCallback" and hasattr(cb, "early_stopping_patience"):
                # onyx's or Transformers' own: the C++ implementation
                cbs.append(("early_stopping", int(cb.early_stopping_patience),
                            float(cb.early_stopping_threshold or 0.0)))
            else:
                cbs.append(cb)
        return _onyx.Trainer(self.model, args._items(), args, _for_cpp(self.train_dataset),
                             _for_cpp(self.eval_dataset),
                             fn, names, cbs, self._loss, self._predictions or "", self._frozen,
                             self._peft_dir or "", list(self._config_items),
                             self._data_specs.get("train_data", ""),
                             self._data_specs.get("eval_data", ""), *self._grpo_hooks)

    def add_callback(self, callback):
        """Adds a callback (an instance or a class); takes effect from the next train()."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)
        self._t = self._build(self.args)

    def train(self, resume_from_checkpoint=None):
        """Trains; returns TrainOutput(global_step, training_loss, metrics). resume_from_checkpoint:
        a checkpoint-N folder (or True: the newest in output_dir) to continue from, bit for bit.
        A torch model given to the Trainer holds the trained weights afterwards."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = _last_checkpoint(self.args.output_dir)
        if resume_from_checkpoint:
            self.args = dataclasses.replace(self.args, resume_from_checkpoint=os.fspath(resume_from_checkpoint))
            self._t = self._build(self.args)
        with _in_python() as interrupted:
            self._world.interrupted = interrupted
            try:
                step, loss, metrics = self._t.train()
            finally:
                self._world.interrupted = None
            self._sync_module()  # also when Ctrl-C stopped it: the weights of the last step
        return TrainOutput(step, loss, metrics)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Evaluates on eval_dataset (else the Trainer's); returns {eval_loss, eval_<metric>,
        eval_runtime, ...}, logged and passed to on_evaluate as in Transformers."""
        ds = self._rows(eval_dataset, "eval_dataset", self.args.per_device_eval_batch_size)
        with _in_python():
            return self._t.evaluate(_for_cpp(ds), metric_key_prefix)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test"):
        """PredictionOutput(predictions, label_ids, metrics) on a dataset (any kind train takes)."""
        ds = self._rows(test_dataset, "test_dataset", self.args.per_device_eval_batch_size)
        with _in_python():
            p, l, m = self._t.predict(_for_cpp(ds))
        return PredictionOutput(p, l, m)

    def save_model(self, output_dir=None):
        """model.safetensors (and config.json for Hugging Face models: a folder from_pretrained
        reads) into output_dir, with the processing_class (tokenizer) and training_args.bin saved
        beside it as Transformers saves them."""
        folder = os.fspath(output_dir or self.args.output_dir)
        self._t.save_model(folder)
        if not self.state.is_world_process_zero:  # under mpirun: rank 0 writes, as Transformers
            return
        if hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(folder)
        _save_training_args(self.args, folder)

    @property
    def state(self):
        return self._t.state

    # -- hyperparameter search (Transformers' Trainer.hyperparameter_search, Optuna backend)

    def hyperparameter_search(self, hp_space=None, compute_objective=None, n_trials=20,
                              direction="minimize", backend=None, hp_name=None, **kwargs):
        """Runs n_trials trainings with hyperparameters from hp_space(trial) (default:
        Transformers' default_hp_space_optuna) and returns BestRun(run_id, objective,
        hyperparameters, run_summary=the optuna Study). Each trial trains from model_init's
        weights (the model is written once; a model_init taking the trial is called per trial)
        into output_dir/run-<n>; its objective is compute_objective(metrics) (default: eval_loss,
        or the sum of the other metrics) at each evaluation, reported to Optuna (trial.report),
        which may prune it there; without evaluations during training, of a final evaluate().
        kwargs go to optuna.create_study (sampler, pruner, ...) and to study.optimize (timeout,
        n_jobs, gc_after_trial, callbacks, catch), as in Transformers."""
        return run_optuna(self, hp_space, compute_objective, n_trials, direction, backend, hp_name,
                          kwargs)
