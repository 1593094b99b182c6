"""exporters.py — the two ONNX exporters of PyTorch 2.x, as the parity tests and benchmarks use them.

  "ts"      torch.onnx.export(..., dynamo=False): the TorchScript-based exporter (opset 14 / 17
            here), TrainingMode.TRAINING when asked, do_constant_folding as given.
  "dynamo"  torch.onnx.export(..., dynamo=True): torch.export + onnxscript at the exporter's
            default opset (20 in torch 2.13); the dynamic axes are handed over as `dynamic_axes`
            (the exporter turns them into torch.export Dims). The module is exported in the mode
            it is in (train() / eval()). An inference export keeps the exporter's default
            optimize=True; a training export (training=True) passes optimize=False, because that
            optimizer rewrites parameters: it folds W^T of every Linear into a new initializer
            named val_N (the parameter's name is gone) and merges initializers of equal value
            (all LayerNorm weights start at 1, so every LayerNorm ends up sharing the first one's
            weight and bias: a different model to train). onyx's own passes do the cleanup that
            optimizer would have done.

VARIANTS lists (label, exporter, opset, constant folding) for tests that run every variant.
"""
import contextlib
import io
import logging
import warnings

import torch

# (label, exporter, opset or None for the exporter's default, do_constant_folding)
VARIANTS = [("opset14", "ts", 14, True), ("opset17", "ts", 17, False), ("dynamo", "dynamo", None, True)]


def export(model, args, path, *, exporter="ts", opset=None, input_names=None, output_names=None,
           dynamic_axes=None, training=False, fold=True):
    """Writes model (called with the tuple args) to path with the chosen exporter."""
    if exporter == "ts":
        torch.onnx.export(model, args, path, dynamo=False, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes,
                          opset_version=opset or 17, do_constant_folding=fold,
                          training=torch.onnx.TrainingMode.TRAINING if training
                          else torch.onnx.TrainingMode.EVAL)
        return
    if exporter != "dynamo":
        raise ValueError(f"unknown exporter {exporter!r}")
    kw = {}
    if opset is not None:
        kw["opset_version"] = opset
    # The dynamo exporter prints progress lines and warnings about torchvision ops; keep the
    # test's output to its own lines (an export error still raises with its message).
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, path, dynamo=True, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes,
                          external_data=False, optimize=not training, **kw)
