"""onyx.hyperparameter_search — Transformers' Trainer.hyperparameter_search with the Optuna
backend: trials from model_init, each evaluation's objective reported to Optuna (pruning), BestRun."""
import copy
import dataclasses
import inspect
import os
import warnings

from .trainer_callback import TrainerCallback
from .trainer_utils import BestRun, default_compute_objective, default_hp_space_optuna
from .training_args import _KEYS


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


def run_optuna(trainer, hp_space, compute_objective, n_trials, direction, backend, hp_name,
               kwargs):
    """Trainer.hyperparameter_search's work (its docstring says what it does)."""
    if backend not in (None, "optuna"):
        raise NotImplementedError(f"backend={backend!r}: onyx implements the optuna backend")
    if trainer.model_init is None:
        raise RuntimeError("To use hyperparameter search, you need to pass your model through a "
                           "model_init function.")
    import optuna

    from .trainer import _is_torch_module  # (trainer.py imports this module)
    hp_space = hp_space or default_hp_space_optuna
    compute_objective = compute_objective or default_compute_objective
    init_takes_trial = len(inspect.signature(trainer.model_init).parameters) >= 1
    optimize_kw = {k: kwargs.pop(k) for k in ("timeout", "n_jobs", "gc_after_trial", "callbacks",
                                              "catch") if k in kwargs}
    base = trainer.args

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
        sub = copy.copy(trainer)
        if init_takes_trial:
            model = trainer.model_init(trial)
            sub._module, sub._tmp = None, None
            if _is_torch_module(model):
                sub._module = model
                sub.model = sub._from_module(model)
            else:
                sub.model = os.fspath(model)
        reporter = _OptunaReport(trial, compute_objective)
        sub.callbacks = list(trainer.callbacks) + [reporter]
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
