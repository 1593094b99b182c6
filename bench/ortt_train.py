"""ortt_train.py — the ONNX Runtime Training peer of train_bench.py (runs in build/venv-ortt).

ONNX Runtime Training 1.19.2 trains the very ONNX file onyx trains (train_bench.py's export, whose
only output is the scalar `loss`):

  artifacts MODEL.onnx OUT_DIR [--max-grad-norm 1.0] [--weight-decay 0] [--beta1 0.9]
        [--beta2 0.999] [--eps 1e-8] [--adam-mode 0]
      onnxruntime.training.artifacts.generate_artifacts with
        - loss=None: the graph's own output `loss` is the loss (a PassThrough block: no loss node is
          added, so the math is the exported F.cross_entropy, the same graph onyx differentiates);
        - requires_grad = every float initializer (the torch parameters; onyx trains the same set);
        - optimizer = onnxblock.optim.AdamW(betas, eps, weight_decay, clip_grad=ClipGradNorm(max))
          with one change: its AdamWOptimizer node gets adam_mode 0 (PyTorch's torch.optim.AdamW
          math: decay p *= 1 - lr*wd before the update, denominator sqrt(v)/sqrt(1-beta2^t) + eps)
          instead of the onnxblock default adam_mode 1 (Hugging Face's legacy AdamW: denominator
          sqrt(v) + eps, step size lr*sqrt(1-beta2^t)/(1-beta1^t), decay after the update), so its
          update is the one torch and onyx apply. Its single weight_decay applies to every
          parameter (one optimizer node over the whole parameter sequence: no parameter groups),
          which is why the benchmark runs all peers at weight decay 0.
        - gradient clipping: onnxblock.optim.ClipGradNorm (the InplaceClipGradNorm kernel: total L2
          norm over all gradients, scale by max_norm / (norm + 1e-6) when that is < 1), as
          torch.nn.utils.clip_grad_norm_ and onyx's max_grad_norm do. 0 = no clipping.
        - two fixes for this ORT and these exports, neither changing a value: the optional outputs
          ORT's gradient builders read (LayerNormalization's Mean and InvStdDev, which opset-17
          TorchScript exports leave off, and SoftmaxCrossEntropyLoss's log_prob) get names in the
          copy of the graph handed to generate_artifacts (without them it fails in
          GradientBuilderBase::O(): "i < node_->OutputDefs().size() was false"); and the optimizer
          model, which onnx 1.23 stamps IR version 14, gets the base model's IR version
          (onnxruntime 1.19 loads at most IR 10).
      Writes OUT_DIR/{training_model,eval_model,optimizer_model}.onnx, OUT_DIR/checkpoint and
      OUT_DIR/artifacts.json (parameter names, generation seconds, what was changed).

  train OUT_DIR --data train.safetensors --inputs a,b --batch B --steps N --threads T --lr LR
        --result R.json
      onnxruntime.training.api: CheckpointState.load_checkpoint, Module (CPU, SessionOptions
      intra_op_num_threads T, inter_op_num_threads 1), Optimizer (learning rate LR, constant).
      Step i (timed with perf_counter, as the torch peer): slice batch i (sequential), loss =
      module(*batch) (forward + backward, gradients accumulate into the checkpoint's buffers),
      optimizer.step() (clip + AdamW), module.lazy_reset_grad(), float(loss). R.json gets the
      per-step losses and seconds plus the session-creation seconds.

  grad OUT_DIR --data train.safetensors --inputs a,b --batch B --threads T --output G.safetensors
      One module(*batch 0) from the initial weights, then every trainable parameter's .grad
      (CheckpointState.parameters[name].grad: the gradient buffer the training graph wrote) and
      `loss`, saved as safetensors: what `onyx grad --loss loss` writes, for the gradient check.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "parity"))
import st_io  # noqa: E402


# ORT's gradient builders read optional outputs of some forward nodes (the saved statistics their
# gradient kernels take); the TorchScript exporter leaves them off. Naming them changes no value the
# graph computes: LayerNormalization's Mean and InvStdDev (opset >= 17 exports) and
# SoftmaxCrossEntropyLoss's log_prob.
_OPTIONAL_OUTPUTS = {"LayerNormalization": 3, "SoftmaxCrossEntropyLoss": 2}


def expose_optional_outputs(model):
    counts = {}
    for node in model.graph.node:
        want = _OPTIONAL_OUTPUTS.get(node.op_type)
        if want is None or node.domain not in ("", "ai.onnx"):
            continue
        while len(node.output) < want:
            node.output.append(f"{node.output[0]}__ortt_opt{len(node.output)}")
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        # an empty name means "not produced": name it too
        for j in range(1, len(node.output)):
            if not node.output[j]:
                node.output[j] = f"{node.output[0]}__ortt_opt{j}"
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def cmd_artifacts(a):
    import onnx
    from onnxruntime.training import artifacts, onnxblock
    t0 = time.perf_counter()
    model = onnx.load(a.model)
    exposed = expose_optional_outputs(model)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
              onnx.TensorProto.BFLOAT16)
    params = [t.name for t in model.graph.initializer if t.data_type in floats]
    clip = onnxblock.optim.ClipGradNorm(a.max_grad_norm) if a.max_grad_norm > 0 else None
    opt = onnxblock.optim.AdamW(bias_correction=True, betas=(a.beta1, a.beta2), eps=a.eps,
                                weight_decay=a.weight_decay, clip_grad=clip)
    os.makedirs(a.out, exist_ok=True)
    artifacts.generate_artifacts(model, requires_grad=params, frozen_params=[], loss=None,
                                 optimizer=opt, artifact_directory=a.out)
    # adam_mode 1 (Hugging Face) -> 0 (torch.optim.AdamW): see the module docstring.
    opath = os.path.join(a.out, "optimizer_model.onnx")
    om = onnx.load(opath)
    n_adam = 0
    for node in om.graph.node:
        if node.op_type == "AdamWOptimizer":
            for attr in node.attribute:
                if attr.name == "adam_mode":
                    attr.i = a.adam_mode
            n_adam += 1
    if n_adam != 1:
        sys.exit(f"expected one AdamWOptimizer node in {opath}, found {n_adam}")
    # onnx 1.23 stamps the empty-base optimizer model with its own IR version (14), which
    # onnxruntime 1.19 refuses (max 10): give it the base model's, as the training model has.
    om.ir_version = min(om.ir_version, model.ir_version, 10)
    onnx.save(om, opath)
    info = {"params": params, "exposed_outputs": exposed, "generate_s": time.perf_counter() - t0,
            "adam_mode": a.adam_mode,
            "max_grad_norm": a.max_grad_norm, "weight_decay": a.weight_decay,
            "clip_node": any(n.op_type == "InplaceClipGradNorm" for n in om.graph.node)}
    with open(os.path.join(a.out, "artifacts.json"), "w") as f:
        json.dump(info, f)
    print(json.dumps({k: v for k, v in info.items() if k != "params"}))


def open_session(a):
    import onnxruntime as ort
    from onnxruntime.training import api
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    state = api.CheckpointState.load_checkpoint(os.path.join(a.dir, "checkpoint"))
    module = api.Module(os.path.join(a.dir, "training_model.onnx"), state,
                        os.path.join(a.dir, "eval_model.onnx"), device="cpu", session_options=so)
    module.train()
    return state, module


def batches(a, module):
    data = st_io.load(a.data)
    names = list(module.input_names())
    want = [n.strip() for n in a.inputs.split(",") if n.strip()]
    if sorted(names) != sorted(want):
        sys.exit(f"training model inputs {names} differ from the dataset inputs {want}")
    b = a.batch

    def get(i):
        return [np.ascontiguousarray(data[n][i * b:(i + 1) * b]) for n in names]
    return data, get


def cmd_train(a):
    import onnxruntime as ort
    from onnxruntime.training import api
    t0 = time.perf_counter()
    state, module = open_session(a)
    optimizer = api.Optimizer(os.path.join(a.dir, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(a.lr)
    data, get = batches(a, module)
    setup_s = time.perf_counter() - t0
    n = len(next(iter(data.values())))
    if a.steps * a.batch > n:
        sys.exit(f"{a.steps} steps of batch {a.batch} need {a.steps * a.batch} samples, have {n}")
    times, losses = [], []
    module.lazy_reset_grad()
    for i in range(a.steps):
        t = time.perf_counter()
        loss = module(*get(i))
        optimizer.step()
        module.lazy_reset_grad()
        lv = float(np.asarray(loss).reshape(()))
        times.append(time.perf_counter() - t)
        losses.append(lv)
    with open(a.result, "w") as f:
        json.dump({"times": times, "losses": losses, "setup_s": setup_s, "ort": ort.__version__,
                   "threads": a.threads, "lr": optimizer.get_learning_rate()}, f)


def cmd_grad(a):
    state, module = open_session(a)
    _, get = batches(a, module)
    module.lazy_reset_grad()
    loss = module(*get(0))
    with open(os.path.join(a.dir, "artifacts.json")) as f:
        names = json.load(f)["params"]
    out = {"loss": np.asarray(loss, np.float32).reshape(())}
    for name in names:
        out[name] = np.array(state.parameters[name].grad, copy=True)
    st_io.save(a.output, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("artifacts")
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--adam-mode", type=int, default=0, choices=(0, 1))
    for name in ("train", "grad"):
        p = sub.add_parser(name)
        p.add_argument("dir")
        p.add_argument("--data", required=True)
        p.add_argument("--inputs", required=True)
        p.add_argument("--batch", type=int, required=True)
        p.add_argument("--threads", type=int, default=1)
        if name == "train":
            p.add_argument("--steps", type=int, required=True)
            p.add_argument("--lr", type=float, required=True)
            p.add_argument("--result", required=True)
        else:
            p.add_argument("--output", required=True)
    a = ap.parse_args()
    import onnxruntime as ort
    ort.set_default_logger_severity(3)  # errors only: no per-pass info or unused-initializer warnings
    return {"artifacts": cmd_artifacts, "train": cmd_train, "grad": cmd_grad}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
