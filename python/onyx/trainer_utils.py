"""onyx.trainer_utils — what the Trainer returns and hands to user code, with Transformers' names:
EvalPrediction, TrainOutput, PredictionOutput, BestRun; the default hyperparameter space and
objective; the newest checkpoint of a folder."""
import os
from collections import namedtuple

TrainOutput = namedtuple("TrainOutput", ["global_step", "training_loss", "metrics"])
PredictionOutput = namedtuple("PredictionOutput", ["predictions", "label_ids", "metrics"])
BestRun = namedtuple("BestRun", ["run_id", "objective", "hyperparameters", "run_summary"])


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


def _last_checkpoint(folder):
    import re
    steps = [int(m.group(1)) for n in (os.listdir(folder) if os.path.isdir(folder) else [])
             if (m := re.fullmatch(r"checkpoint-(\d+)", n))]
    if not steps:
        raise ValueError(f"resume_from_checkpoint=True: no checkpoint-N folder in '{folder}'")
    return os.path.join(folder, f"checkpoint-{max(steps)}")
