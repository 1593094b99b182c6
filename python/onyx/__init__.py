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

Seq2SeqTrainer and Seq2SeqTrainingArguments are Transformers' names for encoder–decoders
(Whisper, BART): predict_with_generate generates from the encoder inputs, as there.

Models: a Transformers PreTrainedModel (BERT, RoBERTa, DistilBERT, GPT-2, ViT, Llama, Whisper,
BART, ...: trained in place,
its parameters hold the trained values after train()), a path to an .onnx file (its scalar `loss`
output is trained; or pass `loss=`) or a Hugging Face folder (config.json + model.safetensors).
Datasets: dicts of numpy arrays or torch tensors keyed by input names, first dimension = sample
(not copied: the C++ dataset views their memory, so do not modify them while a Trainer holds
them), datasets.Dataset, or map-style torch datasets, with an optional data_collator (called per
batch, as Transformers' DataLoaders call it; evaluation outputs of different lengths are joined
padded with -100, as its nested_concat).
Custom ops: onyx.load_custom_ops("libmyops.so").
"""
from . import _onyx, diffusion
from .dpo import DPOConfig, DPOTrainer
from .grpo import GRPOConfig, GRPOTrainer
from .optimum import ORTTrainer, ORTTrainingArguments
from .seq2seq import Seq2SeqTrainer, Seq2SeqTrainingArguments
from .trainer import Trainer
from .trainer_callback import EarlyStoppingCallback, TrainerCallback, TrainerControl, TrainerState
from .trainer_utils import (BestRun, EvalPrediction, PredictionOutput, TrainOutput,
                            default_compute_objective, default_hp_space_optuna)
from .training_args import TrainingArguments

__all__ = [
    "TrainingArguments", "Trainer", "TrainerCallback", "TrainerControl", "TrainerState",
    "EarlyStoppingCallback", "EvalPrediction", "TrainOutput", "PredictionOutput",
    "ORTTrainer", "ORTTrainingArguments", "OnyxError", "set_num_threads", "load_custom_ops",
    "BestRun", "default_hp_space_optuna", "default_compute_objective", "DPOConfig", "DPOTrainer",
    "GRPOConfig", "GRPOTrainer", "Seq2SeqTrainer", "Seq2SeqTrainingArguments",
]
__version__ = "0.1.0"

OnyxError = _onyx.OnyxError  # a ValueError: every error of the C++ core, with its message
set_num_threads = _onyx.set_num_threads


def load_custom_ops(path):
    """Loads a custom-op library built against include/onyx/custom_op.h (as the CLI's
    --custom-ops and a config's custom_op_libraries do) before the Trainer that needs it is
    made; returns the ops it registered as dicts (domain, name, library, gradient)."""
    import os
    return _onyx.load_custom_ops(os.fspath(path))
