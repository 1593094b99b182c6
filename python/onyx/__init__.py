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

Models: a Transformers PreTrainedModel (BERT, RoBERTa, DistilBERT, GPT-2, ViT: trained in place,
its parameters hold the trained values after train()), a path to an .onnx file (its scalar `loss`
output is trained; or pass `loss=`) or a Hugging Face folder (config.json + model.safetensors).
Datasets: dicts of numpy arrays or torch tensors keyed by input names, first dimension = sample
(not copied: the C++ dataset views their memory, so do not modify them while a Trainer holds
them), datasets.Dataset, or map-style torch datasets, with an optional data_collator (called per
batch, as Transformers' DataLoaders call it; evaluation outputs of different lengths are joined
padded with -100, as its nested_concat).
Custom ops: onyx.load_custom_ops("libmyops.so").
"""
import contextlib
import copy
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import threading
import typing
import warnings
from collections import namedtuple

from . import _onyx

__all__ = [
    "TrainingArguments", "Trainer", "TrainerCallback", "TrainerControl", "TrainerState",
    "EarlyStoppingCallback", "EvalPrediction", "TrainOutput", "PredictionOutput",
    "ORTTrainer", "ORTTrainingArguments", "OnyxError", "set_num_threads", "load_custom_ops",
    "BestRun", "default_hp_space_optuna", "default_compute_objective",
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
    "float | None": typing.Optional[float], "dict | None": typing.Optional[dict],
    "str | list": typing.Union[str, list], "str | list | None": typing.Union[str, list, None],
    "str | bool": typing.Union[str, bool],
}
_ARGS = _onyx.describe_args()
_KEYS = {a["name"] for a in _ARGS}


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
    if isinstance(value, dict):  # lr_scheduler_kwargs, fsdp_config, ...
        return json.dumps(value)
    if isinstance(value, (list, tuple)):  # report_to=["tensorboard"], as Transformers accepts
        if len(value) == 0:
            return "none"
        if len(value) == 1 and not isinstance(value[0], (list, dict)):
            return _text(value[0])
        return json.dumps(list(value))
    if hasattr(value, "value") and not isinstance(value, str):  # Transformers' enums
        return _text(value.value)
    return str(value)


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

        Every key of Transformers' TrainingArguments is one of onyx's (warmup_steps < 1 is
        Transformers 5's ratio: warmup_ratio): the inert ones take any value, those onyx does not
        implement only their default (another value raises ValueError saying why). Keys of
        another version (not in this table) are ignored with a warning listing them.
        """
        d = dict(targs) if isinstance(targs, dict) else targs.to_dict()
        ours = {f.name for f in dataclasses.fields(cls)}
        onyx_fields = set(_onyx.arg_keys()[:_NUM_ONYX_FIELDS])
        # Transformers' __post_init__ expands some defaults (accelerator_config and fsdp_config
        # become dicts, debug a list): those are still the defaults
        expanded = _transformers_defaults(d.get("output_dir"))
        kw, ignored = {}, []
        for k, v in d.items():
            if k in ours and k not in onyx_fields and k in expanded and expanded[k] == v:
                continue
            if k in ours:
                kw[k] = v
            elif k == "evaluation_strategy":
                kw["eval_strategy"] = v
            else:
                ignored.append(k)
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


# onyx's own fields come first in describe_args(), then Transformers' keys onyx has no field for
_NUM_ONYX_FIELDS = sum(1 for a in _ARGS if not a["help"].startswith("Transformers' key"))


def _transformers_defaults(output_dir):
    """transformers.TrainingArguments' to_dict() at its defaults ({} without transformers)."""
    try:
        import transformers
        return transformers.TrainingArguments(output_dir=output_dir or "trainer_output").to_dict()
    except Exception:  # noqa: BLE001 — only used to recognise defaults
        return {}


def _make_args_class(name, doc, optim_default=None):
    fields = []
    for a in _ARGS:
        default = _default(a)
        if a["name"] == "optim" and optim_default:
            default = optim_default
        meta = {"help": a["help"], "type": a["type"]}
        if a["choices"]:
            meta["choices"] = list(a["choices"])
        if isinstance(default, (list, dict)):  # include_for_metrics=[]: one per instance
            field = dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d),
                                      metadata=meta)
        else:
            field = dataclasses.field(default=default, metadata=meta)
        fields.append((a["name"], _TYPES.get(a["type"], typing.Any), field))
    cls = dataclasses.make_dataclass(name, fields, bases=(_ArgsBase,))
    cls.__module__ = __name__
    init = cls.__init__

    def __init__(self, *args, **kwargs):  # an unknown key: TypeError, with the key meant
        unknown = [k for k in kwargs if k not in self.__dataclass_fields__]
        if unknown:
            import difflib
            hints = [f"'{k}'" + (f" (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(
                k, list(self.__dataclass_fields__), n=1)) else "") for k in unknown]
            raise TypeError(f"{name}.__init__() got an unexpected keyword argument "
                            + ", ".join(hints))
        init(self, *args, **kwargs)

    __init__.__signature__ = __import__("inspect").signature(init)
    cls.__init__ = __init__
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


def _as_transformers_args(args):
    """`args` as a transformers.TrainingArguments (what Transformers pickles into
    training_args.bin), or None without transformers. The values the user set (those not at
    onyx's default) are given to its constructor; one it refuses (an onyx-only value such as
    optim="adamw") is set on the built object as it is."""
    try:
        import transformers
    except ImportError:
        return None
    cls = transformers.TrainingArguments
    theirs = {f.name for f in dataclasses.fields(cls) if f.init}
    mine = {a["name"]: (getattr(args, a["name"]), _default(a)) for a in _ARGS}
    given = {k: v for k, (v, d) in mine.items() if k in theirs and v != d}
    given["output_dir"] = args.output_dir
    if "warmup_ratio" not in theirs and mine["warmup_ratio"][0] and not args.warmup_steps:
        given["warmup_steps"] = mine["warmup_ratio"][0]  # Transformers 5: a ratio below 1
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return cls(**given)
        except Exception:  # noqa: BLE001 — find the values it refuses, one by one
            pass
        out_dir = {"output_dir": args.output_dir}
        taken, refused = {}, {}
        for k, v in given.items():
            try:
                cls(**out_dir, **{k: v})
                taken[k] = v
            except Exception:  # noqa: BLE001
                refused[k] = v
        obj = cls(**taken)
    for k, v in refused.items():
        object.__setattr__(obj, k, v)
    return obj


def _save_training_args(args, folder):
    """training_args.bin as Transformers' _save writes it (torch.save of its TrainingArguments),
    beside training_args.json; nothing without torch and transformers (nothing could read it)."""
    try:
        import torch
    except ImportError:
        return
    obj = _as_transformers_args(args)
    if obj is None or not os.path.isdir(folder):
        return
    path = os.path.join(folder, "training_args.bin")
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


class _SaveAsTransformers(TrainerCallback):
    """Transformers' _save_checkpoint saves the processing_class and training_args.bin into each
    checkpoint-N folder."""

    def __init__(self, processing_class):
        self.processing_class = processing_class

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(folder):
            return
        if hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(folder)
        _save_training_args(args, folder)


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


def _array(v, where):
    """A numpy view of an array-like: numpy arrays and CPU torch tensors are shared, not copied
    (a copy is made only when the memory is not C-contiguous)."""
    import numpy as np
    if type(v).__module__.startswith("torch"):
        v = v.detach()
        if v.device.type != "cpu":
            raise ValueError(f"{where}: a tensor on {v.device}; onyx trains on the CPU")
        if not v.is_contiguous():
            v = v.contiguous()
        return v.numpy()
    a = np.asarray(v)
    if a.dtype == object:
        raise ValueError(f"{where}: ragged or non-numeric values (dtype object); pad them (e.g. "
                         "data_collator=DataCollatorWithPadding(tokenizer)) or pass arrays")
    return np.ascontiguousarray(a)


def _collate(features, collator, where):
    """A list of per-sample dicts as one dict of arrays: `collator` (Transformers' data collators,
    any f(list of dicts) -> dict), else stacked as Transformers' default_data_collator does
    ('label' / 'label_ids' become 'labels')."""
    import numpy as np
    if collator is not None:
        batch = collator(features)
        return {str(k): _array(v, f"{where}['{k}']") for k, v in dict(batch).items()}
    if not features:
        raise ValueError(f"{where}: empty dataset")
    out = {}
    for k in features[0]:
        vals = [f[k] for f in features]
        if isinstance(vals[0], str):
            continue  # raw text columns: not model inputs
        name = "labels" if k in ("label", "label_ids") else str(k)
        if type(vals[0]).__module__.startswith("torch"):
            import torch
            out[name] = _array(torch.stack(vals), f"{where}['{k}']")
        else:
            try:
                out[name] = np.ascontiguousarray(np.stack([np.asarray(v) for v in vals]))
            except ValueError as e:
                raise ValueError(f"{where}['{k}']: samples of different shapes ({e}); pad them, "
                                 "e.g. data_collator=DataCollatorWithPadding(tokenizer)") from None
    return out


class _PerBatch:
    """A dataset of per-sample rows whose data_collator runs per batch, when the C++ Trainer asks
    for the rows of a batch (as Transformers' DataLoader calls it: per-batch padding, fresh MLM
    masks each epoch, pad_to_multiple_of per batch). `first` is the first batch, collated here to
    learn the columns (and to give torch.onnx.export its samples)."""

    def __init__(self, rows, collator, which, keep, used, batch_size):
        self.rows, self.collator, self.which, self.keep, self.used = rows, collator, which, keep, used
        n = len(rows)
        if n == 0:
            raise ValueError(f"{which}: empty dataset")
        self.first = self.fetch(list(range(min(n, max(1, batch_size)))))
        self.size = n

    def fetch(self, indices):
        out = _collate([self.used(dict(self.rows[int(i)])) for i in indices], self.collator,
                       self.which)
        return {k: v for k, v in out.items() if self.keep is None or k in self.keep}

    input_name = "input_ids"  # the Trainer sets processing_class.model_input_names[0]

    def lengths(self, column):
        """Each row's length for group_by_length, as Transformers' LengthGroupedSampler takes it:
        a datasets.Dataset's `column` (length_column_name), else len(row[input_name])."""
        if column in (getattr(self.rows, "column_names", None) or []):
            return [int(x) for x in self.rows[column]]
        out = []
        for i in range(self.size):
            row = self.rows[i]
            if not hasattr(row, "keys") or self.input_name not in row:
                raise ValueError(f"{self.which}: Can only automatically infer lengths for datasets "
                                 f"whose items are dictionaries with an '{self.input_name}' key.")
            out.append(len(row[self.input_name]))
        return out

    def for_cpp(self):
        return ("per_batch", self.fetch, self.size, sorted(self.first), self.lengths)

    # the dict-of-arrays view the rest of the Trainer reads (samples for export)
    def __iter__(self):
        return iter(self.first)

    def __getitem__(self, k):
        return self.first[k]

    def values(self):
        return self.first.values()

    def __bool__(self):
        return True


def _for_cpp(ds):
    """What the extension takes: a dict of arrays, or a per-batch dataset's (fetch, size, keys)."""
    return ds.for_cpp() if isinstance(ds, _PerBatch) else ds


def _dataset(ds, which, collator=None, keep=None, per_batch=0, length_column=None):
    """Any dataset Transformers' Trainer takes, as the dict of arrays (first dimension = sample)
    the C++ Trainer views: a dict of numpy arrays / torch tensors (shared, not copied), a
    Hugging Face datasets.Dataset (its numeric columns; with a data_collator, the collated rows),
    or a map-style torch Dataset / any sequence of per-sample dicts. `keep`: the model's input
    names; other columns are dropped, as Transformers' remove_unused_columns does.
    `length_column`: group_by_length's; a datasets.Dataset that has it is read per batch, so
    the C++ Trainer can ask for the column (_PerBatch.lengths)."""
    if ds is None:
        return None
    labels = ("label", "label_ids", "labels")
    unused = set()

    def used(feature):  # remove_unused_columns, before the collator sees the rows
        if keep is None:
            return feature
        unused.update(k for k in feature if k not in keep and k not in labels)
        return {k: v for k, v in feature.items() if k in keep or k in labels}

    if isinstance(ds, dict):  # already batched: the collator (per-sample rows) does not apply
        out = {str(k): _array(v, f"{which}['{k}']") for k, v in ds.items()}
    elif type(ds).__module__.startswith("datasets") and hasattr(ds, "column_names"):
        if collator is None and not (per_batch and length_column in ds.column_names):
            cols = [c for c in ds.column_names if keep is None or c in keep or c in labels]
            unused.update(c for c in ds.column_names if c not in cols)
            import numpy as np
            out = {}
            table = ds.select_columns(cols).with_format("numpy")[:]  # one array per column
            for c in cols:
                col = table[c]
                if isinstance(col, list) or getattr(col, "dtype", None) == object:
                    raise ValueError(f"{which}['{c}']: samples of different lengths; pad them "
                                     "(padding='max_length' when tokenizing) or pass "
                                     "data_collator=DataCollatorWithPadding(tokenizer)")
                if col.dtype.kind in "USO":
                    continue  # text columns
                out["labels" if c in ("label", "label_ids") else c] = np.ascontiguousarray(col)
        elif per_batch:
            out = _PerBatch(ds, collator, which, keep, used, per_batch)
        else:
            out = _collate([used(ds[i]) for i in range(len(ds))], collator, which)
    elif hasattr(ds, "__getitem__") and hasattr(ds, "__len__"):
        if collator is not None and per_batch:
            out = _PerBatch(ds, collator, which, keep, used, per_batch)
        else:
            out = _collate([used(dict(ds[i])) for i in range(len(ds))], collator, which)
    else:
        raise TypeError(f"{which}: expected a dict of arrays, a datasets.Dataset or a map-style "
                        f"dataset (__getitem__ and __len__), got {type(ds).__name__}")
    if keep is not None:
        dropped = sorted(unused | {k for k in out if k not in keep})
        if dropped:
            warnings.warn(f"{which}: columns not used by the model's forward, dropped: "
                          + ", ".join(dropped))
        if not isinstance(out, _PerBatch):  # (which drops them from each batch)
            out = {k: v for k, v in out.items() if k in keep}
    return out



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
    _BUILT = {"BertForSequenceClassification", "BertForMaskedLM", "BertForTokenClassification",
              "RobertaForSequenceClassification", "RobertaForMaskedLM",
              "DistilBertForSequenceClassification", "DistilBertForMaskedLM", "GPT2LMHeadModel",
              "GPT2ForSequenceClassification", "ViTForImageClassification", "BertModel", "GPT2Model",
              "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
              "LlamaForSequenceClassification", "MistralForSequenceClassification",
              "Qwen2ForSequenceClassification", "LlamaModel", "MistralModel", "Qwen2Model"}

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
        weights = {}
        for name, t in base.state_dict().items():
            if ".lora_" in name:
                continue
            weights[name.replace(".base_layer.", ".")] = t.detach().to(torch.float32).contiguous().clone()
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
                raise OnyxError("the trained adapters do not match the PEFT model: "
                                + ", ".join(result.unexpected_keys[:8]))
            return
        trained = self._t.weights()  # numpy views of the C++ storage, copied into the module below
        params = dict(self._module.named_parameters(remove_duplicate=False))
        missing = [n for n in params if n not in trained]
        untied = [n for n in missing if not any(p is params[n] for k, p in params.items()
                                                if k in trained)]
        untied = [n for n in untied if params[n].requires_grad]
        if untied:
            raise OnyxError("the trained weights lack parameters of the module (renamed by the "
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
                             self._peft_dir or "")

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
        if backend not in (None, "optuna"):
            raise NotImplementedError(f"backend={backend!r}: onyx implements the optuna backend")
        if self.model_init is None:
            raise RuntimeError("To use hyperparameter search, you need to pass your model through a "
                               "model_init function.")
        import inspect
        import optuna
        hp_space = hp_space or default_hp_space_optuna
        compute_objective = compute_objective or default_compute_objective
        init_takes_trial = len(inspect.signature(self.model_init).parameters) >= 1
        optimize_kw = {k: kwargs.pop(k) for k in ("timeout", "n_jobs", "gc_after_trial", "callbacks",
                                                  "catch") if k in kwargs}
        base = self.args

        def objective(trial):
            params = hp_space(trial)
            known = {k: v for k, v in params.items() if k in _KEYS}
            unknown = sorted(set(params) - set(known))
            if unknown:
                warnings.warn("hyperparameter_search: not TrainingArguments keys, ignored: "
                              + ", ".join(unknown))
            known = {k: type(getattr(base, k))(v) if getattr(base, k) is not None else v
                     for k, v in known.items()}
            run = hp_name(trial) if hp_name else str(trial.number)
            args = dataclasses.replace(base, **known,
                                       output_dir=os.path.join(base.output_dir, f"run-{run}"))
            sub = copy.copy(self)
            if init_takes_trial:
                model = self.model_init(trial)
                sub._module, sub._tmp = None, None
                if _is_torch_module(model):
                    sub._module = model
                    sub.model = sub._from_module(model)
                else:
                    sub.model = os.fspath(model)
            reporter = _OptunaReport(trial, compute_objective)
            sub.callbacks = list(self.callbacks) + [reporter]
            sub.args = args
            sub._t = sub._build(args)
            sub.train()
            if reporter.pruned:
                raise optuna.TrialPruned()
            if reporter.objective is None:
                reporter.objective = compute_objective(sub.evaluate())
            return reporter.objective

        study = optuna.create_study(direction=direction, **kwargs)
        study.optimize(objective, n_trials=n_trials, **optimize_kw)
        best = study.best_trial
        return BestRun(str(best.number), best.value, best.params, study)


BestRun = namedtuple("BestRun", ["run_id", "objective", "hyperparameters", "run_summary"])


def default_hp_space_optuna(trial):
    """Transformers' default search space."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size",
                                                                 [4, 8, 16, 32, 64]),
    }


def default_compute_objective(metrics):
    """Transformers' default objective: eval_loss when there are no other metrics, else the sum of
    the metrics (epoch and speed metrics left out)."""
    metrics = dict(metrics)
    loss = metrics.pop("eval_loss", None)
    metrics.pop("epoch", None)
    for k in [k for k in metrics if k.endswith("_runtime") or k.endswith("_per_second")]:
        metrics.pop(k)
    return loss if len(metrics) == 0 else sum(metrics.values())


class _OptunaReport(TrainerCallback):
    """Reports each evaluation's objective to the trial and stops training when Optuna prunes it
    (Transformers' _report_to_hp_search)."""

    def __init__(self, trial, compute_objective):
        self.trial, self.compute_objective = trial, compute_objective
        self.objective, self.pruned = None, False

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.objective = self.compute_objective(dict(metrics or {}))
        self.trial.report(self.objective, state.global_step)
        if self.trial.should_prune():
            self.pruned = True
            control.should_training_stop = True


def load_custom_ops(path):
    """Loads a custom-op library built against include/onyx/custom_op.h (as the CLI's
    --custom-ops and a config's custom_op_libraries do) before the Trainer that needs it is
    made; returns the ops it registered as dicts (domain, name, library, gradient)."""
    return _onyx.load_custom_ops(os.fspath(path))


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
    """Optimum's ORTTrainer: onyx's Trainer, with the parameters of Optimum's last ORTTrainer
    (model, args, data_collator, train_dataset, eval_dataset, tokenizer, model_init,
    compute_metrics, callbacks, optimizers, preprocess_logits_for_metrics): tokenizer is
    Transformers' processing_class. Older Optimum keywords (feature, onnx_model_path) are accepted
    and not needed: onyx trains the model itself, not an ONNX Runtime export of it."""

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None,
                 eval_dataset=None, tokenizer=None, model_init=None, compute_metrics=None,
                 callbacks=None, optimizers=(None, None), preprocess_logits_for_metrics=None,
                 feature=None, onnx_model_path=None, **kwargs):
        processing_class = kwargs.pop("processing_class", tokenizer)
        super().__init__(model, args, data_collator, train_dataset, eval_dataset, processing_class,
                         model_init, None, compute_metrics, callbacks, optimizers,
                         preprocess_logits_for_metrics, **kwargs)
