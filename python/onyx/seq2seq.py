"""onyx.seq2seq — Transformers' Seq2SeqTrainer and Seq2SeqTrainingArguments for encoder–decoders
(Whisper, BART): onyx's Trainer, whose predict_with_generate generates from each eval sample's
encoder inputs (generation_max_length, generation_max_new_tokens, generation_num_beams) and hands
compute_metrics the generated ids as Seq2SeqTrainer does; evaluate() and predict() take its
generation kwargs (max_length, max_new_tokens, num_beams)."""
from .trainer import Trainer, _is_torch_module
from .training_args import _ArgsBase, _make_args_class

Seq2SeqTrainingArguments = _make_args_class(
    "Seq2SeqTrainingArguments",
    "Transformers' Seq2SeqTrainingArguments: onyx's TrainingArguments, whose predict_with_generate, "
    "generation_max_length, generation_max_new_tokens and generation_num_beams it uses.")

_GEN_KWARGS = ("max_length", "max_new_tokens", "num_beams")


def _generation_config(value):
    """Seq2SeqTrainingArguments.generation_config as a transformers.GenerationConfig (a folder or
    a file of one, or the object), as Seq2SeqTrainer.load_generation_config reads it."""
    import os
    import transformers
    if isinstance(value, transformers.GenerationConfig):
        return value
    path = os.fspath(value)
    if os.path.isfile(path):
        return transformers.GenerationConfig.from_pretrained(os.path.dirname(path) or ".",
                                                             os.path.basename(path))
    return transformers.GenerationConfig.from_pretrained(path)


class Seq2SeqTrainer(Trainer):
    """Transformers' Seq2SeqTrainer on onyx (same parameters as Trainer). A
    transformers.Seq2SeqTrainingArguments' generation_config becomes the model's generation
    config, as there (a model given as a torch module)."""

    def __init__(self, model=None, args=None, *rest, **kwargs):
        gen = getattr(args, "generation_config", None) if not isinstance(args, _ArgsBase) else None
        if gen is not None:
            if not _is_torch_module(model):
                raise NotImplementedError("Seq2SeqTrainingArguments.generation_config with a model "
                                          "folder: put it in the folder as generation_config.json")
            model.generation_config = _generation_config(gen)
        super().__init__(model, args, *rest, **kwargs)

    def _generation_kwargs(self, gen_kwargs):
        """The call's generation kwargs, the arguments' generation_* where it gives none (as
        Seq2SeqTrainer.evaluate / predict fill them), set for this evaluation."""
        unknown = sorted(set(gen_kwargs) - set(_GEN_KWARGS))
        if unknown:
            raise NotImplementedError("generation kwargs " + ", ".join(unknown) + ": onyx's "
                                      "predict_with_generate takes " + ", ".join(_GEN_KWARGS))
        a = self.args
        length = gen_kwargs.get("max_length")
        new = gen_kwargs.get("max_new_tokens")
        if length is None and new is None:
            length, new = a.generation_max_length, a.generation_max_new_tokens
        beams = gen_kwargs.get("num_beams", a.generation_num_beams)
        self._t.set_generation_kwargs(length, new, beams)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval",
                 **gen_kwargs):
        self._generation_kwargs(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test", **gen_kwargs):
        self._generation_kwargs(gen_kwargs)
        return super().predict(test_dataset, ignore_keys, metric_key_prefix)
