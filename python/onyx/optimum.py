"""onyx.optimum — Optimum's names, for code written for its ORTTrainer (onyx trains without ONNX
Runtime; the fused AdamW it offered is optim="adamw_ort_fused", an alias of onyx's adamw_fused)."""
from .trainer import Trainer
from .training_args import _make_args_class

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
