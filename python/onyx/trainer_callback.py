"""onyx.trainer_callback — Transformers' TrainerCallback events, EarlyStoppingCallback (run by the
C++ callback `onyx train` uses), and what Transformers' _save_checkpoint adds to each checkpoint."""
import os

from . import _onyx
from .training_args import _save_training_args

TrainerControl = _onyx.TrainerControl
TrainerState = _onyx.TrainerState


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


class _SaveAsTransformers(TrainerCallback):
    """Transformers' _save_checkpoint saves the processing_class and training_args.bin into each
    checkpoint-N folder."""

    def __init__(self, processing_class):
        self.processing_class = processing_class

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not state.is_world_process_zero or not os.path.isdir(folder):
            return  # (under mpirun rank 0 writes the checkpoint, as Transformers)
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
