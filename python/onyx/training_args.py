"""onyx.training_args — TrainingArguments (Transformers' names and defaults), a dataclass whose
fields are exactly the keys of onyx's C++ TrainingArguments, read from the extension
(TrainingArguments::describe()) so they cannot drift; conversion from a
transformers.TrainingArguments; and training_args.bin as Transformers writes it."""
import copy
import dataclasses
import json
import os
import typing
import warnings

from . import _onyx

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
        items = self._items()
        try:
            canonical = json.loads(_onyx.check_args(items))
        except _onyx.OnyxError as e:
            raise ValueError(str(e)) from None
        for k, v in canonical.items():  # typed values: learning_rate="1e-4" becomes 0.0001
            if k in ("report_to",) and isinstance(getattr(self, k), (list, tuple)):
                continue
            object.__setattr__(self, k, v)

    def __setattr__(self, key, value):
        if key not in self.__dataclass_fields__:
            raise AttributeError(f"{type(self).__name__} has no argument '{key}'")
        object.__setattr__(self, key, value)

    @classmethod
    def _of(cls, args):
        """args as this class (a TRL trainer's config): the default one for None, args itself
        when it is one, else its fields (a dict or anything with to_dict()) this class has."""
        if args is None:
            return cls(output_dir="trainer_output")
        if isinstance(args, cls):
            return args
        d = args if isinstance(args, dict) else args.to_dict()
        ours = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in ours})

    def _items(self):
        """The TrainingArguments keys and their values as text (a subclass's own fields, such as
        DPOConfig's, stay in Python)."""
        return [(f.name, _text(getattr(self, f.name))) for f in dataclasses.fields(self)
                if f.name in _KEYS]

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
