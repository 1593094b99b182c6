"""onyx.grpo — TRL 1.16's GRPOConfig and GRPOTrainer over onyx's GRPO (`trainer: grpo` in a
config; train/grpo.h, models/grpo_head.h): a TRL script runs after changing its import line.

    from onyx import GRPOConfig, GRPOTrainer
    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) for c in completions]
    args = GRPOConfig(output_dir="out", num_generations=4, max_completion_length=32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_len, args=args,
                          train_dataset=prompts, processing_class=tokenizer)
    trainer.train()

GRPOConfig is TrainingArguments with GRPOConfig's fields and defaults (learning_rate 1e-6,
logging_steps 10, gradient_checkpointing True, bf16 unless fp16, per_device_train_batch_size
8). The rows (a "prompt" string or message list, and any other columns) and the tokenizer are
written to a temporary folder; onyx tokenizes the prompts as TRL does, samples num_generations
completions per prompt with its own generator from the current weights (the Trainer's
parameters: no copy), and calls each reward function as TRL does: f(prompts=, completions=,
completion_ids=, **columns, trainer_state=, log_extra=, log_metric=) -> one float (or None) per
completion. rollout_func(prompts, trainer) -> {prompt_ids, completion_ids, logprobs} replaces the
sampling as TRL's does. One generation batch is sampled per optimizer step
(steps_per_generation = gradient_accumulation_steps); shuffle_dataset orders the prompts with
onyx's RNG, not torch's.
"""
import dataclasses
import json
import math
import os
import tempfile
import typing

from .data import _rows_of
from .trainer import Trainer, _model_init_kwargs_items
from .training_args import TrainingArguments, _text


@dataclasses.dataclass
class GRPOConfig(TrainingArguments):
    """TRL 1.16's GRPOConfig: TrainingArguments' keys, GRPOConfig's defaults for five of them, and
    its GRPO fields (those onyx implements; others must keep their defaults)."""
    learning_rate: float = 1e-6
    logging_steps: float = 10
    gradient_checkpointing: bool = True
    bf16: typing.Optional[bool] = None
    per_device_train_batch_size: int = 8
    remove_unused_columns: typing.Optional[bool] = False
    num_generations: typing.Optional[int] = 8
    max_completion_length: typing.Optional[int] = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: typing.Optional[float] = None
    repetition_penalty: float = 1.0
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: typing.Optional[float] = None
    loss_type: str = "dapo"
    scale_rewards: typing.Union[str, bool] = "group"
    num_iterations: int = 1
    steps_per_generation: typing.Optional[int] = None
    generation_batch_size: typing.Optional[int] = None
    reward_weights: typing.Optional[list] = None
    mask_truncated_completions: bool = False
    shuffle_dataset: typing.Optional[bool] = True
    disable_dropout: bool = False
    multi_objective_aggregation: str = "sum_then_normalize"
    importance_sampling_level: str = "token"
    use_bias_correction_kl: bool = True
    chat_template_kwargs: typing.Optional[dict] = None
    generation_kwargs: typing.Optional[dict] = None
    use_vllm: bool = False
    top_entropy_quantile: float = 1.0
    delta: typing.Optional[float] = None
    cast_lm_head_to_fp32: bool = False
    num_generations_eval: typing.Optional[int] = None
    log_completions: bool = False
    pad_to_multiple_of: typing.Optional[int] = None
    model_init_kwargs: typing.Optional[dict] = None

    _NOT_BUILT = (("use_vllm", False), ("top_entropy_quantile", 1.0), ("delta", None),
                  ("min_p", None), ("generation_kwargs", None), ("importance_sampling_level", "token"),
                  ("chat_template_kwargs", None), ("num_generations_eval", None),
                  ("log_completions", False), ("cast_lm_head_to_fp32", False),
                  ("pad_to_multiple_of", None))

    def __post_init__(self):
        if self.bf16 is None:
            object.__setattr__(self, "bf16", not self.fp16)
        for name, want in self._NOT_BUILT:
            if getattr(self, name) != want:
                raise ValueError(f"GRPOConfig.{name}={getattr(self, name)!r}: onyx implements "
                                 f"{name}={want!r} only")
        super().__post_init__()

    def _items(self):
        # remove_unused_columns (GRPOConfig's False keeps the columns for the reward functions):
        # onyx's GRPO data keeps them either way
        return [(k, v) for k, v in super()._items() if k != "remove_unused_columns"]

    def _grpo_items(self):
        """The run-config keys of `trainer: grpo` (config/run_config.h)."""
        items = [("trainer", "grpo")]
        for name in ("num_generations", "max_completion_length", "temperature", "top_p", "top_k",
                     "repetition_penalty", "beta", "epsilon", "epsilon_high", "loss_type",
                     "scale_rewards", "num_iterations", "steps_per_generation",
                     "generation_batch_size", "mask_truncated_completions", "shuffle_dataset",
                     "disable_dropout", "multi_objective_aggregation", "use_bias_correction_kl"):
            value = getattr(self, name)
            if value is None and name in ("epsilon_high", "steps_per_generation",
                                          "generation_batch_size"):
                continue
            items.append((name, _text(float(value) if isinstance(value, float) else value)))
        if self.reward_weights is not None:
            items.append(("reward_weights", json.dumps([float(w) for w in self.reward_weights])))
        return items


def _is_conversational(prompt):
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)


class GRPOTrainer(Trainer):
    """TRL 1.16's GRPOTrainer over onyx (see onyx.grpo).

    GRPOTrainer(model, reward_funcs, args=None, train_dataset=None, eval_dataset=None,
                processing_class=None, reward_processing_classes=None, callbacks=None,
                optimizers=(None, None), peft_config=None, rollout_func=None)
    """

    def __init__(self, model, reward_funcs, args=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), peft_config=None, tools=None, rollout_func=None,
                 environment_factory=None):
        args = GRPOConfig._of(args)
        for name, value in (("eval_dataset", eval_dataset), ("tools", tools),
                            ("environment_factory", environment_factory),
                            ("reward_processing_classes", reward_processing_classes)):
            if value is not None:
                raise NotImplementedError(f"GRPOTrainer({name}=...): not built in onyx")
        if processing_class is None and isinstance(model, (str, os.PathLike)):
            import transformers
            processing_class = transformers.AutoTokenizer.from_pretrained(os.fspath(model))
        if processing_class is None or not hasattr(processing_class, "save_pretrained"):
            raise ValueError("GRPOTrainer: processing_class (the tokenizer) is needed")
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        self.reward_funcs, self.reward_func_names = [], []
        for f in funcs:
            if isinstance(f, str) or not callable(f) or hasattr(f, "parameters"):
                raise NotImplementedError(f"reward_funcs: {f!r}: onyx calls Python functions "
                                          "(a reward model is not supported)")
            self.reward_funcs.append(f)
            self.reward_func_names.append(getattr(f, "__name__", type(f).__name__))
        if args.reward_weights is not None and len(args.reward_weights) != len(funcs):
            raise ValueError(f"Number of reward weights ({len(args.reward_weights)}) must match "
                             f"number of reward functions ({len(funcs)})")
        self.rollout_func = rollout_func
        self._rows_py = _rows_of(train_dataset, "train_dataset", "a prompt")
        if not self._rows_py:
            raise ValueError("GRPOTrainer: train_dataset has no rows")
        self._grpo_tmp = tempfile.TemporaryDirectory(prefix="onyx-grpo-")
        tok_dir = os.path.join(self._grpo_tmp.name, "tokenizer")
        processing_class.save_pretrained(tok_dir)
        path = os.path.join(self._grpo_tmp.name, "train_data.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in self._rows_py:
                f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
        self._data_specs = {"train_data": json.dumps({"type": "prompts", "path": path,
                                                      "tokenizer": tok_dir})}
        self._config_items = (args._grpo_items()
                              + _model_init_kwargs_items(args.model_init_kwargs, model))
        super().__init__(model, args, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers, peft_config=peft_config)

    # -- what the C++ rollout calls (train/grpo.h): rows are indices into train_dataset's rows
    def _reward_call(self, index):
        func = self.reward_funcs[index]

        def call(rows, completions, completion_ids, step):
            inputs = [self._rows_py[r] for r in rows]
            prompts = [x["prompt"] for x in inputs]
            if _is_conversational(prompts[0]):
                completions = [[{"role": "assistant", "content": c}] for c in completions]
            keys = [k for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")]
            kwargs = {k: [x.get(k) for x in inputs] for k in keys}
            kwargs["trainer_state"] = self.state
            logged = {}
            kwargs["log_extra"] = lambda column, values: None  # the completions table: not kept
            kwargs["log_metric"] = lambda name, value: logged.setdefault(name, []).append(
                float(value))
            out = func(prompts=prompts, completions=completions, completion_ids=completion_ids,
                       **kwargs)
            return [math.nan if r is None else float(r) for r in out], logged
        return call

    def _rollout_call(self, rows):
        prompts = [self._rows_py[r]["prompt"] for r in rows]
        out = self.rollout_func(prompts, self)
        missing = {"prompt_ids", "completion_ids", "logprobs"} - set(out)
        if missing:
            raise ValueError(f"rollout_func must return keys {sorted(missing)} in its output dict.")
        return [(list(map(int, p)), list(map(int, c)))
                for p, c in zip(out["prompt_ids"], out["completion_ids"])]

    def _build(self, args):
        self._grpo_hooks = ([(n, self._reward_call(i)) for i, n in enumerate(self.reward_func_names)],
                            self._rollout_call if self.rollout_func is not None else None)
        return super()._build(args)
