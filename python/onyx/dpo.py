"""onyx.dpo — TRL 1.16's DPOConfig and DPOTrainer over onyx's DPO (`trainer: dpo` in a config;
models/preference_head.h, data/preference_dataset.h): a TRL script runs after changing its import
line.

    from onyx import DPOConfig, DPOTrainer
    args = DPOConfig(output_dir="out", beta=0.1, loss_type="sigmoid")
    trainer = DPOTrainer(model=model, args=args, train_dataset=pairs, processing_class=tokenizer)
    trainer.train()

DPOConfig is TrainingArguments with DPOConfig's fields and defaults (learning_rate 1e-6,
logging_steps 10, gradient_checkpointing True, bf16 unless fp16). The rows (prompt / chosen /
rejected, strings or message lists; datasets.Dataset, a list of dicts or a dict of lists) and the
tokenizer (processing_class, saved with save_pretrained) are written to a temporary folder and
tokenized by onyx as TRL tokenizes them. The reference is the starting policy (TRL's frozen
copy, its LoRA base with the adapters off, precompute_ref_log_probs), or a ref_model (a model of
the same architecture or its folder) with other weights, whose log-probabilities onyx computes
once before the first step.
"""
import dataclasses
import json
import os
import tempfile
import typing

from .data import _rows_of
from .trainer import Trainer, _is_torch_module, _model_init_kwargs_items
from .training_args import TrainingArguments, _text


@dataclasses.dataclass
class DPOConfig(TrainingArguments):
    """TRL 1.16's DPOConfig: TrainingArguments' keys, DPOConfig's defaults for four of them, and
    its DPO fields (those onyx implements; see onyx.dpo)."""
    learning_rate: float = 1e-6
    logging_steps: float = 10
    gradient_checkpointing: bool = True
    bf16: typing.Optional[bool] = None
    max_length: typing.Optional[int] = 1024
    truncation_mode: str = "keep_start"
    pad_to_multiple_of: typing.Optional[int] = None
    precompute_ref_log_probs: bool = False
    precompute_ref_batch_size: typing.Optional[int] = None
    loss_type: typing.Union[str, list] = dataclasses.field(default_factory=lambda: ["sigmoid"])
    loss_weights: typing.Optional[list] = None
    beta: float = 0.1
    label_smoothing: float = 0.0
    discopop_tau: float = 0.05
    disable_dropout: bool = True
    f_divergence_type: str = "reverse_kl"
    use_weighting: bool = False
    ld_alpha: typing.Optional[float] = None
    sync_ref_model: bool = False
    padding_free: bool = False
    dataset_num_proc: typing.Optional[int] = None
    model_init_kwargs: typing.Optional[dict] = None

    def __post_init__(self):
        if self.bf16 is None:
            object.__setattr__(self, "bf16", not self.fp16)
        if isinstance(self.loss_type, str):
            object.__setattr__(self, "loss_type", [self.loss_type])
        for name, want in (("f_divergence_type", "reverse_kl"), ("use_weighting", False),
                           ("ld_alpha", None), ("sync_ref_model", False), ("padding_free", False)):
            if getattr(self, name) != want:
                raise ValueError(f"DPOConfig.{name}={getattr(self, name)!r}: onyx implements "
                                 f"{name}={want!r} only")
        super().__post_init__()

    def _dpo_items(self):
        """The run-config keys of `trainer: dpo` (config/run_config.h)."""
        items = [("trainer", "dpo"), ("beta", _text(float(self.beta))),
                 ("loss_type", json.dumps(list(self.loss_type))),
                 ("label_smoothing", _text(float(self.label_smoothing))),
                 ("discopop_tau", _text(float(self.discopop_tau))),
                 ("disable_dropout", _text(bool(self.disable_dropout)))]
        if self.loss_weights is not None:
            items.append(("loss_weights", json.dumps([float(w) for w in self.loss_weights])))
        if self.precompute_ref_batch_size:
            items.append(("precompute_ref_batch_size", str(int(self.precompute_ref_batch_size))))
        return items


def _same_weights(a, b):
    import torch
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


class DPOTrainer(Trainer):
    """TRL 1.16's DPOTrainer over onyx (see onyx.dpo).

    DPOTrainer(model, ref_model=None, args=None, data_collator=None, train_dataset=None,
               eval_dataset=None, processing_class=None, compute_metrics=None, callbacks=None,
               optimizers=(None, None), peft_config=None)
    """

    def __init__(self, model, ref_model=None, args=None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, compute_metrics=None, callbacks=None,
                 optimizers=(None, None), peft_config=None):
        args = DPOConfig._of(args)
        if data_collator is not None:
            raise NotImplementedError("data_collator: onyx batches preference pairs as TRL's "
                                      "DataCollatorForPreference does")
        if processing_class is None or not hasattr(processing_class, "save_pretrained"):
            raise ValueError("DPOTrainer: processing_class (the tokenizer) is needed to tokenize "
                             "the pairs")
        self._dpo_tmp = tempfile.TemporaryDirectory(prefix="onyx-dpo-")
        ref_dir = None  # a reference with other weights than the policy's: `ref_model: FOLDER`
        if isinstance(ref_model, (str, os.PathLike)):
            ref_dir = os.fspath(ref_model)
        elif ref_model is not None and not (_is_torch_module(model) and _is_torch_module(ref_model)
                                            and _same_weights(model, ref_model)):
            if not hasattr(ref_model, "save_pretrained"):
                raise TypeError("ref_model: a Transformers model, its folder, or None")
            ref_dir = os.path.join(self._dpo_tmp.name, "ref_model")
            ref_model.save_pretrained(ref_dir, safe_serialization=True)
        tok_dir = os.path.join(self._dpo_tmp.name, "tokenizer")
        processing_class.save_pretrained(tok_dir)
        specs = {}
        for key, ds in (("train_data", train_dataset), ("eval_data", eval_dataset)):
            rows = _rows_of(ds, key, "prompt / chosen / rejected")
            if rows is None:
                continue
            path = os.path.join(self._dpo_tmp.name, key + ".jsonl")
            with open(path, "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            spec = {"type": "preference", "path": path, "tokenizer": tok_dir,
                    "max_length": int(args.max_length or 0), "truncation_mode": args.truncation_mode}
            if args.pad_to_multiple_of:
                spec["pad_multiple"] = int(args.pad_to_multiple_of)
            specs[key] = json.dumps(spec)
        self._data_specs = specs
        self._config_items = (args._dpo_items() + ([("ref_model", ref_dir)] if ref_dir else [])
                              + _model_init_kwargs_items(args.model_init_kwargs, model))
        super().__init__(model, args, processing_class=processing_class,
                         compute_metrics=compute_metrics, callbacks=callbacks,
                         optimizers=optimizers, peft_config=peft_config)
