"""onyx — a CPU training runtime for ONNX models and Hugging Face folders, with Transformers' Trainer API.

    import numpy as np, onyx
    args = onyx.TrainingArguments(output_dir="out", learning_rate=1e-3, max_steps=100)
    trainer = onyx.Trainer("model.onnx", args, train_dataset={"x": X, "labels": y})
    out = trainer.train()            # TrainOutput(global_step, training_loss, metrics)
    trainer.save_model("out")        # model.safetensors

The classes keep Transformers' names and behaviour: TrainingArguments (a dataclass whose fields
are exactly the keys of onyx's C++ TrainingArguments, read from the extension, so they cannot
drift), Trainer (train / evaluate / predict / save_model / state), TrainerCallback with
Transformers' events, EarlyStoppingCallback, EvalPrediction, TrainOutput; ORTTrainer and
ORTTrainingArguments are aliases for code written for Optimum's ORTTrainer.

Models: a path to an .onnx file (its scalar `loss` output is trained; or pass `loss=`) or a Hugging
Face folder (config.json + model.safetensors, e.g. from save_pretrained). Datasets: dicts of numpy
arrays keyed by graph input names, first dimension = sample; they are not copied (the C++ dataset
views the arrays' memory, so do not modify them while a Trainer holds them).
"""
import dataclasses
import json
import os
import typing
import warnings
from collections import namedtuple

from . import _onyx

__all__ = [
    "TrainingArguments", "Trainer", "TrainerCallback", "TrainerControl", "TrainerState",
    "EarlyStoppingCallback", "EvalPrediction", "TrainOutput", "PredictionOutput",
    "ORTTrainer", "ORTTrainingArguments", "OnyxError", "set_num_threads",
]
__version__ = "0.1.0"

OnyxError = _onyx.OnyxError  # a ValueError: every error of the C++ core, with its message
TrainerControl = _onyx.TrainerControl
TrainerState = _onyx.TrainerState
set_num_threads = _onyx.set_num_threads

TrainOutput = namedtuple("TrainOutput", ["global_step", "training_loss", "metrics"])
PredictionOutput = namedtuple("PredictionOutput", ["predictions", "label_ids", "metrics"])


# ----------------------------------------------------------------------------------------------
# TrainingArguments: built from the C++ key table (TrainingArguments::describe())

_TYPES = {
    "float": float, "int": int, "bool": bool, "str": str, "int | float": float,
    "int | None": typing.Optional[int], "str | None": typing.Optional[str],
    "bool | None": typing.Optional[bool], "int | float | None": typing.Optional[float],
}
_ARGS = _onyx.describe_args()


def _default(info):
    return None if info["default"] == "None" else json.loads(info["default"])


def _text(value):
    """A Python value as the text the C++ parser reads (as a config or `--key value` writes it)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):  # report_to=["tensorboard"], as Transformers accepts
        if len(value) == 0:
            return "none"
        if len(value) == 1:
            return _text(value[0])
        raise ValueError(f"a list of {len(value)} values is not supported: {value!r}")
    return str(value)


# Transformers keys onyx does not have whose non-default values change what training computes:
# setting one is an error rather than a warning (the run would silently differ). Every other key
# onyx does not have (hub, logging integrations, dataloader workers, devices, ...) is ignored with
# one warning listing them.
_SEMANTIC_KEYS = {
    "fp16": lambda v: not v, "bf16": lambda v: not v,
    "fp16_full_eval": lambda v: not v, "bf16_full_eval": lambda v: not v,
    "lr_scheduler_kwargs": lambda v: not v, "optim_args": lambda v: not v,
    "optim_target_modules": lambda v: v is None,
    "eval_on_start": lambda v: not v, "eval_delay": lambda v: not v,
    "batch_eval_metrics": lambda v: not v, "prediction_loss_only": lambda v: not v,
    "eval_do_concat_batches": lambda v: v in (True, None),
    "label_names": lambda v: v is None, "include_for_metrics": lambda v: not v,
    "include_num_input_tokens_seen": lambda v: v in (False, None, "no"),
    "neftune_noise_alpha": lambda v: v is None, "ignore_data_skip": lambda v: not v,
    "use_liger_kernel": lambda v: not v, "save_safetensors": lambda v: v in (True, None),
    "restore_callback_states_from_checkpoint": lambda v: not v,
    "eval_accumulation_steps": lambda v: True,  # memory only: same numbers
}


class _ArgsBase:
    def __post_init__(self):
        items = [(f.name, _text(getattr(self, f.name))) for f in dataclasses.fields(self)]
        try:
            canonical = json.loads(_onyx.check_args(items))
        except OnyxError as e:
            raise ValueError(str(e)) from None
        for k, v in canonical.items():  # typed values: learning_rate="1e-4" becomes 0.0001
            if k in ("report_to",) and isinstance(getattr(self, k), (list, tuple)):
                continue
            object.__setattr__(self, k, v)

    def __setattr__(self, key, value):
        if key not in self.__dataclass_fields__:
            raise AttributeError(f"{type(self).__name__} has no argument '{key}'")
        object.__setattr__(self, key, value)

    def _items(self):
        return [(f.name, _text(getattr(self, f.name))) for f in dataclasses.fields(self)]

    def to_dict(self):
        """Every argument, as Transformers' TrainingArguments.to_dict()."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json_string(self):
        return json.dumps(self.to_dict(), indent=2)

    def to_sanitized_dict(self):
        return self.to_dict()

    @classmethod
    def from_transformers(cls, targs, **overrides):
        """From a transformers.TrainingArguments instance or its to_dict().

        Keys onyx has are taken (warmup_steps < 1 is Transformers 5's ratio: warmup_ratio);
        keys onyx does not have are ignored with a warning listing them, except those whose
        non-default value changes the computation (fp16, bf16, lr_scheduler_kwargs, optim_args,
        eval_on_start, eval_delay, label_names, ...: see _SEMANTIC_KEYS), which raise ValueError.
        """
        d = dict(targs) if isinstance(targs, dict) else targs.to_dict()
        ours = {f.name for f in dataclasses.fields(cls)}
        kw, ignored, refused = {}, [], []
        for k, v in d.items():
            if k in ours:
                kw[k] = v
            elif k in _SEMANTIC_KEYS and not _SEMANTIC_KEYS[k](v):
                refused.append(f"{k}={v!r}")
            elif k == "evaluation_strategy":
                kw["eval_strategy"] = v
            else:
                ignored.append(k)
        if refused:
            raise ValueError("transformers.TrainingArguments sets what onyx does not implement "
                             "(the run would differ): " + ", ".join(refused))
        ws = kw.get("warmup_steps")
        if isinstance(ws, float) and 0 < ws < 1:
            kw["warmup_steps"], kw["warmup_ratio"] = 0, ws
        elif isinstance(ws, float) and ws == int(ws):
            kw["warmup_steps"] = int(ws)
        for k in ("eval_strategy", "logging_strategy", "save_strategy", "lr_scheduler_type", "optim"):
            if k in kw and hasattr(kw[k], "value"):  # enums (to_dict() already gives strings)
                kw[k] = kw[k].value
        if ignored:
            warnings.warn("onyx ignores these transformers.TrainingArguments keys: " + ", ".join(sorted(ignored)),
                          stacklevel=2)
        kw.update(overrides)
        return cls(**kw)


def _make_args_class(name, doc, optim_default=None):
    fields = []
    for a in _ARGS:
        default = _default(a)
        if a["name"] == "optim" and optim_default:
            default = optim_default
        meta = {"help": a["help"], "type": a["type"]}
        if a["choices"]:
            meta["choices"] = list(a["choices"])
        fields.append((a["name"], _TYPES.get(a["type"], typing.Any),
                       dataclasses.field(default=default, metadata=meta)))
    cls = dataclasses.make_dataclass(name, fields, bases=(_ArgsBase,))
    cls.__module__ = __name__
    cls.__doc__ = doc + "\n\nArguments (type = default):\n" + "\n".join(
        f"  {a['name']}: {a['type']} = {a['default']}\n      {a['help']}" for a in _ARGS)
    return cls


TrainingArguments = _make_args_class(
    "TrainingArguments",
    "Hugging Face's TrainingArguments: the keys onyx implements, with Transformers' names and defaults.\n"
    "An unknown keyword is a TypeError; an ill-typed or out-of-range value a ValueError naming the key.\n"
    "TrainingArguments.from_transformers(transformers_args) converts a transformers.TrainingArguments.")


# ----------------------------------------------------------------------------------------------
# Callbacks


class TrainerCallback:
    """Transformers' TrainerCallback: override the events you need. Each is called as
    event(args, state, control, **kwargs) (on_log gets logs=, on_evaluate metrics=); setting
    control.should_training_stop / should_save / should_evaluate / should_log acts on the C++
    Trainer's own control, as in Transformers."""

    def on_init_end(self, args, state, control, **kwargs): pass
    def on_train_begin(self, args, state, control, **kwargs): pass
    def on_train_end(self, args, state, control, **kwargs): pass
    def on_epoch_begin(self, args, state, control, **kwargs): pass
    def on_epoch_end(self, args, state, control, **kwargs): pass
    def on_step_begin(self, args, state, control, **kwargs): pass
    def on_substep_end(self, args, state, control, **kwargs): pass
    def on_step_end(self, args, state, control, **kwargs): pass
    def on_evaluate(self, args, state, control, **kwargs): pass
    def on_predict(self, args, state, control, metrics, **kwargs): pass
    def on_save(self, args, state, control, **kwargs): pass
    def on_log(self, args, state, control, **kwargs): pass
    def on_prediction_step(self, args, state, control, **kwargs): pass


class EarlyStoppingCallback(TrainerCallback):
    """Transformers' EarlyStoppingCallback: stops after `early_stopping_patience` evaluations
    without metric_for_best_model improving by more than `early_stopping_threshold`. Runs as the
    C++ callback `onyx train` uses (checked against Transformers in tests/parity)."""

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float = 0.0):
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold


class EvalPrediction:
    """What compute_metrics receives: predictions and label_ids as numpy arrays (None when the model
    or dataset has none); unpacks as `predictions, labels = p`, as Transformers' EvalPrediction."""

    def __init__(self, predictions, label_ids, losses=None):
        self.predictions, self.label_ids, self.losses = predictions, label_ids, losses

    def __iter__(self):
        return iter((self.predictions, self.label_ids))

    def __getitem__(self, i):
        return (self.predictions, self.label_ids)[i]

    def __len__(self):
        return 2


# ----------------------------------------------------------------------------------------------
# Trainer


def _np_dict(ds, which):
    if ds is None:
        return None
    import numpy as np
    if not isinstance(ds, dict):
        raise TypeError(f"{which}: expected a dict of numpy arrays (first dimension = sample), "
                        f"got {type(ds).__name__}")
    return {str(k): np.ascontiguousarray(v) for k, v in ds.items()}


class Trainer:
    """Transformers' Trainer over onyx's C++ Trainer.

    Trainer(model, args=None, train_dataset=None, eval_dataset=None, compute_metrics=None,
            callbacks=None, *, loss=None, predictions=None, frozen=None)

    model: an .onnx path (trains its scalar `loss` output, or `loss`: an output name or
    {type: cross_entropy | mse, logits, labels}) or a Hugging Face folder. args: onyx's
    TrainingArguments, a transformers.TrainingArguments or its to_dict(). compute_metrics:
    f(EvalPrediction) -> dict, or a list of onyx's built-in metric names (accuracy, f1, mse,
    perplexity), as a config's `metrics:`. The rest as Transformers.
    """

    def __init__(self, model, args=None, train_dataset=None, eval_dataset=None,
                 compute_metrics=None, callbacks=None, *, loss=None, predictions=None, frozen=None):
        if args is None:
            args = TrainingArguments(output_dir="trainer_output")  # Transformers' default folder
        elif not isinstance(args, _ArgsBase):
            args = TrainingArguments.from_transformers(args)
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError("model: expected the path of an .onnx file or a Hugging Face folder "
                            f"(torch.nn.Module / PreTrainedModel objects are not supported yet), got {type(model).__name__}")
        self.args = args
        self.model = os.fspath(model)
        self.train_dataset = _np_dict(train_dataset, "train_dataset")
        self.eval_dataset = _np_dict(eval_dataset, "eval_dataset")
        self.compute_metrics = compute_metrics
        self.callbacks = []
        for cb in callbacks or []:
            self.callbacks.append(cb() if isinstance(cb, type) else cb)
        self._loss, self._predictions, self._frozen = loss, predictions, list(frozen or [])
        self._t = self._build(args)

    def _build(self, args):
        names, fn = [], None
        cm = self.compute_metrics
        if isinstance(cm, (list, tuple)):
            names = [str(n) for n in cm]
        elif cm is not None:
            def fn(predictions, label_ids, loss, _cm=cm):
                return _cm(EvalPrediction(predictions, label_ids))
        cbs = []
        for cb in self.callbacks:
            if type(cb).__name__ == "EarlyStoppingCallback" and hasattr(cb, "early_stopping_patience"):
                # onyx's or Transformers' own: the C++ implementation
                cbs.append(("early_stopping", int(cb.early_stopping_patience),
                            float(cb.early_stopping_threshold or 0.0)))
            else:
                cbs.append(cb)
        return _onyx.Trainer(self.model, args._items(), args, self.train_dataset, self.eval_dataset,
                             fn, names, cbs, self._loss, self._predictions or "", self._frozen)

    def add_callback(self, callback):
        """Adds a callback (an instance or a class); takes effect from the next train()."""
        self.callbacks.append(callback() if isinstance(callback, type) else callback)
        self._t = self._build(self.args)

    def train(self, resume_from_checkpoint=None):
        """Trains; returns TrainOutput(global_step, training_loss, metrics). resume_from_checkpoint:
        a checkpoint-N folder (or True: the newest in output_dir) to continue from, bit for bit."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = _last_checkpoint(self.args.output_dir)
        if resume_from_checkpoint:
            self.args = dataclasses.replace(self.args, resume_from_checkpoint=os.fspath(resume_from_checkpoint))
            self._t = self._build(self.args)
        step, loss, metrics = self._t.train()
        return TrainOutput(step, loss, metrics)

    def evaluate(self, eval_dataset=None, metric_key_prefix="eval"):
        """Evaluates on eval_dataset; returns {eval_loss, eval_<metric>, eval_runtime, ..., epoch}."""
        if eval_dataset is not None:
            raise NotImplementedError("evaluate(eval_dataset=...): pass eval_dataset to the Trainer")
        return self._t.evaluate(metric_key_prefix)

    def predict(self, test_dataset):
        """PredictionOutput(predictions, label_ids, metrics) on a dict of numpy arrays."""
        p, l, m = self._t.predict(_np_dict(test_dataset, "test_dataset"))
        return PredictionOutput(p, l, m)

    def save_model(self, output_dir=None):
        """model.safetensors (and config.json for Hugging Face models) into output_dir."""
        self._t.save_model(os.fspath(output_dir or self.args.output_dir))

    @property
    def state(self):
        return self._t.state


def _last_checkpoint(folder):
    import re
    steps = [int(m.group(1)) for n in (os.listdir(folder) if os.path.isdir(folder) else [])
             if (m := re.fullmatch(r"checkpoint-(\d+)", n))]
    if not steps:
        raise ValueError(f"resume_from_checkpoint=True: no checkpoint-N folder in '{folder}'")
    return os.path.join(folder, f"checkpoint-{max(steps)}")


# Optimum's names, for code written for its ORTTrainer (onyx trains without ONNX Runtime; the
# fused AdamW it offered is optim="adamw_ort_fused", an alias of onyx's adamw_fused).
ORTTrainingArguments = _make_args_class(
    "ORTTrainingArguments",
    "Optimum's ORTTrainingArguments: onyx's TrainingArguments (optim='adamw_ort_fused' is onyx's "
    "fused AdamW).")


class ORTTrainer(Trainer):
    """Optimum's ORTTrainer: onyx's Trainer (the model is an ONNX file or a Hugging Face folder)."""

    def __init__(self, model, args=None, train_dataset=None, eval_dataset=None, compute_metrics=None,
                 callbacks=None, feature=None, **kwargs):
        super().__init__(model, args, train_dataset, eval_dataset, compute_metrics, callbacks, **kwargs)
